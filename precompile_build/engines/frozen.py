"""The `frozen` engine: Inductor-compiled kernels frozen into the pair.

Capture: trace the call (tracing.py), compile the flat graph with torch's public
precompilation API for Inductor (``torch._inductor.standalone_compile``), then take
Inductor's generated wrapper module (``call(args)``) and the kernels it loaded:

- CPU kernels are the C++ extension modules (``.so``) Inductor built; their bytes go
  into the cache, so serving never runs a C++ compiler;
- CUDA kernels are Triton kernels; their cubins and the launch configuration chosen
  by autotuning go into the cache (see triton_launcher.py), so serving never runs
  Triton's compiler nor benchmarks configs.

The wrapper is rewritten (``_rewrite_wrapper``) so that it imports nothing from
torch._inductor / torch._dynamo: each ``async_compile.*(...)`` kernel definition
becomes ``_kernels["name"]``, and its ``extern_kernels.NAME`` calls are bound to torch
calls (extern_calls.py). With ``mode = "max-autotune"`` (:func:`mode_options`) Inductor
picks among implementations at capture; autotune.py keeps it to the ones a pair can
hold. Before the pair is written, the rewritten wrapper is
run on the example inputs with the frozen kernels and compared with the graph; a
pair that computes something else is never written.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import platform
import re
from typing import Callable

import torch

from precompile_runtime.envelope import Envelope, dumps
from precompile_runtime.fingerprint import ISA_REQUIRES, cpu_flags, host_fingerprint
from precompile_runtime.pair_format import Kernel

from ..capturing import dynamic_dims, sharing, unbacked
from ..capturing.tracing import TracedCall, run_real_call, trace_call
from ..config.choices import MODES
from ..errors import CaptureError, CompilerFailed, torch_warnings_shown
from ..process.stats import cuda_peaks, record_tuning, timed
from ..process.world import fake_reason
from ..validation.validate import validate
from . import autotune, codegen, cross_arch, extern_calls
from .kernel_size import strip_kernel
from .triton_freeze import (
    freeze_triton_kernel,
    has_user_kernels,
    start_compile_workers,
)
from .triton_freeze import recording as freeze_recording  # cubins + launch code per kernel

# Names Inductor's wrapper imports from the compiler stack, and what replaces them.
_SHIMS = {
    "align": "def align(nbytes):\n    return (nbytes + 63) & -64  # Inductor's ALIGN_BYTES\n",
    # torch._inductor.runtime.runtime_utils.assert_tensor_metadata (newer torch)
    "assert_tensor_metadata": (
        "def assert_tensor_metadata(tensor, size, stride, dtype, op_name=None):\n"
        "    if tensor is None:\n"
        "        return\n"
        "    if tensor.dtype != dtype:\n"
        "        raise RuntimeError(f'expected dtype {dtype} but got {tensor.dtype} in {op_name}')\n"
        "    assert_size_stride(tensor, size, stride, op_name)\n"
    ),
}
_DROPPED_CALLS = {"get_args", "benchmark_compiled_module"}


JUDGES_EAGER_CALL = True
"""capture_pair takes ``real_call``: the frozen results are compared with the eager call's."""


def capture_pair(
    fn, args, kwargs, *, target: str, device: str, options: dict, real_call=None
) -> tuple[bytes, bytes]:
    """Capture one call of ``fn`` into a frozen pair.

    Args:
        real_call: runs the user's call for real (once, after the trace took its
            clones of the inputs); its results are the eager judge of the pair.
            None: no eager-call comparison.
    Returns:
        ``(source_bytes, cache_bytes)``: the two halves.
    Raises:
        CaptureError: the call cannot be captured, a kernel cannot be frozen, or the
            frozen wrapper's results differ from the captured graph's (judged against
            an fp64 reference, see numerics.py) or from the eager call's beyond rounding.
    """
    with cuda_peaks(device):  # the GPU peaks, per step too, for the build's report
        return _capture(fn, args, kwargs, target, device, options, real_call)


