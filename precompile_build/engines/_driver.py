# ---- driver: the calling convention of the captured function ----------------------
# This block is copied verbatim into every source half written by the `frozen` and
# `eager` engines (precompile_build/engines/codegen.py). It needs only torch and the
# stdlib, and reads the literals PRECOMPILE_METADATA, _graph and (frozen) _make_call
# defined in the same file.
import importlib as _importlib
import math as _math
import os as _os
from contextlib import nullcontext as _nullcontext

try:  # the runtime's error type where it is installed; the file stays self-contained
    from precompile_runtime.errors import CallError
except ImportError:  # pragma: no cover - runs without precompile-runtime too

    class CallError(ValueError):
        """A call does not match what was captured."""


_META = PRECOMPILE_METADATA


def _decode_constants(specs):
    """The tensor constants the trace made (graph_attrs.constant_specs), passed after
    the inputs on every call."""
    import base64

    out = []
    for s in specs:
        dtype = getattr(torch, s["dtype"].rpartition(".")[2])
        data = bytearray(base64.b64decode(s["data"]))
        t = torch.frombuffer(data, dtype=dtype).reshape(s["shape"]) if data else torch.empty(s["shape"], dtype=dtype)
        out.append(t if s["device_type"] == "cpu" else t.to(s["device_type"]))
    return out


_CONSTS = _decode_constants(_META["constants"]) if _META.get("constants") else []
_REASSIGNED = _META.get("reassigned_buffers") or ()  # buffers the call reassigns, by lifted index
_DIST = _META.get("collectives")  # {"world_size", "groups": {name: ranks}} (collectives.py)
_DIST_WORLD = []  # the WORLD group whose groups are registered under the pair's names


def _check_dist():
    """The world size the pair was captured for, and its groups found by ranks in this
    process and registered under the names the captured code uses. Raises CallError."""
    import torch.distributed as dist

    want = _DIST["world_size"]
    got = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if got != want:
        raise CallError(
            f"target {_META['target']!r}: the captured function runs collectives over a world of "
            f"{want} process(es); this process is in " + ("no process group" if got is None else f"a world of {got}")
            + f". Serve it with {want} processes (torchrun --nproc_per_node {want} and "
            "dist.init_process_group), or capture again in this world"
        )
    world = dist.group.WORLD
    if _DIST_WORLD and _DIST_WORLD[0] is world:
        return
    from torch._C import _distributed_c10d as _C
    from torch.distributed import distributed_c10d as c10d

    known = list(c10d._world.pg_group_ranks.items())
    for name, ranks in _DIST["groups"].items():
        pg = next((g for g, m in known if sorted(m, key=m.get) == ranks), None)
        if pg is None:
            raise CallError(
                f"target {_META['target']!r}: the captured function runs a collective over the "
                f"ranks {ranks}, and this process has no group of these ranks; create it on every "
                f"rank before the call: dist.new_group(ranks={ranks})"
            )
        try:
            _C._unregister_process_group(name)
        except Exception:
            pass
        _C._register_process_group(name, pg)
    _DIST_WORLD[:] = [world]


def _module_tensors(modules):
    """Parameters then buffers of each module, tied tensors collapsed by identity,
    in the order the capture lifted them: returns (names, tensors)."""
    seen, names, tensors = set(), [], []
    for i, mod in enumerate(modules):
        for kind in (mod.named_parameters, mod.named_buffers):
            for name, t in kind(remove_duplicate=False):
                if id(t) in seen or t is None:
                    continue
                seen.add(id(t))
                names.append(f"m{i}.{name}")
                tensors.append(t)
    return names, tensors


def _layout_hint(want, shape):
    """What to pass to get the captured strides ``want`` for ``shape``."""
    step, contiguous = 1, []
    for n in reversed(list(shape)):
        contiguous.insert(0, step)
        step *= n
    if all(w == c or n == 1 for w, c, n in zip(want, contiguous, shape)):
        return "pass .contiguous()"
    return "pass a tensor with the captured memory layout, e.g. made as the capture's example was"


def _same_strides(t, want):
    """Strides equal but on dims of size 1, never stepped along (as Inductor's own
    assert_size_stride); a size-1 dim's stride is arbitrary in torch."""
    return all(g == w or n == 1 for g, w, n in zip(t.stride(), want, t.shape))


