# ---- dict watchers: a write to a watched dict moves the state epoch ----------------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py). Needs torch and the stdlib.
# Python 3.12+ has CPython's dict watchers (PyDict_AddWatcher, PyDict_Watch). A full check
# watches the dicts its verdict rests on (the guards' covering dicts, each model's
# `__dict__` and parameter, buffer and submodule registries), and any later write to one
# (`obj.__dict__[k] = v`, `m._parameters[name] = p` too) moves a tick that a call reads
# in place of every dict's version (bench/results/driver_overhead_guards_cpu.md). The
# callback is C only (print, into an object whose write stores into the tick dict): no
# Python frame runs inside the write, so no other thread can run, or check the state,
# between the tick and the write it announces.
import sys as _sys

import torch


def dict_watcher():
    """``(tick, watch)``: ``tick()`` is a number that grows at every write to a dict
    passed to ``watch(d)`` earlier (an item set or deleted, ``clear``, ``update``, the
    dict freed), in this process, for good; ``watch`` raises where the interpreter will
    not watch ``d``. One watcher for every pair (kept on torch.nn.modules.module). None
    where the interpreter has no dict watchers (before Python 3.12, another
    implementation than CPython, a free-threaded build) or has given out all 8 of their
    ids: the dicts' versions are then compared per call."""
    M = torch.nn.modules.module
    installed = getattr(M, "_precompile_dict_watch", None)
    if installed is not None:
        return installed
    version = getattr(
        getattr(getattr(torch._C, "_dynamo", None), "guards", None), "dict_version", None
    )
    if (
        _sys.version_info < (3, 12)
        or _sys.implementation.name != "cpython"
        or not getattr(_sys, "_is_gil_enabled", lambda: True)()  # (free-threaded: no such order)
        or version is None
    ):
        return None
    import builtins
    import ctypes
    import functools
    import types

    # the C print and partial (a process that replaced builtins.print, as distributed
    # training scripts do to silence other ranks, would run a Python frame, or nothing)
    out = builtins.print
    if not (
        isinstance(out, types.BuiltinFunctionType)
        and out.__self__ is builtins
        and isinstance(functools.partial.__call__, types.WrapperDescriptorType)
    ):
        return None
    tick: dict = {}
    before = version(tick)
    tick["w"] = ""
    if version(tick) == before:  # (an interpreter whose versions do not move on a write)
        return None
    # print(event, dict, key, value) writes their texts, each a store into `tick`; it
    # returns None, which the callback's C bool result turns into 0: "no error"
    sink = types.SimpleNamespace(write=functools.partial(tick.__setitem__, "w"))
    arg = ctypes.c_void_p
    callback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_int, arg, arg, arg)(
        functools.partial(out, file=sink, sep="", end="")
    )
    api = ctypes.pythonapi
    try:
        wid = ctypes.PYFUNCTYPE(ctypes.c_int, type(callback))(("PyDict_AddWatcher", api))(callback)
    except Exception:  # noqa: BLE001 - every watcher id taken (RuntimeError): versions, per call
        return None
    watch = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.py_object)(("PyDict_Watch", api))
    # never freed, never cleared: a write during the interpreter's teardown meets live
    # code, and a call made then (an atexit handler, a daemon thread) still sees writes
    api.Py_IncRef(ctypes.py_object(callback))
    installed = (functools.partial(version, tick), functools.partial(watch, wid))
    M._precompile_dict_watch = installed  # type: ignore[attr-defined]
    return installed


def watch_models(watch, modules):
    """Watch, with ``watch`` (:func:`dict_watcher`'s), the ``__dict__`` and the
    parameter, buffer and submodule registries of every submodule of ``modules``: a
    write past ``__setattr__`` (``m.__dict__["training"] = True``, ``m._parameters[name]
    = p``) then moves the epoch, as an assignment does. Returns whether each was watched."""
    try:
        for model in modules:
            for m in model.modules():
                d = m.__dict__
                watch(d)
                for name in ("_parameters", "_buffers", "_modules"):
                    registry = d.get(name)
                    if isinstance(registry, dict):
                        watch(registry)
    except Exception:  # noqa: BLE001 - a dict the interpreter would not watch
        return False
    return True
