"""A decode step's repeated calls (torch 2.14.1 venv, with transformers): the captured
structure of a StaticCache argument is checked by a walk over the captured TreeSpec
(no TreeSpec built per call) and the alias verdict is kept between calls; every change
a caller can make to the cache between calls is still caught or served as before.
Pairs of the eager engine keep these tests cheap (the driver is the frozen engine's;
its alias check, frozen-only, is switched on where a test needs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs transformers (scripts/test.sh installs it)")

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "packages" / "modelzoo"))
import modelzoo  # noqa: E402


@pytest.fixture(autouse=True)
def _no_grad():
    """Each call as a decode loop makes it (generate runs under no_grad): the step was
    captured under no_grad, and a call with grad on and parameters requiring grad is refused."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    """(loaded step, its namespace, model); ``ns["generic"]`` counts the calls that
    took tree_flatten."""
    tmp = tmp_path_factory.mktemp("decode")
    model = modelzoo.build_llama()
    src, cache = tmp / "t.py", tmp / "t.cache"
    with (
        torch.no_grad(),
        precompile_build.capture(
            modelzoo.lm_step, artifact_path=src, cache_path=cache, target="t", engine="eager"
        ) as f,
    ):
        f(model, torch.tensor([[1]]), modelzoo.static_cache(model, "cpu"), torch.tensor([0]))
    step = load_pair(src, cache)
    ns = step.__call__.__globals__
    generic = ns["_generic_leaves"]
    ns["generic"] = 0

    def counting(*a):
        ns["generic"] += 1
        return generic(*a)

    ns["_generic_leaves"] = counting
    return step, ns, model


def _eager(model, cache, token, pos):
    with torch.no_grad():
        return modelzoo.lm_step(model, torch.tensor([[token]]), cache, torch.tensor([pos]))


def test_repeated_calls_and_other_caches_take_the_walk(decode):
    step, ns, model = decode
    ns["generic"] = 0
    caches = [modelzoo.static_cache(model, "cpu") for _ in range(2)]
    want = modelzoo.static_cache(model, "cpu")
    for pos in range(4):
        for c in caches:  # two requests interleaved: two cache objects
            out = step(model, torch.tensor([[pos + 3]]), c, torch.tensor([pos]))
        torch.testing.assert_close(out, _eager(model, want, pos + 3, pos))
    assert ns["generic"] == 0 and ns["_PLAN"][0] is not None
    for c in caches:
        torch.testing.assert_close(c.layers[1].keys, want.layers[1].keys)
        assert int(c.layers[0].cumulative_length) == 4


def test_a_swapped_cache_tensor_is_the_one_written(decode):
    step, _, model = decode
    cache = modelzoo.static_cache(model, "cpu")
    step(model, torch.tensor([[3]]), cache, torch.tensor([0]))
    old = cache.layers[1].keys
    cache.layers[1].keys = torch.zeros_like(old)  # same shape: served, written in place
    step(model, torch.tensor([[4]]), cache, torch.tensor([1]))
    assert (
        cache.layers[1].keys[:, :, 1].abs().sum() > 0
        and cache.layers[1].keys[:, :, 0].abs().sum() == 0
    )
    assert old[:, :, 1].abs().sum() == 0  # the replaced tensor is not written


def _changes(model):
    """(change to a fresh, once-served cache, the message it gets): each a way a
    caller can alter a cache between two calls."""

    def tensor(shape_change):
        def change(c):
            k = c.layers[0].keys
            c.layers[0].keys = torch.zeros(*shape_change(list(k.shape)))

        return change

    def setattr_(obj, name, value):
        return lambda c: setattr(obj(c), name, value)

    return [
        (
            tensor(lambda s: [s[0], s[1], s[2] - 1, s[3]]),
            r"argument 'cache'.layers\[0\].keys: shape \[1, 2, 47, 8\]",
        ),
        (
            lambda c: c.layers[1].values.resize_(1, 2, 10, 8),
            r"argument 'cache'.layers\[1\].values: shape",
        ),
        (
            setattr_(lambda c: c.layers[0], "keys", torch.zeros(1, 2, 48, 8, dtype=torch.float16)),
            r"argument 'cache'.layers\[0\].keys: dtype torch.float16",
        ),
        (
            setattr_(lambda c: c.layers[0], "max_cache_len", 10),
            r"argument 'cache'.layers\[0\]: a StaticLayer with max_cache_len 10 \(captured 48\)",
        ),
        (
            setattr_(lambda c: c.layers[1], "is_initialized", False),
            r"an argument is a StaticLayer that is not initialized",
        ),
        (
            setattr_(lambda c: c.layers[0], "extra", 1),
            r"argument 'cache'.layers\[0\]: a StaticLayer with extra 1",
        ),
        (
            setattr_(lambda c: c.layers[0], "cumulative_length", 0),
            r"argument 'cache'.layers\[0\]: ",
        ),
        (
            lambda c: setattr(c, "layers", tuple(c.layers)),
            r"argument 'cache'.layers: expected a list",
        ),
        (
            lambda c: c.layers.append(c.layers[0]),
            r"argument 'cache'.layers: expected a list of 2 item\(s\), got a list of 3",
        ),
    ]


def test_changes_to_a_cache_between_calls_are_caught(decode):
    step, _, model = decode
    for change, message in _changes(model):
        cache = modelzoo.static_cache(model, "cpu")
        step(model, torch.tensor([[3]]), cache, torch.tensor([0]))
        change(cache)
        with pytest.raises(CallError, match=message):
            step(model, torch.tensor([[4]]), cache, torch.tensor([1]))
    cache = modelzoo.static_cache(model, "cpu")  # and the next good call is served
    torch.testing.assert_close(
        step(model, torch.tensor([[3]]), cache, torch.tensor([0])),
        _eager(model, modelzoo.static_cache(model, "cpu"), 3, 0),
    )


def test_an_alias_made_between_calls_is_caught(decode):
    """The alias verdict is kept only while the inputs' storages are the last passing
    call's: two cache layers made to share a tensor, or a position that is a view of
    the cache's own counter, are refused on the call after a passing one."""
    step, ns, model = decode
    ns["_CHECK_ALIASES"] = True  # the frozen engine's check
    try:
        cache = modelzoo.static_cache(model, "cpu")
        step(model, torch.tensor([[3]]), cache, torch.tensor([0]))
        step(model, torch.tensor([[4]]), cache, torch.tensor([1]))
        keys = cache.layers[1].keys
        cache.layers[1].keys = cache.layers[0].keys
        with pytest.raises(
            CallError,
            match=r"argument 'cache'.layers\[(0|1)\].keys shares memory with "
            r"argument 'cache'.layers\[(0|1)\].keys.*\.clone\(\)",
        ):
            step(model, torch.tensor([[5]]), cache, torch.tensor([2]))
        cache.layers[1].keys = keys
        step(model, torch.tensor([[5]]), cache, torch.tensor([2]))
        with pytest.raises(
            CallError, match=r"layers\[0\].cumulative_length shares memory with argument 'pos'"
        ):
            step(model, torch.tensor([[6]]), cache, cache.layers[0].cumulative_length.view(1))
        step(model, torch.tensor([[6]]), cache, torch.tensor([3]))
    finally:
        ns["_CHECK_ALIASES"] = False


def test_the_alias_verdict_holds_for_new_tokens_and_each_cache(decode):
    """A decode loop passes a new token and position tensor on every call: the full
    alias check runs at most once per cache (two requests interleaved), not per call; a
    position that is a view of a cache's counter is still refused after it."""
    step, ns, model = decode
    full = ns["_full_alias_check"]
    calls = []

    def counting(*a):
        calls.append(1)
        return full(*a)

    ns["_CHECK_ALIASES"], ns["_full_alias_check"] = True, counting
    try:
        caches = [modelzoo.static_cache(model, "cpu") for _ in range(2)]
        for pos in range(4):
            for c in caches:
                step(model, torch.tensor([[pos + 3]]), c, torch.tensor([pos]))
        assert (
            len(calls) <= 2
        )  # (fewer: a cache at the addresses of one checked before keeps its verdict)
        with pytest.raises(
            CallError, match=r"layers\[1\].cumulative_length shares memory with argument 'pos'"
        ):
            step(
                model, torch.tensor([[7]]), caches[0], caches[0].layers[1].cumulative_length.view(1)
            )
    finally:
        ns["_CHECK_ALIASES"], ns["_full_alias_check"] = False, full
