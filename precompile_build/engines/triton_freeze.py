"""Capture side of frozen Triton kernels (CUDA): cubin + the launch Inductor chose.

Inductor turns each Triton kernel into a ``CachingAutotuner`` whose launchers are
small Python functions it generates from text (``CompileResult._gen_launcher_code``
in torch/_inductor/runtime/triton_heuristics.py)::

    def launcher(in_ptr0, out_ptr0, xnumel, stream):
        grid_0 = -(xnumel // -1024)
        grid_1 = 1
        grid_2 = 1
        runner(grid_0, grid_1, grid_2, stream, in_ptr0, out_ptr0, xnumel)

For a statically launched kernel (``StaticTritonCompileResult``), ``runner`` is
``StaticallyLaunchedCudaKernel.run``, which hands the cubin's function to torch's
built-in C++ launcher ``torch._C._StaticCudaLauncher._launch_kernel``. Freezing a
kernel keeps exactly that: the launcher text, the cubin bytes, the function name,
num_warps, shared memory and the argument type string. Serving (the template
triton_launcher.py) loads the cubin with ``_StaticCudaLauncher._load_kernel`` and
runs the launcher text with its own ``runner``: no Triton, no Inductor, no
benchmarking.

:func:`recording` installs the capture-time hooks that make this recoverable;
:func:`freeze_triton_kernel` reads one autotuner after the example run.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from precompile_runtime.pair_format import Kernel

from ..errors import CaptureError

# attributes our hooks put on Inductor's objects
_CODE = "_precompile_launcher_code"  # on a launcher function: its source text
_RESULT = "_precompile_compile_result"  # on a launcher function: the CompileResult
_CUBIN = "_precompile_cubin"  # on a StaticallyLaunchedCudaKernel: the cubin bytes

_state = threading.local()  # .code: text of the launcher being generated
_lock = threading.Lock()
_depth = 0
_UNSUPPORTED_HINT = "capture this target with engine='torch' or engine='eager'"


def _static_kernel_class():
    """torch's StaticallyLaunchedCudaKernel (module renamed across torch versions)."""
    try:  # newer torch
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:  # torch 2.11
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel  # type: ignore[no-redef]
    return StaticallyLaunchedCudaKernel


def _recording_exec(source, *args, **kwargs):
    """Stands in for ``exec`` inside triton_heuristics while recording: remembers
    the text of the launcher being generated, then runs it unchanged."""
    if isinstance(source, str) and source.startswith("def launcher("):
        _state.code = source
    return builtins.exec(source, *args, **kwargs)


def _read_cubin(kernel) -> bytes | None:
    raw = getattr(kernel, "cubin_raw", None)
    if raw:
        return bytes(raw)
    path = getattr(kernel, "cubin_path", None)
    if path:
        with open(path, "rb") as f:
            return f.read()
    return None


def start_compile_workers() -> None:
    """Start Inductor's kernel-compile worker pool now, as torch.compile does when it
    begins, so that it is up by the time the compile needs it (its start overlaps
    the trace): torch's ``maybe_warm_pool``, what torch.compile's Inductor backend
    calls. Nothing where that does nothing: Inductor compiling in-process
    (``compile_threads`` <= 1, e.g. ``TORCHINDUCTOR_COMPILE_THREADS=1``), no Triton,
    ``TORCH_WARM_POOL=0``; or when the pool is already up.

    The workers themselves are woken too (``wakeup``), not only the pool's sidecar:
    Inductor sends a kernel to the pool only once the pool answers, and compiles it
    in this process, one at a time, before then."""
    from torch._inductor import async_compile

    warm = getattr(async_compile, "maybe_warm_pool", None)
    if warm is not None:
        warm()
        return
    async_compile.AsyncCompile.warm_pool()  # an older torch: the sidecar, then its workers
    wakeup = getattr(async_compile.AsyncCompile, "wakeup", None)
    if wakeup is not None:
        wakeup()


