"""Compile-only Triton for GPUs this process does not have (the cross_arch worker).

Run as ``python -m precompile_build.engines.cross_compile JOBS.pkl RESULTS.pkl``
by :func:`precompile_build.engines.cross_arch.compile_jobs`, with
``CUDA_VISIBLE_DEVICES=""``: no GPU is visible here, so nothing Triton does can
resolve to the build GPU; every compile names its target explicitly
(``triton.compile(src, target=GPUTarget("cuda", 80, 32))``, Triton's compile-only
path: it needs ptxas, which the triton wheel ships, and no driver).

A job is one kernel for one architecture, with the candidate configurations of
the build GPU's autotuning in the order to try (the chosen one first, then the
others by their time on the build GPU). The first candidate that compiles and
fits the architecture's shared memory per block is the result; the reasons the
others were passed over come back with it.
"""

from __future__ import annotations

import importlib.util
import pickle
import sys
from typing import Any

_modules: dict[str, Any] = {}


def jit_function(module_path: str, fn_name: str):
    """The ``triton.JITFunction`` named ``fn_name`` in the file ``module_path`` (an
    Inductor kernel module: its global is the autotuner that wraps the function).
    Raises LookupError when the file has no such Triton function."""
    from triton.runtime.jit import JITFunction

    module = _modules.get(module_path)
    if module is None:
        _no_driver_probe()
        spec = importlib.util.spec_from_file_location(
            f"_precompile_cross_{len(_modules)}", module_path
        )
        if spec is None or spec.loader is None:
            raise LookupError(f"cannot import {module_path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[module_path] = module
    obj = getattr(module, fn_name, None)
    for _ in range(8):  # autotuner / heuristics wrappers keep the function as .fn
        if isinstance(obj, JITFunction) or obj is None:
            break
        obj = getattr(obj, "fn", None)
    if not isinstance(obj, JITFunction):
        raise LookupError(f"{module_path} has no Triton function {fn_name!r}")
    return obj


def _no_driver_probe() -> None:
    """Inductor's kernel modules call ``triton_helpers.set_driver_to_gpu()`` on import,
    which looks for an active GPU driver: there is none here, by design, and none is
    needed (every compile names its target). Make that call a no-op in this process."""
    try:
        from torch._inductor.runtime import triton_helpers
    except ImportError:  # a kernel module without Inductor's helpers
        return
    triton_helpers.set_driver_to_gpu = lambda: None


def _scratch(metadata) -> int:
    """How many scratch pointers the kernel's ABI takes (torch's static launcher
    passes None for each); a kernel that needs scratch memory is refused there."""
    n = 0
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(metadata, attr):
            if getattr(metadata, attr) > 0:
                raise ValueError(
                    f"needs {attr.split('_')[0]} scratch memory, which torch's "
                    "static CUDA launcher does not provide"
                )
            n += 1
    return n


def compile_one(job: dict) -> dict:
    """Compile one job (see the module docstring).

    Args:
        job: ``{"arch": "8.6", "cc": 86, "shared_limit": bytes, "want_ptx": bool,
            "serves": [arch, ...], "label": what the binary is, for messages (or None),
            "candidates": [{"module", "fn_name", "signature", "constants", "attrs",
            "options", "config"}, ...]}``.
    Returns:
        ``{"index": i, "cubin": bytes, "ptx": str or None, "sm": "sm_86", "shared":
        bytes, "num_warps", "function", "scratch", "rejected": [reason, ...]}``, or
        ``{"error": why no candidate serves, "rejected": [...]}``.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rejected = []
    for i, c in enumerate(job["candidates"]):
        try:
            fn = jit_function(c["module"], c["fn_name"])
            src = ASTSource(fn, c["signature"], c["constants"], c["attrs"])
            binary = triton.compile(
                src, target=GPUTarget("cuda", job["cc"], 32), options=dict(c["options"])
            )
            md = binary.metadata
            scratch = _scratch(md)
        except Exception as e:  # noqa: BLE001 - the reason goes to the build line and manifest
            text = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            rejected.append(f"config {c['config']}: does not compile for sm_{job['cc']}: {text}")
            continue
        if md.shared > job["shared_limit"]:
            also = [f"sm_{a.replace('.', '')}" for a in (job.get("serves") or [])[1:]]
            what = job.get("label") or (
                f"the sm_{job['cc']} cubin"
                + (f" (which also serves {', '.join(also)})" if also else "")
            )
            rejected.append(
                f"config {c['config']}: needs {md.shared} bytes of shared memory per block, "
                f"{what} may use {job['shared_limit']}"
            )
            continue
        ptx = binary.asm.get("ptx")
        sm = next(
            (ln.split()[1] for ln in (ptx or "").splitlines() if ln.startswith(".target")),
            f"sm_{job['cc']}",
        )
        return {
            "index": i,
            "cubin": bytes(binary.asm["cubin"]),
            "ptx": ptx if job["want_ptx"] else None,
            "sm": sm.rstrip(","),
            "shared": int(md.shared),
            "num_warps": int(md.num_warps),
            "function": str(md.name),
            "scratch": scratch,
            "rejected": rejected,
        }
    return {"error": "; ".join(rejected) or "no candidate configuration", "rejected": rejected}


def main(argv: list[str]) -> int:
    """``JOBS.pkl RESULTS.pkl``: compile every job of the list in JOBS.pkl, write the
    list of results (:func:`compile_one`) to RESULTS.pkl. Exit status 0 unless the
    files cannot be read or written."""
    with open(argv[0], "rb") as f:
        jobs = pickle.load(f)  # written by cross_arch.compile_jobs in the capture process
    results = [compile_one(job) for job in jobs]
    with open(argv[1], "wb") as f:
        pickle.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