def _check_tensor(t, spec, what, check_shape=True):
    if not isinstance(t, torch.Tensor):
        raise CallError(f"target {_META['target']!r}, {what}: expected a tensor, got {type(t).__name__}")
    problems = []
    if str(t.dtype) != spec["dtype"]:
        problems.append(f"dtype {t.dtype} (captured {spec['dtype']})")
    if t.device.type != spec["device_type"]:
        problems.append(f"device {t.device} (captured {spec['device_type']})")
    # (with dynamic dims, _check_dynamic checks shape and stride)
    if check_shape and list(t.shape) != spec["shape"]:
        problems.append(f"shape {list(t.shape)} (captured {spec['shape']})")
    elif check_shape and _META["engine"] == "frozen" and not _same_strides(t, spec["stride"]):
        problems.append(f"stride {list(t.stride())} (captured {spec['stride']}; {_layout_hint(spec['stride'], t.shape)})")
    if problems:
        raise CallError(
            f"target {_META['target']!r}, {what}: " + "; ".join(problems)
            + ". Dtypes, devices and shapes (but for dims marked dynamic) are fixed at capture: "
            "pass what was captured, or capture again with these (torch._dynamo.mark_dynamic "
            "lets a dim vary)"
        )


# ---- dynamic dims: symbols bound from the call's sizes, then ranges and guards ----
_DYN = _META.get("dynamic")
_EVAL_SCOPE = {"__builtins__": {}, "math": _math, "torch": torch, "max": max, "min": min, "abs": abs}
_CODE = {}  # expression text -> code object


def _eval(expr, sizes):
    if isinstance(expr, int):
        return expr
    code = _CODE.get(expr)
    if code is None:
        code = _CODE[expr] = compile(expr, "<shape expression>", "eval")
    return eval(code, _EVAL_SCOPE, sizes)


def _fmt_dim(name):
    lo, hi = _DYN["symbols"][name]
    return f"{name} in [{lo}, {'inf' if hi is None else hi}]"


def _check_dynamic(leaves):
    """Check the user tensors ``leaves`` ([(tensor, path)]) of a capture with dynamic
    dims: dtype/device, static dims exact, marked dims bound to their symbols (a
    symbol seen twice must have one size), then ranges, the capture's guards and,
    for frozen kernels, the strides at these sizes. Raises CallError."""
    sizes, where = {}, {}
    for (t, path), spec in zip(leaves, _META["tensor_inputs"]):
        _check_tensor(t, spec, path, check_shape=False)
        shape = spec["shape"]
        bad = t.dim() != len(shape) or any(
            not isinstance(w, str) and g != w for g, w in zip(t.shape, shape))
        for d, (g, w) in enumerate(zip(t.shape, shape)):
            if bad or not isinstance(w, str):
                continue
            if w in sizes and sizes[w] != g:
                raise CallError(
                    f"target {_META['target']!r}, {path} dim {d}: size {g}, but {where[w]} has "
                    f"size {sizes[w]} and the capture requires them equal"
                )
            sizes[w] = g
            where.setdefault(w, f"{path} dim {d}")
        if bad:
            captured = [w if not isinstance(w, str) else _fmt_dim(w) for w in shape]
            raise CallError(
                f"target {_META['target']!r}, {path}: shape {list(t.shape)} (captured {captured}). "
                "Only the dims marked dynamic at capture may change size: pass what was "
                "captured, or capture again with these dims marked"
            )
    for name, n in sizes.items():  # in argument order
        lo, hi = _DYN["symbols"][name]
        if n < lo or (hi is not None and n > hi):
            raise CallError(
                f"target {_META['target']!r}, {where[name]}: size {n} is outside the range "
                f"[{lo}, {'inf' if hi is None else hi}] it was captured for; pass a size in "
                "range, or capture again with a wider mark_dynamic(..., min=, max=)"
            )
    for guard in _DYN["guards"]:
        if not _eval(guard, sizes):
            named = ", ".join(f"{s} = {n} ({where[s]})" for s, n in sizes.items())
            raise CallError(
                f"target {_META['target']!r}: the sizes {named} break the condition "
                f"{guard!r} that the captured code relies on; pass sizes that satisfy it"
            )
    if _META["engine"] == "frozen":
        for (t, path), spec in zip(leaves, _META["tensor_inputs"]):
            want = [_eval(e, sizes) for e in spec["stride"]]
            if not _same_strides(t, want):
                raise CallError(
                    f"target {_META['target']!r}, {path}: stride {list(t.stride())} (the captured "
                    f"layout at these sizes is {want}; {_layout_hint(want, t.shape)})"
                )


def _check_no_aliases(flat, names):
    """The compiled code writes to the inputs at _META["mutated_inputs"] and reads the
    others as separate memory: an input written to must share memory with no other."""
    ptrs = [t.untyped_storage().data_ptr() if t.numel() else None for t in flat]
    for i in _META["mutated_inputs"]:
        for j, ptr in enumerate(ptrs):
            if j != i and ptr is not None and ptr == ptrs[i]:
                raise CallError(
                    f"target {_META['target']!r}: {names[i]} shares memory with {names[j]}, "
                    "and the captured function writes to it; pass separate tensors (.clone())"
                )