def has_user_kernels(graph_module) -> bool:
    """Whether the traced graph calls user-defined Triton kernels (``wrap_triton``).
    Inductor's compile workers get only ``use_static_cuda_launcher`` of this process's
    config, not ``static_launch_user_defined_triton_kernels``: such a graph compiles
    in this process (``recording(in_process=True)``)."""
    return any(
        n.op == "call_function" and "triton_kernel_wrapper" in str(n.target)
        for n in graph_module.graph.nodes
    )


@contextlib.contextmanager
def recording(in_process: bool = False) -> Iterator[None]:
    """Hooks around Inductor's compile so that each Triton launcher it generates can
    be frozen afterwards by :func:`freeze_triton_kernel`.

    While active (reentrant; process-wide, so do not compile other graphs
    concurrently): Triton's static CUDA launcher is forced on, for Inductor's and
    user-defined (``wrap_triton``) kernels alike. Autotuning clones the arguments a kernel writes in place on the GPU
    whenever the device has room for them (see :func:`_clones_fit`).

    Args:
        in_process: compile every kernel in this process (``compile_threads=1``): for
            hooks that must see each ``triton.compile`` (cross_arch.recording) and
            for user-defined kernels (:func:`has_user_kernels`). Otherwise Inductor's worker pool compiles them, as torch.compile does; the
            launchers (and so what is frozen) are still made here, from the workers'
            compile results.
    """
    global _depth  # noqa: PLW0603 - the patch's nesting depth, process-wide under _lock
    import torch._inductor.config as config
    from torch._inductor.runtime import triton_heuristics as th

    with _lock:
        _depth += 1
        outer = _depth == 1
    if not outer:
        try:
            yield
        finally:
            with _lock:
                _depth -= 1
        return

    static_cls = _static_kernel_class()
    orig_copy = getattr(th.CachingAutotuner, "copy_args_to_cpu_if_needed", None)
    orig_gen = th.CompileResult._gen_launcher_code
    orig_load = static_cls.load_kernel
    had_own_load = "load_kernel" in static_cls.__dict__
    had_exec = "exec" in vars(th)

    def _gen_launcher_code(self, scope, def_args, runner_args):
        _state.code = None
        launcher = orig_gen(self, scope, def_args, runner_args)
        setattr(launcher, _CODE, _state.code)
        setattr(launcher, _RESULT, self)
        return launcher

    def load_kernel(self, *args, **kwargs):
        # load_kernel drops cubin_path / cubin_raw: keep the bytes first
        if getattr(self, _CUBIN, None) is None:
            setattr(self, _CUBIN, _read_cubin(self))
        return orig_load(self, *args, **kwargs)

    wanted: dict[str, Any] = {
        "use_static_cuda_launcher": True,
        "static_launch_user_defined_triton_kernels": True,
    }
    if in_process:
        wanted["compile_threads"] = 1
    patch = {k: v for k, v in wanted.items() if hasattr(config, k)}
    # Short kernel names: Triton truncates a cubin's file name to 150 characters, and
    # Inductor, not finding a long-named kernel's cubin, falls back to Triton's launcher.
    if hasattr(config, "triton") and hasattr(config.triton, "descriptive_names"):
        patch["triton.descriptive_names"] = False

    def copy_args_to_cpu_if_needed(self, *args, **kwargs):
        return {} if _clones_fit(self, args, kwargs) else orig_copy(self, *args, **kwargs)  # type: ignore[misc]

    # (mypy: torch's classes and module, patched for the capture and put back below)
    th.CompileResult._gen_launcher_code = _gen_launcher_code  # type: ignore[method-assign]
    if orig_copy is not None:
        th.CachingAutotuner.copy_args_to_cpu_if_needed = copy_args_to_cpu_if_needed  # type: ignore[method-assign]
    static_cls.load_kernel = load_kernel
    th.exec = _recording_exec  # type: ignore[attr-defined]
    _bypass_reasons.clear()
    heuristics_log = logging.getLogger(th.__name__)
    old_level = heuristics_log.level
    heuristics_log.addHandler(_bypass_handler)
    heuristics_log.setLevel(min(old_level or logging.INFO, logging.INFO))
    try:
        with config.patch(patch):
            yield
    finally:
        heuristics_log.removeHandler(_bypass_handler)
        heuristics_log.setLevel(old_level)
        th.CompileResult._gen_launcher_code = orig_gen  # type: ignore[method-assign]
        if orig_copy is not None:
            th.CachingAutotuner.copy_args_to_cpu_if_needed = orig_copy  # type: ignore[method-assign]
        if had_own_load:
            static_cls.load_kernel = orig_load
        else:
            del static_cls.load_kernel
        if not had_exec:
            del th.exec  # type: ignore[attr-defined]
        with _lock:
            _depth -= 1


