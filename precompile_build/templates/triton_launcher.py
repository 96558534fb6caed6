# ---- frozen Triton kernels (CUDA) -------------------------------------------------
# Copied verbatim into source halves of the `frozen` engine that have CUDA kernels
# (precompile_build/engines/codegen.py; the capture side is triton_freeze.py). A
# kernel is a cubin plus what autotuning chose at capture time: Inductor's launcher
# text (grid arithmetic, then `runner(grid_0, grid_1, grid_2, stream, *args)`),
# num_warps, shared memory and argument types. It is launched by torch's own C++
# launcher, torch._C._StaticCudaLauncher: no Triton, no compiler, no benchmarking.
# Reads names the source half defines: torch, _os, _META, CallError (driver.py),
# _serving_guard_on (kernel_loader.py), _binary_pick, _binary_force_ptx and
# _FORCE_PTX_ENV (precompile_runtime/_arch_rules.py, copied in before this block).
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import (
        _FORCE_PTX_ENV,
        _META,
        CallError,
        _binary_force_ptx,
        _binary_pick,
        _os,
        _serving_guard_on,
    )
# end stand-ins


class _TritonKernel:
    """One frozen Triton kernel; ``run(*args, stream=...)`` is the call Inductor's
    wrapper makes. The cubin is loaded lazily on each CUDA device it runs on."""

    def __init__(self, path, entry):
        self._path = path
        self._entry = entry
        self._launchers = {}  # CUDA device index -> launcher bound to that device's function

    def run(self, *args, stream, **kwargs):
        device = torch.cuda.current_device()
        launcher = self._launchers.get(device)
        if launcher is None:
            launcher = self._launchers[device] = self._load(device)
        launcher(*args, **kwargs, stream=stream)

    def _choose(self, device):
        """The entry to load on ``device``: the kernel's only binary, or (a pair built
        with `cuda-archs`) the one the rules of _arch_rules.py (copied into this file
        above) pick for the device's compute capability. Returns (entry, path)."""
        e = self._entry
        if not e.get("archs"):
            return e, self._path
        cc = tuple(torch.cuda.get_device_capability(device))
        chosen = _binary_pick(e["archs"], cc, _binary_force_ptx(_os.environ.get(_FORCE_PTX_ENV)))
        if chosen is None:
            raise CallError(
                f"target {_META['target']!r}: the frozen CUDA kernel {e['name']!r} has no binary "
                f"for cuda:{device} (compute capability {cc[0]}.{cc[1]}); it has "
                f'{", ".join(c["sm"] for c in e["archs"])}: add "{cc[0]}.{cc[1]}" to `cuda-archs`'
            )
        if chosen["binary"] == "ptx" and _serving_guard_on():  # the driver's JIT of PTX compiles
            raise CallError(
                f"target {_META['target']!r}: the frozen CUDA kernel {e['name']!r} has only PTX "
                f"({chosen['sm']}) for cuda:{device} (compute capability {cc[0]}.{cc[1]}), which "
                "the driver compiles at load: refused under PRECOMPILE_NO_COMPILE=1"
            )
        root = self._path[: len(self._path) - len(e["file"])]
        return chosen, _os.path.join(root, chosen["file"])

    def _load(self, device):
        e, path = self._choose(device)
        C = torch._C._StaticCudaLauncher
        try:
            try:  # -> (function, n_regs, n_spills), or (module, function, n_regs, n_spills)
                loaded = C._load_kernel(path, e["function"], e["shared"], device)
            except TypeError:  # older torch: no device argument, loads on the current device
                with torch.cuda.device(device):
                    loaded = C._load_kernel(path, e["function"], e["shared"])  # type: ignore[call-arg]
        except Exception as err:
            raise CallError(
                f"target {_META['target']!r}: cannot load the frozen CUDA kernel "
                f"{self._entry['name']!r} ({e['function']}, {path}) on cuda:{device}: {err}"
            ) from err
        launch, function = C._launch_kernel, loaded[-3]
        num_warps, shared, arg_tys = e["num_warps"], e["shared"], e["arg_tys"]
        scratch = (None,) * e["scratch"]  # Triton's scratch pointers, unused by Inductor

        def runner(grid_0, grid_1, grid_2, stream, *args):
            launch(
                function, grid_0, grid_1, grid_2, num_warps, shared, arg_tys, args + scratch, stream
            )

        runner.loaded = loaded  # type: ignore[attr-defined]  # keeps the CUDA module handle with the launcher
        scope = {"runner": runner}
        exec(e["launcher"], scope)
        return scope["launcher"]