def _flatten(spec, value, modules, tensors, path):
    """Walk `value` along the captured input structure `spec`, collecting modules and
    tensor leaves; constants must equal what was captured."""
    kind = spec[0]
    if kind == "module":
        if not isinstance(value, torch.nn.Module):
            raise CallError(f"target {_META['target']!r}, {path}: expected an nn.Module, got {type(value).__name__}")
        modules.append(value)
    elif kind == "tensor":
        tensors.append((value, path))
    elif kind == "const":
        if value != spec[1] or type(value) is not type(spec[1]):
            raise CallError(
                f"target {_META['target']!r}, {path}: the capture specialised on "
                f"{spec[1]!r}, got {value!r}; capture again with this value"
            )
    elif kind in ("tuple", "list"):
        if not isinstance(value, (tuple, list)) or len(value) != len(spec[1]):
            raise CallError(f"target {_META['target']!r}, {path}: expected a {kind} of {len(spec[1])} items")
        for i, (s, v) in enumerate(zip(spec[1], value)):
            _flatten(s, v, modules, tensors, f"{path}[{i}]")
    elif kind == "dict":
        if not isinstance(value, dict) or sorted(value) != sorted(k for k, _ in spec[1]):
            raise CallError(f"target {_META['target']!r}, {path}: expected a dict with keys {[k for k, _ in spec[1]]}")
        for k, s in spec[1]:
            _flatten(s, value[k], modules, tensors, f"{path}[{k!r}]")
    else:  # pragma: no cover - written by our own codegen
        raise CallError(f"{path}: unknown input kind {kind!r}")


def _import_type(qualname):
    module, _, name = qualname.partition(":")
    obj = _importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuild(spec, outs):
    kind = spec[0]
    if kind == "tensor":
        return outs[spec[1]]
    if kind == "const":
        return spec[1]
    if kind == "tuple":
        return tuple(_rebuild(s, outs) for s in spec[1])
    if kind == "list":
        return [_rebuild(s, outs) for s in spec[1]]
    if kind == "dict":
        return {k: _rebuild(s, outs) for k, s in spec[1]}
    if kind == "namedtuple":
        return _import_type(spec[1])(*(_rebuild(s, outs) for s in spec[2]))
    if kind == "dataclass":
        return _import_type(spec[1])(**{k: _rebuild(s, outs) for k, s in spec[2]})
    raise CallError(f"unknown output kind {kind!r}")  # pragma: no cover


# The full check of a model's parameters (names, dtype, device, shape, stride) walks
# named_parameters() and costs microseconds per tensor on every call. A model seen
# before is checked the short way: the same tensor objects (held weakly), each still
# of the captured dtype, device, shape and stride.
_SEEN = {}  # tuple of module ids -> [weakref of each lifted tensor]
_SIGS = [(s["dtype"], s["device_type"], tuple(s["shape"]), tuple(s["stride"])) for s in _META["params"]]


def _submodules(mod):
    subs, stack = [], [mod]
    while stack:  # pre-order, as named_modules() walks
        m = stack.pop()
        subs.append(m)
        stack.extend(c for c in reversed(list(m._modules.values())) if c is not None)
    return subs


def _check_training(subs):
    """Dropout and batch norm were traced in the captured train/eval mode
    (``subs``: each model argument's _submodules)."""
    for i, (mods, want) in enumerate(zip(subs, _META.get("training", []))):
        got = [m.training for m in mods]
        if got != want:
            if all(want):
                fix = "call model.train()"
            elif not any(want):
                fix = "call model.eval()"
            else:
                fix = "put each submodule back in its train/eval mode of the capture"
            raise CallError(
                f"target {_META['target']!r}: model argument {i} is not in the train/eval "
                f"mode it was captured in (dropout and batch norm trace differently); "
                f"{fix}, or capture again in this mode"
            )


def _lifted(subs_per_module):
    """The lifted tensors in _module_tensors' order, without names."""
    seen, out = set(), []
    for subs in subs_per_module:
        for attr in ("_parameters", "_buffers"):
            for m in subs:
                for t in getattr(m, attr).values():
                    if t is not None and id(t) not in seen:
                        seen.add(id(t))
                        out.append(t)
    return out


