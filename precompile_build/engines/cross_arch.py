"""Frozen Triton kernels for GPUs the build host does not have (`cuda-archs`).

The capture runs as always on the build GPU: trace, compile, autotune, validate.
Then each frozen Triton kernel is compiled again, with the configuration chosen
there (its constexprs such as XBLOCK, num_warps, num_stages: Inductor's own
``triton.compile`` arguments, recorded by :func:`recording`), for every other
listed architecture, by Triton's compile-only path in a subprocess that sees no
GPU (cross_compile.py). Extern calls (cuBLAS, cuDNN, ATen) need nothing per
architecture.

A configuration that does not fit a target (shared memory per block,
:data:`SHARED_PER_BLOCK`) is replaced by the best-timed candidate of the build
GPU's autotuning that fits; a kernel with none (or one that does not compile for
the target) leaves that architecture out of the pair, with the reason in the
build line and the manifest (``metadata["cuda_archs"]["left_out"]``). Registers
need no check: Triton's PTX bounds the threads per block (``.maxntid``), and ptxas
fits the registers to it.

Each kernel entry gets ``archs``: one choice per binary, ``{"sm": "sm_80" |
"sm_90a" | "compute_80", "binary": "cubin" | "ptx", "file", "sha256", "shared",
"num_warps", "scratch", "arg_tys", "function", "config", "launcher", "origin":
"native" | "cross", "replaced": why (when the config differs)}``; the serving side
picks one per device (precompile_runtime.arch_select). Triton compiles
capability 9.0 and above for the architecture-specific targets (sm_90a, sm_100a,
sm_120a), whose cubins run on that exact architecture only and whose PTX no
other GPU can JIT; below 9.0 a cubin also runs on a higher minor of its major
(sm_80 on sm_86/sm_89). PTX is kept for the lowest listed architecture below
9.0 only: any later GPU can JIT it, a compile at load (arch_select). It is
compiled in its own job, sized for the smallest shared memory of those GPUs
(99 KiB), so its config may differ from that architecture's cubin.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from precompile_runtime.pair_format import Kernel, PairMetadata

from ..config import capture_env
from ..config.compile_keys import parse_cuda_archs
from ..errors import CaptureError, ConfigError
from .cubins import cubin_arch, cubin_target, sm_name  # noqa: F401 - cubin_arch: re-exported
from .triton_freeze import _CODE, _RESULT, _static_kernel_class

# Most shared memory one block may use (the opt-in maximum, bytes): CUDA C
# Programming Guide, "Technical Specifications per Compute Capability".
SHARED_PER_BLOCK = {
    "7.5": 64 * 1024,
    "8.0": 163 * 1024,
    "8.6": 99 * 1024,
    "8.7": 163 * 1024,
    "8.9": 99 * 1024,
    "9.0": 227 * 1024,
    "10.0": 227 * 1024,
    "10.3": 227 * 1024,
    "11.0": 227 * 1024,
    "12.0": 99 * 1024,
    "12.1": 99 * 1024,
}
TEST_CROSS_NATIVE_ENV = capture_env.TEST_CROSS_NATIVE
"""Test-only: ``1`` compiles the build GPU's architecture through the cross path
too and freezes those cubins instead of the native ones (so validation runs them)."""
WORKER_TIMEOUT = 1800.0  # seconds for all cross compiles of one capture

# What recording() keeps, in side tables rather than as attributes: Inductor pickles
# autotuners and static kernels into its caches, and launchers and JITFunctions do
# not pickle. Weak keys: an entry lives as long as Inductor's object.
_timings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""CachingAutotuner -> {launcher: seconds} of its autotuning."""
_sources: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""static kernel -> (ASTSource, options) of the ``triton.compile`` it came from."""
_options: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""CompiledKernel -> the options it was compiled with."""