def _clones_fit(autotuner, args, kwargs) -> bool:
    """Whether GPU clones of the arguments ``autotuner``'s kernel writes in place fit
    in the device's free memory (the caching allocator's unused blocks included).

    Why: Inductor times each config of such a kernel on clones of those arguments, but
    in inference graphs, where a clone would raise the allocator's peak, it restores
    them from a CPU copy inside the timed region instead, and it decides this per
    config (``CachingAutotuner.copy_args_to_cpu_if_needed``; pytorch/pytorch#194686).
    The first config timed then pays a host-to-device copy the next ones do not, and
    a slower config can win (docs/internals.md, "Frozen CUDA kernels", has the case).
    A capture can afford one clone at a time.
    """
    names = getattr(autotuner, "mutated_arg_names", None) or ()
    mutated = [a for n, a in zip(autotuner.fn.arg_names, args) if n in names]
    mutated += [a for n, a in kwargs.items() if n in names]
    mutated = [a for a in mutated if isinstance(a, torch.Tensor) and a.is_cuda]
    if not mutated:
        return True
    device = mutated[0].device
    need = sum(a.untyped_storage().nbytes() for a in mutated)
    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return need <= free + unused


class _BypassHandler(logging.Handler):
    """Keeps Inductor's reasons for not launching a kernel statically (it logs
    "Bypassing StaticallyLaunchedCudaKernel due to ..." at INFO), for our errors."""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "Bypassing Statically" in msg:
            _bypass_reasons.append(msg.split(" due to ", 1)[-1])


_bypass_reasons: list[str] = []
_bypass_handler = _BypassHandler(logging.INFO)


def _triton_cache_cubin(result, kernel, launcher) -> bytes | None:
    """Fallback: the cubin Triton wrote to its cache (``launcher.cache_hash``)."""
    cache_hash = getattr(launcher, "cache_hash", None)
    if not cache_hash:
        return None
    try:
        from torch._inductor.runtime.runtime_utils import triton_cache_dir
    except ImportError:  # pragma: no cover - moved in some torch versions
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    device = (getattr(result, "compile_meta", None) or {}).get("device", 0) or 0
    path = os.path.join(triton_cache_dir(device), cache_hash, f"{kernel.name}.cubin")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def _check_launcher_code(code: str, target: str, where: str) -> None:
    """The launcher must be plain grid arithmetic calling ``runner``: no other names."""
    module = compile(code, f"<launcher of target {target!r}, {where}>", "exec")
    fn_codes = [c for c in module.co_consts if hasattr(c, "co_names")]
    if len(fn_codes) != 1 or not code.startswith("def launcher("):
        raise CaptureError(
            f"unexpected launcher code from Inductor:\n{code}", target=target, where=where
        )
    unknown = set(fn_codes[0].co_names) - {"runner"} - set(dir(builtins))
    if unknown:
        raise CaptureError(
            f"Inductor's launcher needs {sorted(unknown)}, which a frozen pair "
            f"cannot provide; {_UNSUPPORTED_HINT}. Launcher:\n{code}",
            target=target,
            where=where,
        )


