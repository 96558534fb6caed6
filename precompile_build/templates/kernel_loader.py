# ---- frozen kernel loader ---------------------------------------------------------
# Copied verbatim into source halves of the `frozen` engine. Loads compiled kernels
# from the unpacked cache: no compiler, no torch._inductor import. Reads
# PRECOMPILE_METADATA["kernels"]: [{"name", "kind", "file", ...}].
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import _META, CallError, _TritonKernel
# end stand-ins

import importlib.util as _importlib_util
import os as _os
import sys as _sys

try:  # the runtime's serving guard where it is installed: PRECOMPILE_NO_COMPILE=1 or no_compilation()
    from precompile_runtime._guard import guard_active as _serving_guard_on
except ImportError:  # without precompile-runtime: the variable alone

    def _serving_guard_on() -> bool:
        return _os.environ.get("PRECOMPILE_NO_COMPILE", "").strip().lower() in (
            "1",
            "true",
            "yes",
            "on",
        )


def _load_cpp_kernel(path, unique):
    """A CPU kernel is a CPython extension module exporting `kernel` (Inductor's
    C++ Python binding). Where torch has it, the module reads a helper address from
    an environment variable at import, which Inductor's own loader sets the same way."""
    ptr = getattr(torch._C._dynamo.guards, "_torchinductor_pyobject_tensor_data_ptr", None)
    if ptr is not None:  # newer torch only
        _os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(ptr)
    name = f"precompile_kernels.k{unique}.kernel"  # PyInit_kernel is the entry point
    module = _sys.modules.get(name)
    if module is None:
        spec = _importlib_util.spec_from_file_location(name, path)
        module = _importlib_util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        _sys.modules[name] = module
    return module.kernel


def _load_kernels(kernel_dir):
    kernels = {}
    for k in _META["kernels"]:
        path = _os.path.join(kernel_dir, k["file"])
        if k["kind"] == "cpp":
            kernels[k["name"]] = _load_cpp_kernel(path, k["sha256"][:16])
        elif k["kind"] == "triton":
            kernels[k["name"]] = _TritonKernel(path, k)
        else:  # pragma: no cover - written by our own codegen
            raise CallError(f"unknown kernel kind {k['kind']!r}")
    return kernels