def shared_limit(arch: str, listed: tuple[str, ...]) -> tuple[int, list[str]]:
    """The shared memory per block a kernel compiled for ``arch`` may use, and the
    architectures its cubin serves: below 9.0 an sm_XY cubin also serves the higher
    minors of its major that ``listed`` has no cubin of (sm_80 on sm_86 and sm_89,
    which have 99 KiB against sm_80's 163 KiB), so it must fit all of them; from 9.0
    on (sm_90a, ...) it serves ``arch`` alone."""
    served = [arch]
    if cc_int(arch) < 90:
        major = arch.split(".")[0]
        same = sorted((a for a in listed if a.split(".")[0] == major), key=cc_int)
        for other in SHARED_PER_BLOCK:
            if (
                other.split(".")[0] == major
                and other not in listed
                and cc_int(other) > cc_int(arch)
            ):
                if max((a for a in same if cc_int(a) <= cc_int(other)), key=cc_int) == arch:
                    served.append(other)
    return min(SHARED_PER_BLOCK[a] for a in served), served


def cc_int(arch: str) -> int:
    """``"8.6"`` -> 86, ``"10.0"`` -> 100 (Triton's GPUTarget arch)."""
    major, minor = arch.split(".")
    return int(major) * 10 + int(minor)


def requested(options: dict, target: str) -> tuple[str, ...]:
    """The architectures ``options["cuda_archs"]`` lists (a list or a comma-separated
    string, as compile_keys.parse_cuda_archs reads them); () when absent.
    Raises CaptureError for a value that is not one (the message names the option)."""
    value = options.get("cuda_archs")
    if value is None or value == "" or value == []:
        return ()
    try:
        return parse_cuda_archs(
            value if isinstance(value, list) else str(value),
            "the capture option cuda_archs (PRECOMPILE_CUDA_ARCHS)",
        )
    except ConfigError as e:
        raise CaptureError(f"{e}", target=target) from None


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Keep what a cross compile needs, while Inductor compiles (beside
    _triton_freeze.recording, for captures with `cuda-archs`): the options of each ``triton.compile`` call, the
    source each static kernel was compiled from, and each autotuner's timings.

    Inductor's FX graph and autotuning caches are off while it is active: a kernel
    restored from them is neither compiled nor autotuned here, so neither its compile
    inputs nor the timings of the configurations it did not choose would be seen
    (a second capture of the same call in one machine would fail, or lose the
    candidates that replace a configuration too big for another architecture)."""
    import torch._inductor.config as config

    uncached = {k: False for k in _INDUCTOR_CACHES if hasattr(config, k)}
    with config.patch(uncached):
        yield from _recording_hooks()


_INDUCTOR_CACHES = (
    "fx_graph_cache",
    "fx_graph_remote_cache",
    "autotune_local_cache",
    "autotune_remote_cache",
    "bundled_autotune_remote_cache",
)


def _recording_hooks() -> Iterator[None]:
    """The hooks of :func:`recording` (a generator: its one yield is the recording)."""
    try:
        import triton
    except ImportError:  # no Triton: no Triton kernels to compile again
        yield
        return
    from torch._inductor.runtime import triton_heuristics as th

    static_cls = _static_kernel_class()
    orig_compile = triton.compile
    orig_init = static_cls.__init__
    had_init = "__init__" in static_cls.__dict__
    orig_bench = th.CachingAutotuner.benchmark_all_configs

    def compile(src, *args, **kwargs):  # noqa: A001 - stands in for triton.compile
        binary = orig_compile(src, *args, **kwargs)
        options = kwargs.get("options", args[1] if len(args) > 1 else None)
        with contextlib.suppress(TypeError):  # not weak-referenceable: not recorded
            _options[binary] = dict(options or {})
        return binary

    def __init__(self, kernel, *args, **kwargs):
        orig_init(self, kernel, *args, **kwargs)
        with contextlib.suppress(TypeError):
            _sources[self] = (getattr(kernel, "src", None), _options.get(kernel))

    def benchmark_all_configs(self, *args, **kwargs):
        timings = orig_bench(self, *args, **kwargs)
        with contextlib.suppress(TypeError):
            _timings[self] = dict(timings)
        return timings

    triton.compile = compile
    static_cls.__init__ = __init__
    th.CachingAutotuner.benchmark_all_configs = benchmark_all_configs  # type: ignore[method-assign]
    try:
        yield
    finally:
        triton.compile = orig_compile
        if had_init:
            static_cls.__init__ = orig_init
        else:
            del static_cls.__init__
        th.CachingAutotuner.benchmark_all_configs = orig_bench  # type: ignore[method-assign]


def _from_compile_meta(autotuner, result) -> tuple[Any, dict, dict, dict, dict] | None:
    """``(fn, signature, constants, attrs, options)`` as Inductor builds its
    ``triton.compile`` call from a compile result's ``compile_meta``
    (CachingAutotuner._precompile_config): for a kernel whose compile this
    process did not see (restored from Inductor's caches). None without it."""
    cm = getattr(result, "compile_meta", None)
    if not isinstance(cm, dict) or "signature" not in cm:
        return None
    options = {
        "num_warps": cm["num_warps"],
        "num_stages": cm["num_stages"],
        "debug": cm.get("debug", False),
        "sanitize_overflow": False,
    }
    for key in ("enable_fp_fusion", "launch_pdl", "launch_cooperative_grid"):
        if key in cm:
            options[key] = cm[key]
    if cm.get("disable_ftz"):
        options["enable_reflect_ftz"] = False
    attrs = (cm.get("configs") or [{}])[0]
    return (
        autotuner.fn,
        dict(cm["signature"]),
        dict(cm.get("constants") or {}),
        dict(attrs or {}),
        options,
    )


def _candidate(autotuner, launcher) -> dict | None:
    """What the worker needs to compile ``launcher``'s configuration again, or None
    when it was not recorded."""
    result = getattr(launcher, _RESULT, None)
    kernel = getattr(result, "kernel", None)
    try:
        src, options = _sources.get(kernel, (None, None))
    except TypeError:  # None, or not weak-referenceable: not recorded
        src, options = None, None
    code = getattr(launcher, _CODE, None)
    if code is None:
        return None
    if src is not None and options is not None:
        fn, signature, attrs = src.fn, dict(src.signature), dict(src.attrs or {})
        constants = dict(getattr(src, "constants", None) or getattr(src, "constexprs", None) or {})
    else:
        found = _from_compile_meta(autotuner, result)
        if found is None:
            return None
        fn, signature, constants, attrs, options = found
    py = getattr(fn, "fn", fn)
    try:
        module = inspect.getsourcefile(py) or py.__code__.co_filename
    except TypeError:
        return None
    return {
        "module": module,
        "fn_name": fn.__name__,
        "signature": signature,
        "constants": constants,
        "attrs": attrs,
        "options": dict(options),
        "config": str(getattr(launcher, "config", "")),
        "launcher": code,
    }


def candidates(autotuner) -> list[dict]:
    """The configurations of ``autotuner``'s kernel a cross compile may use, in the
    order to try: the one autotuning chose, then the others by their time on the
    build GPU (fastest first), each with its ``seconds`` (None: not timed)."""
    winner = autotuner.launchers[0]
    try:
        timings = _timings.get(autotuner) or {}
    except TypeError:
        timings = {}
    # a config that failed on the build GPU (timed inf) is no candidate
    others = sorted(
        (t, i, la)
        for i, (la, t) in enumerate(timings.items())
        if la is not winner and not math.isinf(t)
    )
    first = _candidate(autotuner, winner)
    if first is None:  # without the chosen config there is nothing to start from
        return []
    first["seconds"] = timings.get(winner)
    out = [first]
    for seconds, _, launcher in others:
        c = _candidate(autotuner, launcher)
        if c is not None:
            c["seconds"] = seconds
            out.append(c)
    return out


def compile_jobs(jobs: list[dict], target: str) -> list[dict]:
    """Run :func:`precompile_build.engines.cross_compile.compile_one` for each job
    in a subprocess that sees no GPU (``CUDA_VISIBLE_DEVICES=""``).

    Returns:
        one result per job, in order. Raises CaptureError when the worker fails
        (its output is in the message) or runs longer than WORKER_TIMEOUT seconds.
    """
    if not jobs:
        return []
    with tempfile.TemporaryDirectory(prefix="precompile-cross-") as tmp:
        jobs_path, out_path = os.path.join(tmp, "jobs.pkl"), os.path.join(tmp, "results.pkl")
        with open(jobs_path, "wb") as f:
            pickle.dump(jobs, f)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "precompile_build.engines.cross_compile",
                    jobs_path,
                    out_path,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=WORKER_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise CaptureError(
                "compiling the kernels for `cuda-archs` took "
                f"over {WORKER_TIMEOUT:.0f} s; list fewer architectures",
                target=target,
            ) from None
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise CaptureError(
                "the compile-only Triton process for `cuda-archs` failed "
                f"(exit status {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}",
                target=target,
            )
        with open(out_path, "rb") as f:
            return pickle.load(f)


def _triton_version() -> str:
    import triton

    return triton.__version__


def _choice(
    entry: dict,
    arch: str,
    sm: str,
    binary: str,
    data: bytes,
    res: dict,
    cand: dict,
    blobs: dict[str, bytes],
) -> dict:
    if binary == "cubin" and cubin_target(data) != sm:  # never file a cubin under another target
        raise CaptureError(
            f"Triton compiled {entry['name']!r} for {cubin_target(data)} when asked "
            f"for {sm}; report this (triton {_triton_version()})"
        )
    digest = hashlib.sha256(data).hexdigest()
    name = f"{binary}/{digest[:32]}.{binary}"
    blobs[name] = data
    base_tys = entry["arg_tys"][: len(entry["arg_tys"]) - entry["scratch"]]
    choice = {
        "arch": arch,
        "sm": sm,
        "binary": binary,
        "file": name,
        "sha256": digest,
        "shared": res["shared"],
        "num_warps": res["num_warps"],
        "scratch": res["scratch"],
        "arg_tys": base_tys + "O" * res["scratch"],
        "function": res["function"],
        "config": cand["config"],
        "launcher": cand["launcher"],
        "origin": "cross",
    }
    if res["index"]:
        choice["replaced"] = (
            f"{entry['config']} replaced by {cand['config']}, the next best of "
            f"the build GPU's autotuning that serves {sm} (" + "; ".join(res["rejected"]) + ")"
        )
    return choice


def _native_choice(entry: Mapping[str, Any], build: str) -> dict:
    keys = (
        "file",
        "sha256",
        "shared",
        "num_warps",
        "scratch",
        "arg_tys",
        "function",
        "config",
        "launcher",
    )
    return {
        "arch": build,
        "sm": sm_name(cc_int(build)),
        "binary": "cubin",
        "origin": "native",
        **{k: entry[k] for k in keys},
    }


def cross_compile(
    kernels: list[Kernel],
    blobs: dict[str, bytes],
    cands: dict[str, list[dict]],
    archs: tuple[str, ...],
    build: str,
    target: str,
) -> dict:
    """Add the other architectures' binaries to the frozen Triton kernels.

    Args:
        kernels: the pair's kernel entries (_triton_freeze.freeze_triton_kernel);
            each Triton one gets ``archs`` (see the module docstring), in place.
        blobs: the cache's files; the new cubins and PTX are added.
        cands: kernel name -> :func:`candidates` of its autotuner.
        archs: the requested architectures (``"8.0"``, ...); ``build``, the build
            GPU's, is there natively and need not be listed.
        build: the build GPU's compute capability (``"9.0"``).
        target: for messages.
    Returns:
        the report kept as ``metadata["cuda_archs"]``: ``{"tuned_on": build,
        "validated_on": [build], "compiled_for": [...], "binaries": ["sm_80",
        "compute_80", "sm_90a", ...], "left_out": {arch: reason}, "replaced":
        {arch: {kernel: reason}}}``.
    Raises:
        CaptureError: a kernel's compile inputs were not recorded, or the worker failed.
    """
    triton_kernels = [k for k in kernels if k["kind"] == "triton"]
    cross_native = os.environ.get(TEST_CROSS_NATIVE_ENV) == "1"
    below9 = [a for a in archs if cc_int(a) < 90]
    ptx_arch = min(below9, key=cc_int) if below9 else None
    # the PTX may be JIT-compiled on any later GPU without a cubin: sized for the smallest
    ptx_limit = (
        min(v for a, v in SHARED_PER_BLOCK.items() if ptx_arch and cc_int(a) >= cc_int(ptx_arch))
        if ptx_arch
        else 0
    )
    listed = tuple(sorted({*archs, build}, key=cc_int))
    wanted = [a for a in archs if a != build or cross_native]
    jobs, where = [], []
    for k in triton_kernels:
        cs = cands.get(k["name"]) or []
        if not cs:
            raise CaptureError(
                "its compile inputs were not recorded, so it cannot be compiled for `cuda-archs`; "
                "capture in a fresh process, or drop `cuda-archs`",
                target=target,
                where=f"Triton kernel {k['name']!r}",
            )
        todo = [(a, "cubin", *shared_limit(a, listed)) for a in wanted]
        if ptx_arch:
            todo.append((ptx_arch, "ptx", ptx_limit, []))
        for a, binary, limit, served in todo:
            label = (
                None
                if binary == "cubin"
                else f"the compute_{cc_int(a)} PTX (JIT-compiled on any later GPU without a cubin)"
            )
            jobs.append(
                {
                    "arch": a,
                    "cc": cc_int(a),
                    "shared_limit": limit,
                    "serves": served,
                    "want_ptx": binary == "ptx",
                    "label": label,
                    "candidates": [
                        {x: c[x] for x in c if x not in ("launcher", "seconds")} for c in cs
                    ],
                }
            )
            where.append((k, a, binary, cs))
    results = compile_jobs(jobs, target)
    left_out: dict[str, str] = {}
    replaced: dict[str, dict[str, str]] = {}
    done: dict[tuple[str, str], list] = {}
    for (k, a, binary, cs), res in zip(where, results):
        key = a if binary == "cubin" else f"{a} (PTX)"
        if "error" in res:
            left_out.setdefault(key, f"kernel {k['name']}: {res['error']}")
        else:
            done.setdefault((a, binary), []).append((k, res, cs[res["index"]]))
    for k in triton_kernels:
        k["archs"] = [] if cross_native else [_native_choice(k, build)]
    for (a, binary), items in done.items():
        key = a if binary == "cubin" else f"{a} (PTX)"
        if key in left_out:  # all kernels or none: a pair serves an architecture whole
            continue
        for k, res, cand in items:
            data = res["cubin"] if binary == "cubin" else res["ptx"].encode("utf-8")
            sm = res["sm"] if binary == "cubin" else "compute_" + res["sm"][3:]
            c = _choice(k, a, sm, binary, data, res, cand, blobs)
            k["archs"].append(c)
            if "replaced" in c:
                replaced.setdefault(key, {})[k["name"]] = c["replaced"]
            if (
                a == build and binary == "cubin"
            ):  # test switch: the cross-compiled cubin runs (and is validated)
                k.update(
                    {
                        x: c[x]
                        for x in (
                            "file",
                            "sha256",
                            "shared",
                            "num_warps",
                            "scratch",
                            "arg_tys",
                            "function",
                            "config",
                            "launcher",
                        )
                    }
                )
    for k in triton_kernels:
        k["archs"].sort(key=lambda c: (cc_int(c["arch"]), c["binary"]))
    compiled = sorted({build, *(a for a in archs if a not in left_out)}, key=cc_int)
    if triton_kernels:
        binaries = sorted({c["sm"] for k in triton_kernels for c in k["archs"]})
    else:  # extern calls only: nothing per architecture
        binaries = sorted(f"sm_{cc_int(a)}" for a in compiled)
    return {
        "tuned_on": build,
        "validated_on": [build],
        "compiled_for": compiled,
        "binaries": binaries,
        "left_out": left_out,
        "replaced": replaced,
    }


def add_archs(
    metadata: PairMetadata,
    fingerprint: dict,
    module: Any,
    blobs: dict[str, bytes],
    options: dict,
    target: str,
) -> None:
    """The frozen engine's step for `cuda-archs` (``options["cuda_archs"]``; nothing
    without it): compile ``metadata["kernels"]``' Triton kernels, the autotuners of
    Inductor's wrapper ``module``, for the other architectures (:func:`cross_compile`),
    adding their binaries to ``blobs``, the report as ``metadata["cuda_archs"]`` and
    ``cuda_binaries`` to ``fingerprint``. Raises CaptureError (see cross_compile)."""
    archs = requested(options, target)
    if not archs:
        return
    kernels = metadata["kernels"]
    cands = {
        k["name"]: candidates(getattr(module, k["name"])) for k in kernels if k["kind"] == "triton"
    }
    metadata["cuda_archs"] = cross_compile(
        kernels, blobs, cands, archs, fingerprint["compute_capability"], target
    )
    fingerprint["cuda_binaries"] = " ".join(metadata["cuda_archs"]["binaries"])