def _capture(fn, args, kwargs, target: str, device: str, options: dict, real_call):
    if device == "cuda" and not cross_arch.requested(options, target):
        start_compile_workers()  # Inductor's compile workers start while the call is traced
    with timed("trace"):
        traced = trace_call(
            fn,
            args,
            kwargs,
            target=target,
            tracer=options.get("tracer"),
            guards=options.get("guards", "dynamo"),
        )
    device = traced.metadata["device"]
    if options.get("cuda_graphs") and (device != "cuda" or traced.metadata["grad_param_indices"]):
        raise CaptureError(
            "cuda-graphs = true needs a CUDA inference target; this "
            f"one {'runs a backward' if device == 'cuda' else 'was captured on ' + device}: "
            "drop the option",
            target=target,
        )
    if options.get("cuda_graphs") and unbacked.symbols(traced.graph_module):
        raise CaptureError(
            "cuda-graphs = true replays the sizes a CUDA graph recorded, and this function sizes "
            "tensors by their values (nonzero, masked_select, x[mask], .item(), unique, nms: "
            f"{', '.join(unbacked.symbols(traced.graph_module))}); drop the option (the pair serves "
            "every size without CUDA graphs)",
            target=target,
        )
    real = None
    if real_call is not None:
        with timed("eager_call"):
            real = run_real_call(traced, real_call)
    try:
        source, blobs, fingerprint = _compile(traced, target, options, real)
    except CompilerFailed as e:
        # `fallback = "eager"` (api.py) serves this trace with the eager engine,
        # judged by this real call: the call has run and must not run again
        raise e.with_call(traced, real).with_traceback(e.__traceback__) from e.__cause__
    code_hash = hashlib.sha256(source).hexdigest()
    env = Envelope(
        engine="frozen",
        code_hash=code_hash,
        fingerprint=fingerprint,
        meta={"target": target, "kernels": len(blobs)},
        blobs=blobs,
    )
    return source, dumps(env)


def _compile(traced: TracedCall, target: str, options: dict, real: dict | None = None):
    """Inductor's compile of the traced graph, its kernels frozen into blobs and the
    source half rendered and validated: ``(source, blobs, fingerprint)``.
    CompilerFailed where Inductor fails (``fallback = "eager"`` applies)."""
    from torch._inductor.codecache import PyCodeCache

    before = {id(m) for m in PyCodeCache.modules}
    recording, keep = _recording(traced, options, target)
    # dynamic dims: compile against the trace's ShapeEnv and fake inputs, so that
    # Inductor compiles for exactly the marked symbols (real inputs would be
    # refakeified with every dim a new symbol); sizes the data decides (unbacked.py):
    # in the fake mode whose ShapeEnv made their symbols, as torch.compile does
    dynamic = traced.symbolic is not None
    data_dependent = unbacked.record(traced.graph_module, traced.metadata["num_user_outputs"])
    from_graph = dynamic or data_dependent is not None
    inputs = (
        traced.symbolic.inputs
        if dynamic
        else unbacked.compile_inputs(traced.graph_module)
        if from_graph
        else traced.example_inputs
    )
    on_cpu = traced.metadata["device"] == "cpu"
    cpu_isa, pin_march = _cpu_target() if on_cpu else (None, contextlib.nullcontext())
    # `mode = "max-autotune"` is torch.compile's mode of that name without Inductor's own
    # CUDA graphs (the target's `cuda-graphs` are the frozen engine's), under the user's settings
    user = {**mode_options(options.get("mode"), target), **(options.get("inductor") or {})}
    tuned = _run_inductor(traced, target, user, inputs, from_graph, (recording, keep, pin_march))
    record_tuning(tuned)  # its seconds, and the choices replaced, for the build line
    traced.finish_dynamic(target)  # after the compile: Inductor's guards count too
    module = _new_wrapper(before, target)
    return _frozen_source(traced, module, target, options, real, cpu_isa, data_dependent)


