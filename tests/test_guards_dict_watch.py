"""Between full checks, a served call learns that no covering dict was written from one
tick (Python 3.12+: CPython's dict watchers, templates/dict_watch.py)
or from each dict's version (Python 3.11, or where the interpreter gives no watcher).
Either way a write made after a served call is noticed; these tests run on both (the
GPU host's Python is 3.12, this host's 3.11)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from test_guards import Net, _serve, call

from precompile_runtime.errors import CallError

WATCHERS = sys.version_info >= (3, 12) and sys.implementation.name == "cpython"


def test_a_fast_call_reads_one_tick_or_each_covering_dicts_version(tmp_path):
    """Python 3.12+: a call between full checks reads one dict's version (the tick's),
    however many dicts cover the checks; before 3.12 it reads each one's. A write to a
    covered dict after a served call (past ``__setattr__``) is noticed either way."""
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    ns = f.__call__.__globals__
    (seen,) = [s for k, s in ns["_G_SEEN"].items() if k == id(m)]
    assert seen[5] is WATCHERS and len(ns["_G_TICK"]) == int(WATCHERS)
    roots = ns["_G_ROOTS"][0]
    covered = {id(d) for d in ns["_guards_dicts"](roots, m, x)}
    assert seen[1] == [] if WATCHERS else {id(d) for d, _v in seen[1]} == covered
    assert len(covered) > 10
    read = []
    version = ns["_DICT_VERSION"]
    ns["_DICT_VERSION"] = lambda d: read.append(id(d)) or version(d)
    try:
        torch.testing.assert_close(f(m, x), m(x))
    finally:
        ns["_DICT_VERSION"] = version
    assert len(set(read) & covered) == (0 if WATCHERS else len(covered)), len(read)
    saved = m.cfg.__dict__["temp"]
    m.cfg.__dict__["temp"] = 2.0
    try:
        with pytest.raises(CallError, match="temp"):
            f(m, x)
    finally:
        m.cfg.__dict__["temp"] = saved
    torch.testing.assert_close(f(m, x), m(x))


_CHILD = textwrap.dedent(
    """
    import ctypes, pathlib, sys
    sys.path.insert(0, {tests!r})
    import torch
    import test_guards as T
    from precompile_runtime.errors import CallError

    if {mode!r} == "print-replaced":  # as distributed scripts silence the other ranks
        import builtins
        builtins.print = lambda *args, **kwargs: None
    taken = 0
    if {mode!r} == "no-watcher-id-left" and sys.version_info >= (3, 12):  # every watcher id given out before the pair loads
        keep = []
        while True:
            cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, *[ctypes.c_void_p] * 3)(lambda *a: 0)
            try:
                ctypes.PYFUNCTYPE(ctypes.c_int, type(cb))(("PyDict_AddWatcher", ctypes.pythonapi))(cb)
            except (RuntimeError, ValueError):  # (3.12: RuntimeError, "no more dict watcher IDs")
                break
            keep.append(cb)
            taken += 1
    m, x = T.Net().eval(), torch.randn(2, 4)
    f = T._serve(pathlib.Path({tmp!r}), T.call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    ns = f.__call__.__globals__
    (seen,) = ns["_G_SEEN"].values()
    sys.stdout.write(f"WATCHED {{seen[5]}} TAKEN {{taken}}\\n")
    T.GAIN = 3.0  # a module global the helper reads, written after a served call
    try:
        f(m, x)
    except CallError as e:
        assert "GAIN" in str(e), e
        sys.stdout.write("NOTICED\\n")
    # the process ends with watched dicts alive: the teardown clears them after the
    # watcher is gone (atexit), and nothing is printed about it
    """
)


@pytest.mark.parametrize("mode", ["watcher", "no-watcher-id-left", "print-replaced"])
def test_a_fresh_process_notices_a_write_and_exits_cleanly(tmp_path, mode):
    """In a fresh process, a global written after a served call is noticed, with the dict
    watcher or, where it cannot be had, with the versions: every watcher id already given
    out, or ``builtins.print`` replaced by a Python function (the watcher's callback must
    run no Python frame). The process then exits with its watched dicts alive and says
    nothing on stderr."""
    script = _CHILD.format(tests=str(Path(__file__).parent), tmp=str(tmp_path), mode=mode)
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "NOTICED" in out.stdout, out.stdout + out.stderr
    assert f"WATCHED {WATCHERS and mode == 'watcher'}" in out.stdout, out.stdout
    if mode == "no-watcher-id-left" and WATCHERS:
        assert "TAKEN 0" not in out.stdout
    assert "Exception ignored" not in out.stderr and "Fatal" not in out.stderr, out.stderr


needs_watchers = pytest.mark.skipif(
    not WATCHERS, reason="dict watchers: Python 3.12+ (the GPU host's); 3.11 documents the gap"
)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.lin(x)))


def _writes():
    """(what, a write past ``__setattr__`` on a served model, whether the call then
    raises: else it is served equal to eager on the new state)."""
    return [
        ("training in __dict__", lambda m: m.drop.__dict__.__setitem__("training", True), True),
        (
            "training by object.__setattr__",
            lambda m: object.__setattr__(m.bn, "training", True),
            True,
        ),
        (
            "a parameter in _parameters",
            lambda m: m.lin._parameters.__setitem__(
                "weight", torch.nn.Parameter(torch.randn(4, 4))
            ),
            False,
        ),
        (
            "a buffer in _buffers",
            lambda m: m.bn._buffers.__setitem__("running_mean", torch.randn(4)),
            False,
        ),
    ]


@needs_watchers
@pytest.mark.parametrize("what, write, raises", _writes(), ids=[w[0] for w in _writes()])
def test_a_models_dict_written_past_setattr_after_a_served_call_is_noticed(
    tmp_path, what, write, raises
):
    """Python 3.12+: each model's ``__dict__`` and registries are watched from its full
    check, so a write past ``__setattr__`` after a served call (which no registration
    hook or wrapper sees) is noticed: a train/eval change raises, a parameter or buffer
    replaced in its registry is served, equal to eager."""
    torch.manual_seed(0)
    m, x = _Block().eval(), torch.randn(3, 4)
    f = _serve(tmp_path, call, m, x)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
        write(m)
        if raises:
            with pytest.raises(CallError, match="train"):
                f(m, x)
        else:
            torch.testing.assert_close(f(m, x), m(x))


class _Plain:
    def __init__(self):
        self.temp = 0.5


class _Tables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.table = types.MappingProxyType({"x": 1.0})  # a read-only view of a dict
        self.pcfg = _Plain()
        self.mode = 1
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        y = self.lin(x) * self.table["x"] * self.pcfg.temp
        if self.mode == 2:
            y = y + 1
        return self.drop(y)


def test_a_mapping_proxy_held_by_a_module_is_checked_by_its_own_contents(tmp_path):
    """A ``MappingProxyType`` an object holds is no class's ``__dict__``: the dict behind
    it, written through its owner's handle after a served call, is noticed (no class
    dict stands for it)."""
    torch.manual_seed(0)
    m, x = _Tables().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
        (behind,) = [d for d in gc.get_referents(m.table) if type(d) is dict]
        behind["x"] = 3.0
        with pytest.raises(CallError, match="table"):
            f(m, x)


def test_a_modules_dict_assigned_whole_after_a_served_call_is_noticed(tmp_path):
    """``m.__dict__ = d`` through ``nn.Module.__setattr__`` moves the state epoch (on every
    Python: the assignment writes no dict)."""
    torch.manual_seed(0)
    m, x = _Tables().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
        m.__dict__ = dict(m.__dict__, mode=2)
        with pytest.raises(CallError, match="mode"):
            f(m, x)


def _replacements():
    """(what, the whole ``__dict__`` of an object the call reads replaced, what the
    error names)."""
    return [
        ("model", lambda m: object.__setattr__(m, "__dict__", dict(m.__dict__, mode=2)), "mode"),
        (
            "submodule",
            lambda m: object.__setattr__(m.drop, "__dict__", dict(m.drop.__dict__, training=True)),
            "train",
        ),
        ("plain config", lambda m: setattr(m.pcfg, "__dict__", {"temp": 0.9}), "temp"),
    ]


@needs_watchers
@pytest.mark.parametrize(
    "what, replace, named", _replacements(), ids=[r[0] for r in _replacements()]
)
def test_a_dict_replaced_whole_after_a_served_call_is_noticed(tmp_path, what, replace, named):
    """Python 3.12+: an object's whole ``__dict__`` replaced (which writes no dict) frees
    the watched one, which the watcher announces: the next call checks in full."""
    torch.manual_seed(0)
    m, x = _Tables().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
        replace(m)
        with pytest.raises(CallError, match=named):
            f(m, x)


_AT_EXIT = textwrap.dedent(
    """
    import atexit, pathlib, sys
    sys.path.insert(0, {tests!r})
    import torch
    import test_guards as T
    from precompile_runtime.errors import CallError
    state = {{}}

    def last_call():  # registered before the pair loads: runs after any handler it adds
        f, m, x = state["f"], state["m"], state["x"]
        m.cfg.temp = 0.9
        try:
            f(m, x)
        except CallError as e:
            assert "temp" in str(e), e
            sys.stdout.write("NOTICED\\n")

    atexit.register(last_call)
    m, x = T.Net().eval(), torch.randn(2, 4)
    f = T._serve(pathlib.Path({tmp!r}), T.call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    state.update(f=f, m=m, x=x)
    """
)


def test_a_write_made_while_the_process_exits_is_noticed(tmp_path):
    """A call from an atexit handler registered before the pair loaded (it runs after
    every handler registered since) notices a write made there."""
    script = _AT_EXIT.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "NOTICED" in out.stdout, out.stdout + out.stderr


def test_a_first_call_interrupted_while_it_sets_up_leaves_the_next_call_whole(tmp_path):
    """A KeyboardInterrupt while the first call sets the guards up (resolving roots,
    installing the hooks and the watcher) leaves nothing half set: the next call sets
    up again, serves, and notices a later write."""
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)  # (loaded, not called yet)
    ns = f.__call__.__globals__
    real, calls = ns["_state_epoch"], []

    def interrupted():  # the guards' setup's first call is interrupted
        if sys._getframe(1).f_code.co_name == "_check_guards" and not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real()

    ns["_state_epoch"] = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            f(m, x)
        assert ns["_G_ROOTS"] == []
    finally:
        ns["_state_epoch"] = real
    torch.testing.assert_close(f(m, x), m(x))
    assert len(ns["_G_EPOCH"]) == 1 and len(ns["_G_ROOTS"]) == 1
    assert len(ns["_G_TICK"]) == int(WATCHERS)
    saved = m.cfg.__dict__["temp"]
    m.cfg.__dict__["temp"] = 2.0
    try:
        with pytest.raises(CallError, match="temp"):
            f(m, x)
    finally:
        m.cfg.__dict__["temp"] = saved
