"""The kept alias verdict (templates/call_args.py): a call whose inputs are those of the
last passing call skips the full check, and anything that can make an input written
to share memory with another input or a parameter ends the verdict."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402
from precompile_runtime import CallError  # noqa: E402


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 2.0), requires_grad=False)

    def forward(self, y):
        y.add_(1)  # the captured function writes its input
        return y * self.w


def step(m, y):
    return m(y)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    with (
        torch.no_grad(),
        precompile_build.capture(
            step, engine="frozen", artifact_path=d / "t.py", cache_path=d / "t.cache"
        ) as f,
    ):
        f(Scale(), torch.zeros(4))
    return load_pair(d / "t.py", d / "t.cache")


@pytest.mark.parametrize("how", ["data", "set_"])
def test_a_parameter_moved_onto_the_written_input_between_calls_is_refused(served, how):
    m, y = Scale(), torch.zeros(4)
    for _ in range(2):  # passing calls: the verdict is kept
        with torch.no_grad():
            served(m, y)
    with torch.no_grad():
        if how == "data":
            m.w.data = y  # the same Parameter object, now y's memory
        else:
            m.w.set_(y)
    with pytest.raises(CallError, match=r"argument 'y' shares memory with parameter/buffer \S*w\b"):
        with torch.no_grad():
            served(m, y)


def test_the_same_inputs_again_are_served(served):
    m, y = Scale(), torch.zeros(4)
    with torch.no_grad():
        for _ in range(3):
            out = served(m, y)
    torch.testing.assert_close(y, torch.full((4,), 3.0))
    torch.testing.assert_close(out, torch.full((4,), 6.0))


def _write_first(cache, x):
    cache.add_(1.0)  # the captured function writes its first input
    return x * 2


def test_a_written_input_at_the_same_address_in_another_storage_is_checked_again(tmp_path):
    """The kept verdict holds for the written input's address *and* storage offset: a
    cache at the last call's address that is now a view into another tensor's storage
    (here the same bytes seen through numpy, as a pool's reused block can be) gets the
    full check, which refuses the input that shares that storage."""
    with (
        torch.no_grad(),
        precompile_build.capture(
            _write_first,
            engine="frozen",
            artifact_path=tmp_path / "t.py",
            cache_path=tmp_path / "t.cache",
        ) as f,
    ):
        f(torch.zeros(4), torch.ones(4))
    served = load_pair(tmp_path / "t.py", tmp_path / "t.cache")
    big = torch.zeros(8)
    with pytest.raises(CallError, match=r"shares memory"):
        served(big[4:], big[4:])
    alone = torch.from_numpy(big.numpy()[4:])  # big's bytes 16.., a storage of its own
    served(alone, torch.ones(4))  # passes: its verdict is kept
    assert (
        big[4:].data_ptr() == alone.data_ptr()
        and big[4:].storage_offset() != alone.storage_offset()
    )
    with pytest.raises(
        CallError,
        match=r"argument 'x' shares memory with argument 'cache'"
        r"|argument 'cache' shares memory with argument 'x'",
    ):
        served(big[4:], big[4:])
    torch.testing.assert_close(
        big, torch.tensor([0.0, 0, 0, 0, 1, 1, 1, 1])
    )  # the passing call only