def _recording(traced: TracedCall, options: dict, target: str) -> tuple[Callable, Callable]:
    """The two contexts the compile runs in on CUDA: triton_freeze's recording of
    cubins and launch code per kernel, and (`cuda-archs`) cross_arch's of what
    compiling the kernels again for other GPUs needs (its hooks must see every
    triton.compile: kernels compile in this process then). Elsewhere neither."""
    cross = traced.metadata["device"] == "cuda" and bool(cross_arch.requested(options, target))
    keep = cross_arch.recording if cross else contextlib.nullcontext
    if traced.metadata["device"] != "cuda":
        return contextlib.nullcontext, keep
    in_process = cross or has_user_kernels(traced.graph_module)

    def recording():
        return freeze_recording(in_process=in_process)

    return recording, keep


def _run_inductor(
    traced: TracedCall, target: str, user: dict, inputs, from_graph: bool, contexts: tuple
):
    """Inductor's standalone_compile of the graph on ``inputs``, then its first run.
    Returns autotune.tuning()'s report; CompilerFailed when either raises.
    ``contexts``: the two recording contexts' factories (:func:`_recording`) and the
    CPU's pinned -march, entered in that order."""
    recording, keep, pin_march = contexts
    dynamic = traced.symbolic is not None
    try:
        # the user's Inductor settings are config names (capture_options.py checks them and
        # refuses the ones pinned here): patched around the compile and the first run (its
        # autotuning reads them), as torch.compile(options=) does; standalone_compile's own
        # options= are compile_fx's keyword arguments. Patched first: what the engine sets
        # inside (the in-process compile of cross_arch, its caches off) wins over them; the
        # user's triton.autotune_at_compile_time goes in again inside (_standalone_options),
        # where standalone_compile would set its own over it.
        with (
            torch._inductor.config.patch(user),
            torch_warnings_shown(),
            torch.no_grad(),
            recording(),
            keep(),
            _reproducible_kernels(),
            pin_march,
            _torch_rng(),
            unbacked.sizes_from_zero(),
            autotune.tuning() as tuned,
            (
                dynamic_dims.compile_context(traced.graph_module)
                if dynamic
                else contextlib.nullcontext()
            ),
        ):
            if from_graph:
                unbacked.show_fake_mode(traced.graph_module)  # (compile_context does it too)
                unbacked.explicit_slice_bounds(traced.graph_module)
            with timed("compile"):
                compiled = torch._inductor.standalone_compile(
                    traced.graph_module,
                    list(inputs),
                    dynamic_shapes="from_graph" if from_graph else "from_example_inputs",
                    options=_standalone_options(
                        traced.graph_module, traced.metadata["device"], user
                    ),
                )
            with timed("first_run"):  # run once: loads every kernel and settles Triton autotuning
                compiled(
                    *sharing.run_inputs(
                        traced.example_inputs, sharing.written_inputs(traced.graph_module)
                    )
                )
    except Exception as e:
        raise CompilerFailed(
            f"Inductor failed: {type(e).__name__}: {e}\nThe compiler failed "
            "on a call it traced correctly: an upstream torch bug, not your code. Capture this "
            "target with engine='eager' (no kernels), or set `fallback = \"eager\"` in its "
            f"[tool.precompile.targets.{target}] table to fall back when this happens",
            target=target,
        ) from e
    return tuned


def _new_wrapper(before: set[int], target: str):
    """The graph's wrapper module, the one Inductor loaded last of those not in
    ``before`` (PyCodeCache's modules before the compile); CompilerFailed if none."""
    from torch._inductor.codecache import PyCodeCache

    # the graph's wrapper is the module Inductor loads last: max-autotune's subgraph
    # choices compile benchmark graphs of their own (codegen/subgraph.py) while the
    # graph is lowered, before its wrapper is generated, and where Inductor does not drop
    # them from PyCodeCache after autotuning they are there too (6 modules for an 8B
    # Llama on the H200, torch 2.11). What the wrapper runs is validated against eager.
    wrappers = [m for m in PyCodeCache.modules if id(m) not in before and hasattr(m, "call")]
    if not wrappers:  # a CompilerFailed: `fallback = "eager"` applies
        raise CompilerFailed(
            "Inductor loaded no new compiled graph for the trace (a torch bug, not your code): "
            "capture this target with engine='eager', or set `fallback = \"eager\"` in its "
            f"[tool.precompile.targets.{target}] table",
            target=target,
        )
    return wrappers[-1]


