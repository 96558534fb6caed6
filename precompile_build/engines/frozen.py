"""The `frozen` engine: Inductor-compiled kernels frozen into the pair.

Capture: trace the call (tracing.py), compile the flat graph with torch's public
precompilation API for Inductor (``torch._inductor.standalone_compile``), then take
Inductor's generated wrapper module (``call(args)``) and the kernels it loaded:

- CPU kernels are the C++ extension modules (``.so``) Inductor built; their bytes go
  into the cache, so serving never runs a C++ compiler;
- CUDA kernels are Triton kernels; their cubins and the launch configuration chosen
  by autotuning go into the cache (see _triton_launcher.py), so serving never runs
  Triton's compiler nor benchmarks configs.

The wrapper is rewritten (``_rewrite_wrapper``) so that it imports nothing from
torch._inductor / torch._dynamo: each ``async_compile.*(...)`` kernel definition
becomes ``_kernels["name"]``. Before the pair is written, the rewritten wrapper is
run on the example inputs with the frozen kernels and compared with the graph; a
pair that computes something else is never written.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import os

from precompile_runtime.envelope import Envelope, dumps

from ..errors import CaptureError, CompilerFailed, torch_warnings_shown, warn_at_caller
from . import codegen, cross_arch, dynamic_dims
from .tracing import TracedCall, example_clone, run_real_call, trace_call

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


def capture_pair(fn, args, kwargs, *, target: str, device: str, options: dict,
                 real_call=None) -> tuple[bytes, bytes]:
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
    traced = trace_call(fn, args, kwargs, target=target, tracer=options.get("tracer"))
    device = traced.metadata["device"]
    if options.get("cuda_graphs") and (device != "cuda" or traced.metadata["grad_param_indices"]):
        raise CaptureError(
            f"target {target!r}: cuda-graphs = true needs a CUDA inference target; this "
            f"one {'runs a backward' if device == 'cuda' else 'was captured on ' + device}: "
            "drop the option")
    real = run_real_call(traced, real_call) if real_call is not None else None
    try:
        source, blobs, fingerprint = _compile(traced, target, options, real)
    except CompilerFailed as e:
        # `fallback = "eager"` (capture_api) serves this trace with the eager engine,
        # judged by this real call: the call has run and must not run again
        e.traced, e.real = traced, real
        raise
    code_hash = hashlib.sha256(source).hexdigest()
    env = Envelope(
        engine="frozen", code_hash=code_hash, fingerprint=fingerprint,
        meta={"target": target, "kernels": len(blobs)}, blobs=blobs,
    )
    return source, dumps(env)


def _compile(traced: TracedCall, target: str, options: dict, real: dict | None = None):
    import torch
    from torch._inductor.codecache import PyCodeCache

    from precompile_runtime.fingerprint import host_fingerprint

    before = {id(m) for m in PyCodeCache.modules}
    if traced.metadata["device"] == "cuda":
        from ._triton_freeze import recording  # records cubins + launch code per kernel
    else:
        recording = contextlib.nullcontext
    # `cuda-archs`: keep what compiling the kernels again for other GPUs needs
    keep = (cross_arch.recording if traced.metadata["device"] == "cuda"
            and cross_arch.requested(options, target) else contextlib.nullcontext)
    # dynamic dims: compile against the trace's ShapeEnv and fake inputs, so that
    # Inductor compiles for exactly the marked symbols (real inputs would be
    # refakeified with every dim a new symbol)
    dynamic = traced.symbolic is not None
    on_cpu = traced.metadata["device"] == "cpu"
    cpu_isa, pin_march = _cpu_target() if on_cpu else (None, contextlib.nullcontext())
    try:
        with torch_warnings_shown(), torch.no_grad(), recording(), keep(), _reproducible_kernels(), pin_march, \
                _torch_rng(), (dynamic_dims.compile_context(traced.graph_module) if dynamic
                               else contextlib.nullcontext()):
            compiled = torch._inductor.standalone_compile(
                traced.graph_module, list(traced.symbolic.inputs if dynamic else traced.example_inputs),
                dynamic_shapes="from_graph" if dynamic else "from_example_inputs",
                options=options.get("inductor") or None,
            )
            # run once: loads every kernel and settles Triton autotuning
            compiled(*[example_clone(t) for t in traced.example_inputs])
    except Exception as e:
        raise CompilerFailed(
            f"target {target!r}: Inductor failed: {type(e).__name__}: {e}\nThe compiler failed "
            "on a call it traced correctly: an upstream torch bug, not your code. Capture this "
            "target with engine='eager' (no kernels), or set `fallback = \"eager\"` in its "
            f"[tool.precompile.targets.{target}] table to fall back when this happens"
        ) from e
    traced.finish_dynamic(target)  # after the compile: Inductor's guards count too
    wrappers = [m for m in PyCodeCache.modules if id(m) not in before and hasattr(m, "call")]
    if len(wrappers) != 1:
        raise CaptureError(
            f"target {target!r}: expected one compiled graph, Inductor produced "
            f"{len(wrappers)}; the frozen engine supports a single graph per target"
        )
    module = wrappers[0]
    with open(module.__file__, encoding="utf-8") as f:
        wrapper_src = f.read()
    defined = [n for n in map(_kernel_definition, ast.parse(wrapper_src).body) if n]
    kernels, blobs = _freeze_kernels(module, defined, target)
    wrapper_code = _rewrite_wrapper(wrapper_src, {k["name"] for k in kernels}, target)

    device = traced.metadata["device"]
    fingerprint = host_fingerprint(device)
    if device == "cpu":
        fingerprint["cpu_isa"] = cpu_isa
    metadata = dict(traced.metadata, engine="frozen", kernels=kernels)
    if device == "cuda":  # `cuda-archs`: the chosen configs compiled for the other GPUs too
        cross_arch.add_archs(metadata, fingerprint, module, blobs, options, target)
    if options.get("cuda_graphs"):
        metadata["cuda_graphs"] = True
    graph_code = codegen.graph_source(traced.graph_module)
    source = codegen.render(metadata, graph_code, wrapper_code)
    # the numbers go into the metadata literal; nothing that runs depends on it
    metadata["validation"] = _validate(source, blobs, traced, target, options, real)
    source = codegen.render(metadata, graph_code, wrapper_code)
    return source.encode("utf-8"), blobs, fingerprint


def _torch_rng():
    """Random ops (dropout, rand, randn, bernoulli...) call torch's own RNG ops instead
    of Inductor's: served, they draw from torch's generator like eager (a fresh mask
    per call, the same values as eager under torch.manual_seed), and the validator
    can compare them with the graph under one seed."""
    from torch._inductor import config

    return config.patch({"fallback_random": True})


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
_CPUINFO_NAME = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
                 "avx512fp16": "avx512_fp16", "avx512vbmi2": "avx512_vbmi2"}


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
    import platform

    from precompile_runtime.fingerprint import ISA_REQUIRES, cpu_flags
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
        words += sorted(f for f in cpu_flags() - implied
                        if f.startswith(("avx", "amx", "bmi", "fma", "f16c", "sse", "vaes", "gfni")))
        return " ".join(words), contextlib.nullcontext()
    level = next((_MARCH[w] for w in words if w in _MARCH), "x86-64")
    return " ".join([*words, level]), config.patch({"cpp.march": level})


def _freeze_kernels(module, names: list[str], target: str) -> tuple[list[dict], dict[str, bytes]]:
    """Read the binary of each kernel the wrapper defines (``names``: the targets of
    its ``async_compile.*`` assignments, now bound to loaded kernels); CPU kernels
    are stored stripped (:func:`precompile_build.kernel_size.strip_kernel`)."""
    from ..kernel_size import strip_kernel

    kernels, blobs = [], {}
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
        elif type(value).__name__ in ("CachingAutotuner", "TritonTemplateCaller", "StaticallyLaunchedCudaKernel") \
                or hasattr(value, "launchers"):
            from ._triton_freeze import freeze_triton_kernel

            entry, files = freeze_triton_kernel(name, value, target)
            kernels.append(entry)
            blobs.update(files)
    return kernels, blobs


def _is_compiler_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        return mod.startswith(("torch._inductor", "torch._dynamo"))
    if isinstance(node, ast.Import):
        return any(a.name.startswith(("torch._inductor", "torch._dynamo", "triton")) for a in node.names)
    return False


def _kernel_definition(node: ast.stmt) -> str | None:
    """`name = async_compile.<kind>(...)` -> name."""
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
        func = node.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id == "async_compile":
            return node.targets[0].id
    return None


def _extern_kernel_bindings(tree: ast.Module, target: str) -> list[str]:
    """`extern_kernels.X` resolved to `torch.X` (checked to be the same function)."""
    import torch
    from torch._inductor.select_algorithm import extern_kernels

    used = sorted({n.attr for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                   and n.value.id == "extern_kernels"})
    lines = []
    for attr in used:
        impl = getattr(extern_kernels, attr, None)
        if impl is not None and getattr(torch, attr, None) is impl:
            lines.append(f"    {attr} = torch.{attr}")
        else:
            raise CaptureError(
                f"target {target!r}: Inductor chose the extern kernel {attr!r}, which the "
                "frozen engine cannot bind without the compiler stack; capture with "
                "engine='eager' or report this kernel"
            )
    return ["class extern_kernels:  # Inductor's extern kernels are torch functions", *lines] if lines else []


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
                    f"target {target!r}: kernel {name!r} of kind "
                    f"{ast.unparse(node.value.func)} could not be frozen"
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
    externs = _extern_kernel_bindings(tree, target)
    code = "\n".join(shims + externs + body)
    leftovers = [w for w in ("torch._inductor", "torch._dynamo.", "async_compile", "triton.")
                 if w in code.replace("torch._C._dynamo", "")]
    if leftovers:
        raise CaptureError(
            f"target {target!r}: the generated wrapper still needs the compiler stack "
            f"({', '.join(leftovers)}); the frozen engine cannot serve it. Use engine='eager'"
        )
    return code


_DEVICE_CALLS = ("torch.cuda._DeviceGuard(0)", "torch.cuda.set_device(0)", "get_raw_stream(0)")


def _device_independent(code: str) -> str:
    """Inductor's wrapper names CUDA device 0 literally; serve on the current device
    (the driver makes the inputs' device current), so a pair captured on cuda:0 runs
    on cuda:1."""
    for call in _DEVICE_CALLS:
        code = code.replace(call, call[: -len("(0)")] + "(torch.cuda.current_device())")
    return code


def _validate(source: str, blobs: dict[str, bytes], traced: TracedCall, target: str,
              options: dict, real: dict | None = None) -> dict:
    """Run the source with its frozen kernels and judge it against an fp64 reference of
    the traced graph (numerics.py), on the example inputs and, for dynamic dims, at
    other sizes (dynamic_dims.example_sizes); on the example inputs also against the
    eager call's own results ``real`` (:func:`.tracing.run_real_call`).

    Returns:
        the numbers for ``PRECOMPILE_METADATA["validation"]``.
    Raises:
        CaptureError: a value is refused; the message gives the numbers.
    """
    import tempfile

    from . import numerics

    problem = numerics.option_problem(options, "validation_multiple")
    if problem:
        raise CaptureError(f"target {target!r}: {problem}")
    cases = [("the example inputs", traced.example_inputs)]
    dynamic = traced.metadata.get("dynamic")
    if dynamic:
        n_params = len(traced.metadata["params"])
        params, user = traced.example_inputs[:n_params], traced.example_inputs[n_params:]
        specs = traced.metadata["tensor_inputs"]
        for sizes in dynamic_dims.example_sizes(dynamic, specs, user):
            inputs = (params + [dynamic_dims.resized(t, s, sizes) for t, s in zip(user, specs)]
                      + user[len(specs):])  # the trace-made constants (graph_attrs.py)
            cases.append(("sizes " + dynamic_dims.describe(sizes, specs, traced.symbolic.paths), inputs))
    report: dict = {"rule": "frozen_error <= multiple * eager_error + floor (relative RMS vs the reference)",
                    "cases": []}
    with tempfile.TemporaryDirectory(prefix="precompile-validate-") as kdir:
        for name, data in blobs.items():
            path = os.path.join(kdir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        namespace: dict = {"__name__": f"precompile_validate_{target}"}
        exec(compile(source, f"<{target}.py>", "exec"), namespace)
        call = namespace["_make_call"](namespace["_load_kernels"](kdir))
        for what, inputs in cases:
            case = _compare(call, traced, inputs, what, target, options,
                            real if inputs is traced.example_inputs else None)
            for key in ("reference", "fallback_ops"):
                report[key] = case.pop(key)
            if "eager_call" in case:
                report["eager_call"] = case.pop("eager_call")
            report["cases"].append(case)
    return report


# what to change when the pair fails at other sizes than the example's
_OTHER_SIZES = ("the compiled code does not hold at these sizes inside the declared ranges: "
                "narrow the marks (min=, max=) to exclude them, or capture with engine='eager'")
_MAX_SUGGESTED = 100  # a larger multiple than this is never rounding: not offered
_NUMERIC_FIX = ("if this is rounding you accept (a deep bf16/fp16 model), allow a larger multiple "
                "with options={{'validation_multiple': {m:g}}}; else capture with engine='eager' "
                "(the graph, no kernels) or engine='torch', and report the kernel")


_SEED = 20240607  # any fixed seed: both sides of a comparison start from it


def _labels(traced: TracedCall, n_values: int) -> list[str]:
    """What each compared value is: outputs, gradients, then the flat inputs."""
    meta = traced.metadata
    names, n_user = meta["param_names"], meta["num_user_outputs"]
    labels = [f"output {i}" for i in range(n_user)]
    labels += [f"gradient of {names[i]}" for i in meta["grad_param_indices"]]
    labels += [f"parameter/buffer {n} after the call" for n in names]
    labels += [f"tensor argument {i} after the call" for i in range(n_values - len(labels))]
    return labels


def _compare(call, traced: TracedCall, inputs: list, what: str, target: str,
             options: dict, real: dict | None = None) -> dict:
    """Run the graph (own dtypes and fp64 reference) and the frozen wrapper on clones of
    ``inputs`` (described by ``what``); judge outputs, gradients and inputs written in
    place (numerics.judge); on the example inputs also the eager call's results
    ``real``. Returns this case's numbers; raises CaptureError on a refusal."""
    import math

    import torch

    from . import numerics

    example = inputs is traced.example_inputs
    fix = ("this torch's Inductor output needs something the frozen engine does not "
           "provide. Use engine='eager' (or 'torch')") if example else _OTHER_SIZES
    a = [example_clone(t) for t in inputs]
    b = [example_clone(t) for t in inputs]
    cuda = sorted({t.device.index or 0 for t in inputs if t.device.type == "cuda"})
    # both runs draw from one RNG state (random ops), the caller's state is kept
    with torch.no_grad(), torch.random.fork_rng(devices=cuda):
        torch.manual_seed(_SEED)
        try:
            want = traced.graph_module(*a)
        except Exception as e:  # only at sizes other than the example's
            raise CaptureError(
                f"target {target!r}: the captured function itself fails at {what} "
                f"({type(e).__name__}: {e}); declare ranges that exclude these sizes (min=, max=)"
            ) from e
        torch.manual_seed(_SEED)
        try:
            got = call(list(b))
        except Exception as e:
            raise CaptureError(
                f"target {target!r}: the frozen wrapper failed on {what} "
                f"({type(e).__name__}: {e}); {fix}"
            ) from e
        if len(want) != len(got):
            raise CaptureError(
                f"target {target!r}: the frozen wrapper returns {len(got)} outputs, the graph "
                f"{len(want)}; refusing to write a pair that computes something else"
            )
        ref_out, ref_in, info = _reference(traced, inputs, target, what)
    mutated = set(traced.metadata["mutated_inputs"])
    values = list(zip(want, got, ref_out)) + list(zip(a, b, ref_in))
    labels = _labels(traced, len(values))
    ref_name = info["reference"] + (f" (ops without {info['reference']} kernels: "
                                    f"{', '.join(info['fallback_ops'])})" if info["fallback_ops"] else "")
    multiple = options.get("validation_multiple")
    worst, verdicts = None, []
    for i, (w, g, r) in enumerate(values):
        if i >= len(want) and i - len(want) not in mutated and torch.equal(w, inputs[i - len(want)]):
            # an input the graph leaves alone (one it writes through an op without an
            # alias annotation, e.g. native_batch_norm's running stats, is judged below)
            if not torch.equal(w, g):
                raise CaptureError(
                    f"target {target!r}: the frozen kernels wrote to {labels[i]}, which the traced "
                    f"graph leaves alone, on {what}; refusing to write a pair that computes "
                    f"something else; {fix}")
            verdicts.append(None)
            continue
        v = numerics.judge(w, g, r)
        if multiple is not None and v.problem and v.problem.startswith("error beyond"):
            v.multiple = float(multiple)
            v.problem = None if v.frozen_error <= v.allowed else v.problem
        verdicts.append(v)
        if v.problem:
            numbers = v.describe().format(ref=ref_name) if math.isfinite(v.frozen_error) else ""
            need = _suggest(v)
            if not math.isfinite(need):
                suggestion = fix
            elif need <= _MAX_SUGGESTED:
                suggestion = _NUMERIC_FIX.format(m=need)
            else:
                suggestion = (f"that is {v.frozen_error / max(v.eager_error, 1e-300):.3g} x eager's error, far "
                              "past rounding: the compiled code computes something else. Capture with "
                              "engine='eager' (the graph, no kernels) or engine='torch', and report the kernel")
            raise CaptureError(
                f"target {target!r}: the frozen kernels' value {i} ({labels[i]}) differs from the "
                f"traced graph on {what}; {v.problem}" + (f": {numbers}" if numbers else "")
                + "; refusing to write a pair that computes something else"
                + ("" if example else f"; {_OTHER_SIZES}") + ("" if not example else f"; {suggestion}"))
        if worst is None or v.ratio > verdicts[worst].ratio:
            worst = i
    case: dict = {"case": what, "values": sum(v is not None for v in verdicts), **info}
    if worst is not None:
        case["worst"] = {"value": labels[worst], **verdicts[worst].numbers()}
    if real is not None:
        case["eager_call"] = _against_eager_call(real, got, b, ref_out, ref_in, verdicts, labels,
                                                 len(want), traced, target, options)
    return case


def _reference(traced: TracedCall, inputs: list, target: str, what: str):
    """numerics.reference_run in fp64, else fp32 (an op the interpreter cannot widen,
    e.g. a user kernel that takes a dict of tensors); CaptureError if neither runs."""
    import torch

    from . import numerics

    errors = []
    for dtype in (None, torch.float32):
        try:
            return numerics.reference_run(traced.graph_module, inputs, traced.metadata["device"], dtype)
        except Exception as e:  # the graph ran in its own dtypes: the widening broke it
            errors.append(f"{type(e).__name__}: {e}")
    raise CaptureError(
        f"target {target!r}: the traced graph does not run in a wider dtype on {what} "
        f"(fp64: {errors[0][:300]}; fp32: {errors[1][:300]}), so the frozen kernels cannot be "
        "judged against a reference; capture with engine='eager' and report the op")


def _suggest(v) -> float:
    """A multiple that would accept ``v`` (rounded up to a readable number)."""
    import math

    need = (v.frozen_error - v.floor) / v.eager_error if v.eager_error > 0 else math.inf
    if not math.isfinite(need):
        return float("inf")
    return float(f"{need * 1.25:.2g}")


def _against_eager_call(real: dict, got, b, ref_out, ref_in, verdicts, labels, n_out: int,
                        traced: TracedCall, target: str, options: dict) -> dict:
    """Issue 18: the frozen results vs the eager call's own results on the example
    inputs. Within the allowed difference: ok; up to numerics.EAGER_WARN_BAND times
    it: a warning; beyond: CaptureError (``options['eager_check']``: ``'warn'`` only
    warns, ``'off'`` skips). Returns the numbers."""
    import math

    from . import numerics

    mode = numerics.eager_check_mode(options, target)
    if mode == "off":
        return {"outcome": "off"}
    skipped = numerics.eager_check_skipped(traced.graph_module, real)
    if skipped:
        return {"outcome": f"skipped: {skipped}"}
    if real.get("structure"):
        numerics.warn_or_refuse(numerics.eager_structure_message(target, real["structure"]), mode)
        return {"outcome": "warned", "structure": real["structure"]}
    pairs = [(i, real["outputs"][i], got[i], ref_out[i]) for i in range(min(n_out, len(real["outputs"])))
             if real["outputs"][i] is not None]
    pairs += [(n_out + i, t, b[i], ref_in[i]) for i, t in real["inputs"].items()
              if verdicts[n_out + i] is not None]
    worst = None
    for i, r, g, ref in pairs:
        v = verdicts[i]
        if v is None:
            continue
        diff, allowed, max_abs, close = numerics.judge_against_eager_call(r, g, ref, v)
        ratio = diff / allowed if allowed > 0 else (0.0 if diff == 0 else math.inf)
        if close:  # every element within ELEMENTWISE_TOL of the eager call's: accepted
            ratio = min(ratio, 1.0)
        if worst is None or ratio > worst[0]:
            worst = (ratio, i, diff, allowed, max_abs, v, close)
    if worst is None:
        return {"outcome": "ok", "values": 0}
    ratio, i, diff, allowed, max_abs, v, close = worst
    numbers = {"value": labels[i], "difference": numerics.sig(diff) if math.isfinite(diff) else "inf",
               "allowed": numerics.sig(allowed), "max_abs_diff": numerics.sig(max_abs) if math.isfinite(max_abs) else "inf",
               "max_abs_value": numerics.sig(v.scale), "values": len(pairs)}
    if close and diff > allowed:  # accepted elementwise, not by the RMS: say so
        numbers["elementwise_close"] = numerics.ELEMENTWISE_TOL
    if ratio <= 1:
        return {"outcome": "ok", **numbers}
    text = (f"target {target!r}: the frozen result's value {i} ({labels[i]}) differs from what "
            f"the eager call returned at capture: relative RMS difference {diff:.3g} (allowed "
            f"{allowed:.3g}, {ratio:.3g} x that), max |frozen - eager call| {max_abs:.3g} at values "
            f"up to {v.scale:.3g}. The traced graph does not compute what eager computed: eager "
            "took another code path than the trace (a branch on values skipped under "
            "torch.compiler.is_compiling(): use torch.where / torch.cond for a real choice; an "
            "inference fast path: nn.TransformerEncoder's zero-fills padded rows, turn it off "
            "with torch.backends.mha.set_fastpath_enabled(False)), or the function depends on "
            "state the capture does not see")
    if ratio <= numerics.EAGER_WARN_BAND or mode == "warn":
        warn_at_caller(text + "; written anyway (options={'eager_check': 'refuse'} refuses)"
                       if mode == "warn" else text + "; written anyway (within "
                       f"{numerics.EAGER_WARN_BAND:g} x the allowed difference; "
                       "options={'eager_check': 'off'} skips this check)")
        return {"outcome": "warned", **numbers}
    raise CaptureError(text + "; refusing to write the pair. Make eager and the trace take one "
                       "path, or pass options={'eager_check': 'warn'} to keep the graph's result")