def freeze_triton_kernel(name: str, autotuner: Any, target: str) -> tuple[Kernel, dict[str, bytes]]:
    """Freeze one Triton kernel of Inductor's wrapper module after the example run.

    Args:
        name: the wrapper's global bound to the kernel (``triton_poi_fused_0``).
        autotuner: that global, a ``CachingAutotuner`` whose autotuning is done
            (``launchers[0]`` is the winner), built inside :func:`recording`.
        target: the capture target, for messages.
    Returns:
        ``(entry, files)``: ``entry`` a literal-safe dict (``name``, ``kind`` =
        ``"triton"``, ``file``, ``sha256``, ``function``, ``num_warps``, ``shared``,
        ``arg_tys``, ``scratch``, ``config``, ``launcher``); ``files`` maps
        ``entry["file"]`` to the cubin bytes.
    Raises:
        CaptureError: the kernel was not launched statically (Inductor fell back to
            Triton's own launcher), autotuning did not settle, or the launcher was
            not recorded.
    """
    where = f"Triton kernel {name!r}"
    if torch.version.hip:
        raise CaptureError(
            f"the frozen engine freezes CUDA cubins only (this is ROCm); {_UNSUPPORTED_HINT}",
            target=target,
            where=where,
        )
    launchers = list(getattr(autotuner, "launchers", None) or [])
    if len(launchers) != 1:
        raise CaptureError(
            f"has {len(launchers)} launchers after the example run, so no "
            "configuration was chosen (was the kernel launched by the example call? A "
            "torch.cond or while_loop branch the example does not run is tuned at compile "
            "time, which needs Inductor's autotune_local_cache on: not with cuda-archs); "
            f"{_UNSUPPORTED_HINT}",
            target=target,
            where=where,
        )
    launcher = launchers[0]
    code, result = getattr(launcher, _CODE, None), getattr(launcher, _RESULT, None)
    if code is None or result is None:
        raise CaptureError(
            "its launcher was built outside precompile_build's recording "
            "(Inductor reused a kernel compiled earlier in this process); capture in a "
            f"fresh process, or {_UNSUPPORTED_HINT}",
            target=target,
            where=where,
        )
    kernel = getattr(result, "kernel", None)
    if not isinstance(kernel, _static_kernel_class()):
        raise CaptureError(
            "Inductor launches it through Triton's own launcher "
            f"({type(kernel).__name__}), not torch's static CUDA launcher, so it cannot "
            "be served without Triton (typical causes: more kernel arguments than the "
            "static launcher takes, TMA descriptors, num_ctas > 1, global scratch "
            f"memory, launch attributes); {_UNSUPPORTED_HINT}. Inductor's reasons: "
            + ("; ".join(dict.fromkeys(_bypass_reasons)) or "none logged"),
            target=target,
            where=where,
        )
    cubin = getattr(kernel, _CUBIN, None) or _triton_cache_cubin(result, kernel, launcher)
    if not cubin:
        raise CaptureError(
            f"the cubin of {kernel.name!r} could not be read; {_UNSUPPORTED_HINT}",
            target=target,
            where=where,
        )
    _check_launcher_code(code, target, where)

    # StaticallyLaunchedCudaKernel.run appends one None per scratch buffer Triton's
    # ABI declares (global, profile); the frozen runner does the same.
    scratch = sum(
        bool(getattr(kernel, a, False)) for a in ("has_global_scratch", "has_profile_scratch")
    )
    digest = hashlib.sha256(cubin).hexdigest()
    entry: Kernel = {
        "name": name,
        "kind": "triton",
        "file": f"cubin/{digest[:32]}.cubin",
        "sha256": digest,
        "function": str(kernel.name),
        "num_warps": int(kernel.num_warps),
        "shared": int(kernel.shared),
        "arg_tys": str(kernel.arg_tys) + "O" * scratch,
        "scratch": scratch,
        "config": str(getattr(launcher, "config", "")),
        "launcher": code,
    }
    return entry, {entry["file"]: bytes(cubin)}