def _frozen_source(
    traced: TracedCall,
    module,
    target: str,
    options: dict,
    real: dict | None,
    cpu_isa,
    data_dependent,
):
    """The wrapper ``module``'s kernels frozen into blobs, its code rewritten to load
    them, the source half rendered with the validation's numbers in its metadata:
    ``(source_bytes, blobs, fingerprint)``."""
    with open(str(module.__file__), encoding="utf-8") as f:
        wrapper_src = f.read()
    defined = [n for n in map(_kernel_definition, ast.parse(wrapper_src).body) if n]
    kernels, blobs = _freeze_kernels(module, defined, target)
    wrapper_code = _rewrite_wrapper(wrapper_src, {k["name"] for k in kernels}, target)

    device = traced.metadata["device"]
    fingerprint = host_fingerprint(device)
    if device == "cpu":
        fingerprint["cpu_isa"] = cpu_isa
    metadata = codegen.pair_metadata(traced.metadata, "frozen", kernels)
    if device == "cuda":  # `cuda-archs`: the chosen configs compiled for the other GPUs too
        cross_arch.add_archs(metadata, fingerprint, module, blobs, options, target)
    if options.get("cuda_graphs"):
        metadata["cuda_graphs"] = True
    if data_dependent is not None:
        metadata["data_dependent"] = data_dependent
    graph_code = codegen.graph_source(traced.graph_module)
    source = codegen.render(metadata, graph_code, wrapper_code)
    # the numbers go into the metadata literal; nothing that runs depends on it
    skipped = fake_reason()  # one rank alone under the fake process group: compile-only
    with timed("validate"):
        metadata["validation"] = (
            {"skipped": skipped}
            if skipped
            else validate(source, blobs, traced, target, options, real)
        )
    source = codegen.render(metadata, graph_code, wrapper_code)
    return source.encode("utf-8"), blobs, fingerprint


def _torch_rng():
    """Random ops (dropout, rand, randn, bernoulli...) call torch's own RNG ops instead
    of Inductor's: served, they draw from torch's generator like eager (a fresh mask
    per call, the same values as eager under torch.manual_seed), and the validator
    can compare them with the graph under one seed."""
    from torch._inductor import config

    return config.patch({"fallback_random": True})


def mode_options(mode: str | None, target: str | None = None) -> dict:
    """The Inductor settings of the target's ``mode`` (``options["mode"]``):
    ``"max-autotune"`` is torch.compile's ``max-autotune-no-cudagraphs``
    (``torch._inductor.list_mode_options``: ``max_autotune``,
    ``coordinate_descent_tuning``); ``"default"`` or None: none. CUDA graphs are the
    frozen engine's own (`cuda-graphs`), combinable with either mode.

    Raises:
        CaptureError: another value (capture() refuses it before the call runs).
    """
    if mode in (None, "default"):
        return {}
    if mode not in MODES:
        raise CaptureError(
            f"options['mode'] = {mode!r}: use one of {', '.join(map(repr, MODES))}", target=target
        )
    from torch._inductor import list_mode_options

    return dict(list_mode_options(f"{mode}-no-cudagraphs"))


def _standalone_options(graph_module, device: str, user: dict) -> dict:
    """``standalone_compile``'s ``options`` (compile_fx's keyword arguments) for a capture.

    A CUDA capture compiles with ``triton.autotune_at_compile_time`` off, as
    torch.compile does, where ``standalone_compile`` turns it on (its own artifact is
    to load without autotuning): on, the wrapper's code generation stops until every
    kernel has compiled in the worker pool, then runs a tuning script that defines
    the kernels a second time (bench/results/gpu_check_h200.md). Off, the capture's
    first run autotunes, and the configs chosen there are frozen.

    It stays on (standalone_compile's) where the graph branches (``torch.cond``,
    ``while_loop``, at any depth): the first run may not launch a branch's kernels,
    and a kernel never launched keeps every config, which cannot be frozen; the
    tuning script's choices reach the wrapper's kernels through Inductor's local
    autotune cache, so with that cache off (``cuda-archs``, or the user's
    ``autotune_local_cache = False``) such a kernel is refused either way. A value
    set in ``options["inductor"]`` (``user``) wins. CPU captures are left as they are.

    Returns:
        ``{"config_patches": {...}}``, or ``{}``.
    """
    name = "triton.autotune_at_compile_time"
    if name in user:
        return {"config_patches": {name: user[name]}}
    if (
        device != "cuda"
        or not hasattr(torch._inductor.config.triton, "autotune_at_compile_time")
        or _branches(graph_module)
    ):
        return {}
    return {"config_patches": {name: False}}


