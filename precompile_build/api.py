"""The capture API: ``precompile_build.capture(fn, ...)``.

It has the shape of ``torch.compiler.precompile.capture``: a context manager; call
it inside the ``with`` block exactly as ``fn``; each call runs for real and returns
its result; the pair is written when the block exits cleanly. The first call is
the example that is captured.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Literal

from precompile_runtime.envelope import write_atomic

from . import engines
from .capturing import python_state
from .capturing.rng_state import python_rng_states
from .config import capture_env
from .config.capture_options import FROZEN_OPTIONS, OPTIONS, CaptureOptions, check_choice  # noqa: F401 - re-exported
from .errors import CaptureError, CompilerFailed, PythonStateWarning, warn_at_caller
from .process import stats as capture_stats


class Capture:
    """Returned by :func:`capture`; use it as ``with capture(fn) as f: f(...)``."""

    def __init__(self, fn, artifact_path: Path, cache_path: Path, options: CaptureOptions):
        self._fn = fn
        self.artifact_path = artifact_path
        self.cache_path = cache_path
        self.options = options
        self.engine = options.engine  # the engine the first call resolved to, after it
        self.backend, self.target = options.backend, options.target
        self.tracer, self.fallback = options.tracer, options.fallback
        self._pair: tuple[bytes, bytes] | None = None
        self.calls = 0

    def __enter__(self) -> Capture:
        return self

    def __call__(self, *args, **kwargs):
        """Call ``fn(*args, **kwargs)`` for real and return its result; the first call
        is also captured (raises CaptureError when it cannot be)."""
        self.calls += 1
        if self._pair is not None:
            return self._fn(*args, **kwargs)  # later calls run for real, uncaptured
        capture_stats.capture_began()  # the script's setup ends here (the build's report)
        device = _device_of(args, kwargs)
        engine, options = self.options.for_call(device)  # raises before the function runs
        self.engine = engine
        # the capture traces clones: the real call is the only one with effects
        before = python_rng_states()
        state = python_state.snapshot(self._fn, args, kwargs) if engine != "torch" else None
        box: dict = {}
        failed = None
        try:
            self._capture(engine, device, args, kwargs, options, box)
        except Exception as e:
            if "ran" in box:
                raise
            failed = e
        if failed is not None:  # the real call has not run: does the function itself fail?
            _raise_if_the_function_fails(self._fn, args, kwargs, self.target)  # (outside the
            raise failed  # except block: the function's traceback is not this one's context)
        if engine != "torch":  # ours trace Python once (torch.compile replays random calls)
            _warn_python_rng(
                before,
                python_rng_states(),
                self.target,
                refuse=options.get("guards", "dynamo") != "recorded",
            )
        assert self._pair is not None  # (_capture wrote it, or raised)
        self._pair = (self._pair[0], _with_function_name(self._pair[1], self._fn))
        result = box["result"] if "result" in box else self._fn(*args, **kwargs)
        if state is not None:  # (after the real call: what it changed, the trace too)
            _warn_python_state(
                python_state.changes(state, python_state.snapshot(self._fn, args, kwargs)),
                self.target,
            )
        return result

    def _capture(self, engine: str, device: str, args, kwargs, options: dict, box: dict) -> None:
        """Run the engine's capture of the first call (``self._pair``). An engine that
        judges by the real call runs it: then ``box["ran"]`` is set, and
        ``box["result"]`` holds its result once it returned."""
        with _torch_rng_kept(device):  # the trace and checks draw too: not the user's RNG
            try:
                mod = engines.get(engine)
                real_call = None
                if engines.judges_eager_call(mod):  # the engine compares with the real call

                    def real_call():
                        box["ran"] = True  # (also when it raises: it must not run again)
                        return box.setdefault("result", self._fn(*args, **kwargs))

                    self._pair = mod.capture_pair(
                        self._fn,
                        args,
                        kwargs,
                        target=self.target,
                        device=device,
                        options=options,
                        real_call=real_call,
                    )
                else:
                    self._pair = mod.capture_pair(
                        self._fn, args, kwargs, target=self.target, device=device, options=options
                    )
            except CompilerFailed as e:
                if self.fallback != "eager":
                    raise
                reason = str(e).split("\n")[0]  # the message's first line, as printed
                print(
                    f'precompile_build.capture: {reason}; fallback = "eager": capturing with '
                    "the eager engine (no kernels)",
                    file=sys.stderr,
                )
                self.engine = "eager"
                self._pair = engines.get("eager").capture_pair(
                    self._fn,
                    args,
                    kwargs,
                    target=self.target,
                    device=device,
                    options=dict(options, fallback_reason=reason),
                    real_call=real_call,
                    traced=e.traced,
                    real=e.real,
                )

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc_type is not None:
            print(
                f"precompile_build.capture: target {self.target!r}: nothing written, "
                f"the with-block raised {exc_type.__name__}",
                file=sys.stderr,
            )
            return False
        if self._pair is None:
            raise CaptureError(
                "the with-block made no call, so there is "
                "nothing to capture; call the object the with-statement gave you "
                "exactly as you would call the function",
                target=self.target,
            )
        write_pair(self.artifact_path, self._pair[0], self.cache_path, self._pair[1])
        from .process.imported import write_record  # the capture cache's record of what fn imported

        write_record()
        return False


def _torch_rng_kept(device: str):
    """torch's RNG state (CPU, and the current CUDA device for a CUDA capture) is put
    back after the block: the real call after the capture draws what it would have."""
    import torch

    cuda = [torch.cuda.current_device()] if device == "cuda" else []
    return torch.random.fork_rng(devices=cuda)


def _raise_if_the_function_fails(fn: Callable, args, kwargs, target: str) -> None:
    """After a capture failed before the real call ran: make that call, eagerly. When
    it raises too, the fault is the function's (or its arguments'), not the tracer's:
    raise a CaptureError chained to the function's own exception, so its traceback is
    printed first. Returns when the call succeeds (the capture's error stands)."""
    try:
        fn(*args, **kwargs)
    except Exception as own:
        text = (str(own).strip().splitlines() or [""])[0][:300]
        raise CaptureError(
            f"the function itself raises {type(own).__name__}: {text} -- "
            "also when called eagerly, with no tracer (the with-block's real call), so this is "
            "an error in the function or its arguments, not a tracing problem (its traceback "
            "is above). Fix it and capture again; nothing written",
            target=target,
        ) from own


def _warn_python_rng(
    before: dict[str, bytes], after: dict[str, bytes], target: str, refuse: bool
) -> None:
    """Refuse (``refuse``: CaptureError, nothing written) or warn when the trace drew
    from a Python-level RNG (``random.random()``, ``numpy.random.rand()``): the values
    it drew would be constants of the pair. (torch 2.13's Dynamo refuses such a draw as
    a graph break before this; 2.14's traces ``random.random()``.)"""
    moved = [name for name, state in after.items() if before.get(name, state) != state]
    if not moved:
        return
    text = (
        f"the function drew from {' and '.join(moved)} while it was "
        "captured; Python code runs once, at capture, and never when the pair is served, "
        "so the values it drew are frozen into the pair as constants. Use torch's RNG "
        "(torch.rand, F.dropout: served with a fresh draw per call) or pass the value "
        "as an argument"
    )
    if refuse:
        raise CaptureError(
            text + ', or pass options={"guards": "recorded"} to accept the frozen '
            "value with a warning",
            target=target,
        )
    warn_at_caller(text, PythonStateWarning, target=target)


def function_name(fn: Callable) -> dict[str, str] | None:
    """``{"module", "qualname"}`` when importing ``module`` and following ``qualname``
    gives ``fn`` itself (a module-level function or class), else None (a lambda, a
    nested function, one of ``__main__``: the capture script's)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if (
        not isinstance(module, str)
        or not isinstance(qualname, str)
        or module == "__main__"
        or "<" in qualname
        or module not in sys.modules
    ):
        return None
    obj: Any = sys.modules[module]
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return {"module": module, "qualname": qualname} if obj is fn else None


def _with_function_name(cache: bytes, fn: Callable) -> bytes:
    """The cache half with ``meta["function"]`` (:func:`function_name`) in our engines'
    envelope: an editable install whose source changed calls the function's current
    code by that name instead of the stale pair (precompile_runtime._stale). Torch's
    own pairs have no place for it and are refused when stale."""
    from precompile_runtime import envelope

    name = function_name(fn)
    if name is None or not envelope.is_envelope(cache):
        return cache
    env = envelope.loads(cache, what="the capture's cache half", check_blobs=False)
    env.meta = dict(env.meta, function=name)
    return envelope.dumps(env)


def _warn_python_state(changed: list[str], target: str) -> None:
    """Warn when the capture changed Python state outside the call's tensors
    (:mod:`precompile_build.capturing.python_state`): served pairs never do it again."""
    if changed:
        shown = "; ".join(changed[:5]) + (
            f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        warn_at_caller(
            "the function changed Python state while it was captured: "
            f"{shown}. Python code runs at capture only (the trace and the real call), never "
            "when the pair is served, so served calls leave this state as it is. Keep state "
            "the served calls need in tensors (a registered buffer, an argument updated in "
            "place), or change it outside the function",
            PythonStateWarning,
            target=target,
        )


def _device_of(args, kwargs) -> str:
    """``"cuda"`` when any tensor argument or module parameter is on CUDA, else ``"cpu"``.

    Raises:
        CaptureError: a list, tuple or dict holds itself (the trace walks them).
    """
    import torch

    def on_cuda(v, inside: frozenset) -> bool:
        if isinstance(v, torch.Tensor):
            return v.device.type == "cuda"
        if isinstance(v, torch.nn.Module):
            return any(t.device.type == "cuda" for t in (*v.parameters(), *v.buffers()))
        if isinstance(v, (list, tuple, dict)):
            if id(v) in inside:
                raise CaptureError(
                    "an argument contains itself (a list, tuple or dict that "
                    "holds itself); pass plain nested containers"
                )
            items = v.values() if isinstance(v, dict) else v
            return any([on_cuda(x, inside | {id(v)}) for x in items])  # walk all: find cycles
        return False

    return "cuda" if any(on_cuda(v, frozenset()) for v in (*args, *kwargs.values())) else "cpu"


def write_pair(source_path: Path, source: bytes, cache_path: Path, cache: bytes) -> None:
    """Write both halves so that a reader never sees a mixed pair.

    Each half goes through a temp file beside it, fsync and rename; if the second
    rename fails, the previous source half is put back. Raises OSError.
    """
    source_path, cache_path = Path(source_path), Path(cache_path)
    for p in (source_path, cache_path):
        p.parent.mkdir(parents=True, exist_ok=True)
    backup = source_path.read_bytes() if source_path.exists() else None
    write_atomic(source_path, source)
    try:
        write_atomic(cache_path, cache)
    except BaseException:
        if backup is None:
            source_path.unlink(missing_ok=True)
        else:
            write_atomic(source_path, backup)
        raise


def capture(
    fn: Callable,
    /,
    *,
    artifact_path: str | os.PathLike[str] | None = None,
    cache_path: str | os.PathLike[str] | None = None,
    engine: str = "auto",
    backend: str = "inductor",
    target: str | None = None,
    options: dict[str, Any] | None = None,
    tracer: str | None = None,
    fallback: str | None = None,
) -> Capture:
    """Capture ``fn`` into an artifact pair.

    Args:
        fn: the whole computation, e.g. ``lambda model, x: model(x)`` or a training
            step that calls ``loss.backward()``. nn.Module arguments have their
            parameters and buffers lifted to inputs: the pair holds no weights.
        artifact_path: where the source half goes (default: env
            ``PRECOMPILE_ARTIFACT_PATH``, set by the build backend).
        cache_path: where the cache half goes (default: env ``PRECOMPILE_CACHE_PATH``).
        engine: ``"auto"`` (see :func:`precompile_build.config.choices.resolve`: the
            ``PRECOMPILE_ENGINE`` variable, else frozen on CPU, torch on CUDA where
            torch has ``torch.compiler.precompile``; frozen whenever ``tracer``,
            ``fallback`` or an option of :data:`FROZEN_OPTIONS` is given, since they
            are its settings), ``"torch"``, ``"frozen"`` or ``"eager"``.
        backend: ``"inductor"`` or ``"eager"`` (no kernels).
        target: the name in messages (default: env ``PRECOMPILE_TARGET``, else the
            artifact file's stem).
        options: engine options, keys from :data:`OPTIONS` (any other key is a
            ValueError): ``"inductor"`` (a dict passed to Inductor's compile, frozen
            engine); ``"validation_multiple"`` (frozen engine: a positive number, the
            multiple of eager's fp64 error its kernels may have, default 3 for
            bf16/fp16 and small tensors, 2 otherwise; it only widens the default, a
            smaller value changes nothing); ``"eager_check"`` (frozen and
            eager engines: ``"refuse"``, default: a result that differs from the
            with-block's eager call beyond rounding is a CaptureError; ``"warn"``;
            ``"off"``); ``"cuda_graphs"`` (bool, frozen CUDA inference targets: the
            target's `cuda-graphs` key); ``"cuda_archs"`` (frozen CUDA targets: compute
            capabilities to compile the kernels for besides the build GPU's, a list
            such as ``["8.0", "9.0"]`` or ``"8.0,9.0"``: the target's `cuda-archs`
            key, see engines/cross_arch.py); ``"tracer"`` (the torch engine: torch's own
            tracer, ``"make_fx"`` or ``"dynamo"``; the other engines: as ``tracer=``;
            given with another ``tracer`` than auto, a ValueError).
        tracer: how the frozen and eager engines turn the call into a graph:
            ``"auto"`` (torch.export, make_fx for a training step or where export
            fails), ``"export"``, ``"export-strict"`` or ``"make_fx"``; default: env
            ``PRECOMPILE_TRACER`` (set from the target's ``tracer`` key), else auto.
            Another value than auto with the torch engine is a CaptureError.
        fallback: ``"eager"``: when the frozen engine's compiler (Inductor) fails,
            capture with the eager engine instead and record why in the pair's
            metadata (``fallback``); ``"none"``: raise. Default: env
            ``PRECOMPILE_FALLBACK`` (the target's `fallback` setting), else ``"none"``.
            ``"eager"`` with the torch engine is a CaptureError.
    Returns:
        a :class:`Capture` context manager.
    Raises:
        CaptureError: no paths given and none in the environment; at the first call
            (before ``fn`` runs) if ``tracer``/``fallback`` or a :data:`FROZEN_OPTIONS`
            key is set and the engine resolves to ``"torch"``, if ``"inductor"`` or
            ``"validation_multiple"`` is set and it resolves to ``"eager"``, or if the
            call cannot be captured; at exit if no call was made.
        ValueError: unknown engine, backend, fallback or tracer; ``options['tracer']``
            and ``tracer`` both given and different; an unknown key in
            ``options`` (named, with the accepted keys), a bad
            ``options['validation_multiple']`` or ``options['eager_check']`` (checked
            here, before the function runs).
        TypeError: ``fn`` is not callable; a path is not a str/PathLike or is a
            directory; ``options`` is not a mapping.
    """
    if not callable(fn):
        raise TypeError(
            f"precompile_build.capture(fn): fn must be callable, got {type(fn).__name__}"
        )
    fallback = fallback or os.environ.get(capture_env.FALLBACK) or "none"
    check_choice(engine, backend, fallback)  # before the paths: a wrong choice is named first
    artifact_path = artifact_path or os.environ.get(capture_env.ARTIFACT_PATH)
    cache_path = cache_path or os.environ.get(capture_env.CACHE_PATH)
    if not artifact_path or not cache_path:
        raise CaptureError(
            "precompile_build.capture needs artifact_path= and cache_path=, and neither "
            "they nor the PRECOMPILE_ARTIFACT_PATH / PRECOMPILE_CACHE_PATH variables are "
            "set: a capture script is run by the build, which sets them. Build the wheel "
            "(`python -m build`, `pip wheel .`), or run the targets without building one "
            "with `python -m precompile_build capture [--targets NAME]` in the project root "
            "(the pairs go to build/precompiled/); to run the script by hand, pass "
            "artifact_path= and cache_path= to precompile_build.capture"
        )
    for name, value in (("artifact_path", artifact_path), ("cache_path", cache_path)):
        if not isinstance(value, (str, os.PathLike)) or Path(value).is_dir():
            raise TypeError(
                f"precompile_build.capture: {name}={value!r} must be a file path "
                "(str or os.PathLike), not a directory"
            )
    target = target or os.environ.get(capture_env.TARGET) or Path(artifact_path).stem
    opts = CaptureOptions.parse(
        target=target,
        engine=engine,
        backend=backend,
        tracer=tracer,
        fallback=fallback,
        options=options,
    )
    if Path(artifact_path).resolve() == Path(cache_path).resolve():
        raise CaptureError(
            f"precompile_build.capture: artifact_path and cache_path are both {str(artifact_path)!r}; "
            "the source half and the cache half need two files (e.g. NAME.py and NAME.cache)"
        )
    return Capture(fn, Path(artifact_path), Path(cache_path), opts)