def _known_params(modules, subs):
    refs = _SEEN.get(tuple(map(id, modules)))
    if refs is None:
        return None
    params = _lifted(subs)
    if len(params) != len(refs):
        return None
    for t, r, (dtype, device, shape, stride) in zip(params, refs, _SIGS):
        if (r() is not t or str(t.dtype) != dtype or t.device.type != device
                or t.shape != shape or t.stride() != stride):
            return None
    return params


def _remember_params(modules, params):
    import weakref

    if len(_SEEN) > 16:
        _SEEN.clear()
    _SEEN[tuple(map(id, modules))] = [weakref.ref(t) for t in params]


class CompiledArtifact:
    """The loaded artifact: call it exactly like the captured function.

    Parameters and buffers of nn.Module arguments are read from the modules passed
    at call time (no weights are stored); parameter gradients computed by a captured
    backward are accumulated onto ``.grad`` like eager; buffers mutated by the call
    (BatchNorm statistics, counters) are updated in place. Returned tensors carry no
    autograd history.
    """

    def __init__(self, run, uses_kernels):
        self._run = run
        self.uses_kernels = uses_kernels
        self.metadata = _META

    def __call__(self, *args, **kwargs):
        modules, leaves = [], []
        if _DIST:
            _check_dist()
        arg_spec, kw_spec = _META["inputs"][1]
        kw_names = sorted(k for k, _ in kw_spec[1])
        if len(args) != len(arg_spec[1]) or sorted(kwargs) != kw_names:
            raise CallError(
                f"target {_META['target']!r}: called with {len(args)} positional argument(s) "
                f"and keyword(s) {sorted(kwargs)}; the capture was called with "
                f"{len(arg_spec[1])} positional argument(s) and keyword(s) {kw_names}: call it "
                "the same way"
            )
        names = _META.get("arg_names") or []
        for i, (s, v) in enumerate(zip(arg_spec[1], args)):
            _flatten(s, v, modules, leaves, f"argument {names[i]!r}" if names else f"args[{i}]")
        for k, s in kw_spec[1]:
            _flatten(s, kwargs[k], modules, leaves, f"keyword argument {k!r}")
        subs = [_submodules(m) for m in modules]  # one walk serves both checks below
        params = _known_params(modules, subs)
        if params is None:  # a model not seen before, or changed: the full check
            names, params = _module_tensors(modules)
            if names != _META["param_names"]:
                raise CallError(
                    f"target {_META['target']!r}: the model passed has parameters/buffers "
                    f"{names[:4]}... ({len(names)}) but the capture lifted "
                    f"{_META['param_names'][:4]}... ({len(_META['param_names'])}); "
                    "pass a model of the captured structure"
                )
            for t, n, s in zip(params, names, _META["params"]):
                _check_tensor(t, s, f"parameter/buffer {n}")
            _remember_params(modules, params)
        _check_training(subs)
        if _DYN:
            _check_dynamic(leaves)
        else:
            for (t, path), s in zip(leaves, _META["tensor_inputs"]):
                _check_tensor(t, s, path)
        flat = params + [t for t, _ in leaves]  # no autograd below: run under no_grad
        if _CONSTS:  # the trace-made tensor constants, after the inputs
            flat += _CONSTS
        if _META.get("mutated_inputs") and _META["engine"] == "frozen":
            _check_no_aliases(flat, [f"parameter/buffer {n}" for n in _META["param_names"]]
                              + [path for _, path in leaves])
        cuda = next((t.device for t in flat if t.device.type == "cuda"), None)
        with torch.no_grad(), (torch.cuda.device(cuda) if cuda is not None else _nullcontext()):
            outs = self._run(flat)
        n_user = _META["num_user_outputs"]
        for index, g in zip(_META["grad_param_indices"], outs[n_user:]):
            p = params[index]
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
        if _REASSIGNED:  # `self.steps = self.steps + 1`: the new value, into the caller's buffer
            with torch.no_grad():
                for index, new in zip(_REASSIGNED, outs[n_user + len(_META["grad_param_indices"]):]):
                    params[index].copy_(new)
        return _rebuild(_META["outputs"], list(outs[:n_user]))


def load(kernel_dir):
    """Return the callable for this pair.

    Args:
        kernel_dir: directory with the cache's unpacked blobs (frozen kernels), or
            None to run the captured ATen graph in eager mode (slower, no kernels).
    Returns:
        a :class:`CompiledArtifact`.
    """
    if kernel_dir is None or _META["engine"] != "frozen":
        return CompiledArtifact(lambda flat: _graph(_GRAPH_SELF, *flat), uses_kernels=False)
    call = _make_call(_load_kernels(kernel_dir))
    return CompiledArtifact(lambda flat: call(list(flat)), uses_kernels=True)