def _branches(graph_module) -> bool:
    """Whether the graph, or a subgraph of it, calls ``torch.cond`` or ``while_loop``."""
    ops = {
        op
        for op in (getattr(torch.ops.higher_order, n, None) for n in ("cond", "while_loop"))
        if op is not None
    }
    return any(
        node.op == "call_function" and node.target in ops
        for gm in graph_module.modules()
        if isinstance(gm, torch.fx.GraphModule)
        for node in gm.graph.nodes
    )


def _reproducible_kernels():
    """No line tables in the C++ kernels: their DWARF names the build's Inductor cache
    path, so two builds (or users) would ship different bytes for the same kernel."""
    from torch._inductor import config

    if hasattr(config, "aot_inductor") and hasattr(config.aot_inductor, "enable_line_tables"):
        return config.patch({"aot_inductor.enable_line_tables": False})
    return contextlib.nullcontext()


# The x86-64 level pinned with -march for each Inductor vector ISA (Inductor's
# default, -march=native, lets gcc use every instruction of the build host's CPU).
_MARCH = {"avx512": "x86-64-v4", "avx2": "x86-64-v3"}
# gcc -m flags whose /proc/cpuinfo name is not the flag with '-' as '_'
_CPUINFO_NAME = {
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avx512vbmi2": "avx512_vbmi2",
}


def _cpu_target():
    """The instruction-set level the CPU kernels are compiled for, and the Inductor
    config that pins the compiler to it.

    Returns:
        ``(cpu_isa, context)``: ``cpu_isa`` is the fingerprint's requirement, space-
        separated words that ``precompile_runtime.fingerprint.isa_mismatch`` checks
        against a host's CPU flags: Inductor's vector ISA (``str(pick_vec_isa())``,
        e.g. ``avx512 avx512_vnni``), the CPU flags of the compiler flags it adds
        (``avx512_bf16``) and, on x86-64, the ``-march`` level the context pins
        (``x86-64-v4`` for AVX512). Where this torch has no ``cpp.march`` setting the
        kernels are compiled for the build host's CPU (``-march=native``): then every
        vector extension flag of this CPU is required.
    """
    from torch._inductor import config, cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    words = str(isa).split() or ["none"]
    implied = {f for w in words for f in ISA_REQUIRES.get(w.lower(), (w,))}
    for flag in (isa.build_arch_flags() if isa else "").split():
        if flag.startswith("-m") and "=" not in flag and not flag.startswith("-march"):
            name = _CPUINFO_NAME.get(flag[2:], flag[2:].replace("-", "_"))
            if name not in implied:
                words.append(name)
                implied.add(name)
    if platform.machine() not in ("x86_64", "AMD64"):
        return " ".join(words), contextlib.nullcontext()
    if not hasattr(config.cpp, "march"):  # older torch: -march=native
        words += sorted(
            f
            for f in cpu_flags() - implied
            if f.startswith(("avx", "amx", "bmi", "fma", "f16c", "sse", "vaes", "gfni"))
        )
        return " ".join(words), contextlib.nullcontext()
    level = next((_MARCH[w] for w in words if w in _MARCH), "x86-64")
    return " ".join([*words, level]), config.patch({"cpp.march": level})


