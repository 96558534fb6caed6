# ---- frozen Triton kernels (CUDA) -------------------------------------------------
# Copied verbatim into source halves of the `frozen` engine that have CUDA kernels
# (precompile_build/engines/codegen.py; the capture side is _triton_freeze.py). A
# kernel is a cubin plus what autotuning chose at capture time: Inductor's launcher
# text (grid arithmetic, then `runner(grid_0, grid_1, grid_2, stream, *args)`),
# num_warps, shared memory and argument types. It is launched by torch's own C++
# launcher, torch._C._StaticCudaLauncher: no Triton, no compiler, no benchmarking.


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

    def _load(self, device):
        e = self._entry
        C = torch._C._StaticCudaLauncher
        try:
            try:  # -> (function, n_regs, n_spills), or (module, function, n_regs, n_spills)
                loaded = C._load_kernel(self._path, e["function"], e["shared"], device)
            except TypeError:  # older torch: no device argument, loads on the current device
                with torch.cuda.device(device):
                    loaded = C._load_kernel(self._path, e["function"], e["shared"])
        except Exception as err:
            raise CallError(
                f"target {_META['target']!r}: cannot load the frozen CUDA kernel "
                f"{e['name']!r} ({e['function']}, {self._path}) on cuda:{device}: {err}"
            ) from err
        launch, function = C._launch_kernel, loaded[-3]
        num_warps, shared, arg_tys = e["num_warps"], e["shared"], e["arg_tys"]
        scratch = (None,) * e["scratch"]  # Triton's scratch pointers, unused by Inductor

        def runner(grid_0, grid_1, grid_2, stream, *args):
            launch(function, grid_0, grid_1, grid_2, num_warps, shared, arg_tys,
                   args + scratch, stream)

        runner.loaded = loaded  # keeps the CUDA module handle with the launcher
        scope = {"runner": runner}
        exec(e["launcher"], scope)
        return scope["launcher"]