def _freeze_kernels(module, names: list[str], target: str) -> tuple[list[Kernel], dict[str, bytes]]:
    """Read the binary of each kernel the wrapper defines (``names``: the targets of
    its ``async_compile.*`` assignments, now bound to loaded kernels); CPU kernels
    are stored stripped (:func:`precompile_build.engines.kernel_size.strip_kernel`)."""
    kernels: list[Kernel] = []
    blobs: dict[str, bytes] = {}
    for name in sorted(names):
        value = getattr(module, name, None)
        so_path = getattr(getattr(value, "__self__", None), "__file__", None)
        if callable(value) and isinstance(so_path, str) and so_path.endswith(".so"):
            with open(so_path, "rb") as f:
                data = strip_kernel(f.read())  # no symtab/debug info (kernel_size.py)
            digest = hashlib.sha256(data).hexdigest()
            blob = f"cpp/{digest[:32]}.so"
            blobs[blob] = data
            kernels.append({"name": name, "kind": "cpp", "file": blob, "sha256": digest})
        elif type(value).__name__ in (
            "CachingAutotuner",
            "TritonTemplateCaller",
            "StaticallyLaunchedCudaKernel",
        ) or hasattr(value, "launchers"):
            entry, files = freeze_triton_kernel(name, value, target)
            kernels.append(entry)
            blobs.update(files)
    return kernels, blobs


def _is_compiler_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        return mod.startswith(("torch._inductor", "torch._dynamo"))
    if isinstance(node, ast.Import):
        return any(
            a.name.startswith(("torch._inductor", "torch._dynamo", "triton")) for a in node.names
        )
    return False


def _kernel_definition(node: ast.stmt) -> str | None:
    """`name = async_compile.<kind>(...)` -> name."""
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Call)
    ):
        func = node.value.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "async_compile"
        ):
            return node.targets[0].id
    return None


def _rewrite_wrapper(src: str, kernel_names: set[str], target: str) -> str:
    """Inductor's wrapper module -> body of ``_make_call(_kernels)`` that needs no
    compiler: compiler imports dropped, kernel definitions bound from ``_kernels``."""
    tree = ast.parse(src)
    body: list[str] = []
    defined: set[str] = set()
    for node in tree.body:
        if _is_compiler_import(node):
            continue
        if isinstance(node, ast.Import) and [a.name for a in node.names] == ["torch"]:
            continue  # a module global of the source half already
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring (the compile-time autotuning block)
        name = _kernel_definition(node)
        if name is not None:
            if name not in kernel_names:
                raise CaptureError(
                    f"kernel {name!r} of kind {ast.unparse(node.value.func)} could not be frozen",  # type: ignore[attr-defined]
                    target=target,
                )
            body.append(f"{name} = _kernels[{name!r}]")
            defined.add(name)
            continue
        text = ast.unparse(node)
        if text.startswith(("async_compile", "del async_compile")):
            continue
        if isinstance(node, ast.FunctionDef) and node.name in _DROPPED_CALLS:
            continue
        if isinstance(node, ast.If) and "__main__" in text:
            continue
        body.append(text)
    body = [_device_independent(line) for line in body]
    shims = [s for n, s in _SHIMS.items() if n in src]
    externs = extern_calls.namespace(tree, target)
    code = "\n".join(shims + externs + body)
    plain = code.replace("torch._C._dynamo", "")
    leftovers = [
        w for w in ("torch._inductor", "torch._dynamo.", "async_compile", "triton.") if w in plain
    ]
    if leftovers:
        # the line itself says which Inductor feature wrote it (a user's option, a newer torch)
        line = next(ln.strip() for ln in plain.splitlines() if any(w in ln for w in leftovers))
        raise CaptureError(
            f"the generated wrapper still needs the compiler stack ({', '.join(leftovers)}), first at "
            f"`{line[:200]}`; the frozen engine cannot serve it. Turn off the Inductor option that "
            "generates this line, or use engine='eager'",
            target=target,
        )
    return code


_DEVICE_CALLS = re.compile(
    r"\b(torch\.cuda\._DeviceGuard|torch\.cuda\.set_device|get_raw_stream)\(\d+\)"
)


def _device_independent(code: str) -> str:
    """Inductor's wrapper names the capture's CUDA device literally (``_DeviceGuard(0)``,
    ``get_raw_stream(1)``: the rank's own GPU in a world of several); serve on the
    current device instead (the driver makes the inputs' device current), so a pair
    captured on cuda:0 runs on cuda:1, and the ranks of a world write one pair."""
    return _DEVICE_CALLS.sub(r"\1(torch.cuda.current_device())", code)
