# ---- driver: the calling convention of the captured function ----------------------
# This block is copied verbatim into every source half written by the `frozen` and
# `eager` engines (precompile_build/engines/codegen.py). It needs only torch and the
# stdlib, and reads PRECOMPILE_METADATA, _graph, module_settings (module_settings.py),
# the dynamic dims' check (dynamic_sizes.py),
# the calling convention's _flatten_call/_rebuild and constants (call_args.py), the
# world's checks (distributed.py) and (frozen) _make_call, defined in the same file.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import (
        _DIST,
        _DTENSORS,
        _DYN,
        _G_CHECKS,
        _GLOBALS,
        _GRAPH_SELF,
        _HANDLES,
        _MESH_GROUPS,
        _MODES_CHECKED,
        _MODULE_POS,
        _N_POS,
        _NO_PARAMS,
        _OUT_INPUTS,
        _SIMPLE_ARGS,
        _SINGLE_OUT,
        _TENSOR_POS,
        PRECOMPILE_METADATA,
        _arg_label,
        _assumed_full,
        _assumed_same,
        _check_dist,
        _check_dynamic,
        _check_globals,
        _check_guards,
        _check_modes,
        _check_no_aliases,
        _check_world,
        _CudaGraphs,
        _flatten_call,
        _graph,
        _import_op_libraries,
        _load_kernels,
        _local_params,
        _make_call,
        _param_label,
        _Params,
        _rebuild,
        _state_epoch,
        _tensor_paths,
        _use_mesh,
        dict_watcher,
        module_settings,
        module_tensors,
        submodules,
        watch_models,
    )
# end stand-ins

import operator as _operator
import sys as _sys
import weakref as _weakref

try:  # the runtime's error type where it is installed; the file stays self-contained
    from precompile_runtime.errors import CallError
except ImportError:  # pragma: no cover - runs without precompile-runtime too

    class CallError(ValueError):  # type: ignore[no-redef]
        """A call does not match what was captured."""


_META = PRECOMPILE_METADATA


def _decode_constants(specs, device):
    """The tensor constants the trace made (graph_attrs.constant_specs), passed after
    the inputs on every call: those captured on a CUDA device go to ``device`` (the
    call's), the others stay on the CPU."""
    import base64

    out = []
    for s in specs:
        dtype = getattr(torch, s["dtype"].rpartition(".")[2])
        data = bytearray(base64.b64decode(s["data"]))
        t = (
            torch.frombuffer(data, dtype=dtype).reshape(s["shape"])
            if data
            else torch.empty(s["shape"], dtype=dtype)
        )
        out.append(t if s["device_type"] == "cpu" else t.to(device))
    return out


# Placed at the first call on each device, never when the source runs: executing the
# source (load_packaged's fallback on a host without the capture's GPU, a plain exec)
# touches no GPU, and a pair captured on cuda:0 serves cuda:1 with its constants there.
_CONST_SPECS = _META.get("constants") or ()
_CONSTS: dict = {}  # the call's CUDA device (None: no CUDA input) -> the decoded constants


def _constants(device):
    consts = _CONSTS.get(device)
    if consts is None:  # setdefault: racing threads share one list (graphs keep its addresses)
        consts = _CONSTS.setdefault(device, _decode_constants(_CONST_SPECS, device or "cuda"))
    return consts


_REASSIGNED = _META.get("reassigned_buffers") or ()  # buffers the call reassigns, by lifted index


def _layout_hint(want, shape):
    """What to pass to get the captured strides ``want`` for ``shape``."""
    step = 1
    contiguous: list = []
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
        raise CallError(
            f"target {_META['target']!r}, {what}: expected a tensor, got {type(t).__name__}"
        )
    problems = []
    if str(t.dtype) != spec["dtype"]:
        problems.append(f"dtype {t.dtype} (captured {spec['dtype']})")
    if t.device.type != spec["device_type"]:
        problems.append(f"device {t.device} (captured {spec['device_type']})")
    # (with dynamic dims, _check_dynamic checks shape and stride)
    if check_shape and list(t.shape) != spec["shape"]:
        problems.append(f"shape {list(t.shape)} (captured {spec['shape']})")
    elif check_shape and _META["engine"] == "frozen" and not _same_strides(t, spec["stride"]):
        problems.append(
            f"stride {list(t.stride())} (captured {spec['stride']}; {_layout_hint(spec['stride'], t.shape)})"
        )
    if problems:
        raise CallError(
            f"target {_META['target']!r}, {what}: "
            + "; ".join(problems)
            + ". Dtypes, devices and shapes (but for dims marked dynamic) are fixed at capture: "
            "pass what was captured, or capture again with these (torch._dynamo.mark_dynamic "
            "lets a dim vary)"
        )


# ---- per-call checks, cached -------------------------------------------------------
# The full check of a model's parameters (names, dtype, device, shape, stride) and of
# every submodule's train/eval flag walks the whole model: microseconds per tensor.
# It runs when a model is seen first and again whenever the model *state epoch*
# moved (assumed_state.py's _state_epoch: a parameter, buffer or submodule assigned,
# train()/eval()/to()/half(), a hook removed, an attribute the trace read assigned on a
# module or a recorded object), or a hook was registered anywhere, or a dict, list or
# set the trace read no longer equals its captured value. Between, a call costs one
# dict lookup per model argument and those comparisons, whatever the model's size.
# Not seen (documented): ``p.data = ...``, ``requires_grad_()`` on a parameter, a
# Python setting the trace did not read changed on a model already checked
# (``_check_settings`` runs with the full check), and before Python 3.12 writes through
# ``obj.__dict__``, ``object.__setattr__`` or a registry (on 3.12+ each model's dicts are
# watched: dict_watch.py); CUDA graphs still compare every parameter's address before
# each replay.
_FAST: dict = {}  # id(first model) -> (weakref, epoch, lifted tensors, [weakref of each model],
#   the values compared between full checks, the hook registration count: assumed_state.py)
_TRAINING = _operator.attrgetter("training")

_EPOCH = None  # the epoch box: installed at the first call that passes a model, not at load
_WATCHER: list = []  # [dict_watcher()] from then: None where the interpreter has none


def _check_training(modules):
    """Dropout and batch norm were traced in the captured train/eval mode."""
    for i, (mod, want) in enumerate(zip(modules, _META.get("training", []))):
        got = list(map(_TRAINING, submodules(mod)))
        if len(got) != len(want):  # (a ModuleList grown, a ModuleDict popped)
            raise CallError(
                f"target {_META['target']!r}: {_arg_label(i)} has {len(got)} submodules, the "
                f"captured model had {len(want)}: a submodule was added or removed since; "
                "pass a model of the captured structure, or capture again"
            )
        if got != want:
            if all(want):
                fix = "call model.train()"
            elif not any(want):
                fix = "call model.eval()"
            else:
                fix = "put each submodule back in its train/eval mode of the capture"
            raise CallError(
                f"target {_META['target']!r}: {_arg_label(i)} is not in the train/eval "
                f"mode it was captured in (dropout and batch norm trace differently); "
                f"{fix}, or capture again in this mode"
            )


def _check_settings(modules):
    """The models' Python settings (heads, eps, activation...) are the captured ones:
    the frozen code has them built in, so another config with the same parameters
    would be served silently wrong."""
    state = _META.get("module_state") or []
    for i, (mod, want) in enumerate(zip(modules, _META.get("module_settings") or [])):
        got = module_settings(
            mod, frozenset(state[i] if i < len(state) else ())
        )  # module_settings.py, copied in above
        if got == want:
            continue
        diff = next(((w, g) for w, g in zip(want, got) if w != g), None)
        shown = (
            f"captured {diff[0]!r}, got {diff[1]!r}"
            if diff
            else f"captured {len(want)} submodules, got {len(got)}"
        )
        raise CallError(
            f"target {_META['target']!r}: {_arg_label(i)} has other settings than the "
            f"captured model ({shown}); the frozen code has the captured values built in "
            "and would compute something else. Pass a model built with the captured "
            "configuration, or capture this one"
        )


def _full_params(modules):
    """The full check of the model arguments: returns their lifted tensors."""
    names, params = module_tensors(modules)
    mesh = None
    if names != _META["param_names"]:
        want = _META["param_names"]
        i = next(
            (i for i, (g, w) in enumerate(zip(names, want)) if g != w), min(len(names), len(want))
        )

        def shown(seq):
            part = seq[i : i + 4]
            return (
                (str(part)[:-1] + (", ...]" if len(seq) > i + 4 else "]"))
                if part
                else "nothing more"
            )

        raise CallError(
            f"target {_META['target']!r}: the model passed has {len(names)} parameters/buffers, "
            f"the capture lifted {len(want)}; they first differ at #{i}: captured "
            f"{shown([_param_label(n) for n in want])}, given {shown([_param_label(n) for n in names])}; "
            "pass a model of the captured structure"
        )
    if _DTENSORS or "torch.distributed.tensor" in _sys.modules:  # a sharded model: its shards
        params, mesh = _local_params(params, names)
    for t, n, s in zip(params, names, _META["params"]):
        _check_tensor(t, s, f"parameter/buffer {_param_label(n)}")
    _check_training(modules)
    watch = _assumed_full(modules)  # assumed_state.py: names the attribute the trace read
    _check_settings(modules)
    if mesh is None:
        return _Params(params), watch
    out = _MeshParams(params)
    out.mesh = mesh  # type: ignore[attr-defined]  # (a slot of _MeshParams)
    return out, watch


class _MeshParams(_Params):
    """The lifted tensors of a sharded model, with its DeviceMesh (``mesh``)."""

    __slots__ = ("mesh",)


def _cached_params(modules):
    """The lifted tensors of ``modules``, from the cache while the state epoch stands."""
    global _EPOCH
    if not modules:
        return _NO_PARAMS
    if _EPOCH is None:
        _WATCHER.append(dict_watcher())
        _EPOCH = _state_epoch()
    watcher = _WATCHER[0]
    epoch = _EPOCH[0] if watcher is None else _EPOCH[0] + watcher[0]()  # (both only grow)
    entry = _FAST.get(id(modules[0]))
    if (
        entry is not None
        and entry[1] == epoch
        and entry[0]() is modules[0]
        and (len(modules) == 1 or [r() for r in entry[3]] == modules)
        and _assumed_same(entry[4], entry[5])
    ):
        return entry[2]
    hook_id = _HANDLES.next_id  # (assumed_state.py) read before the check, as the epoch
    if watcher is not None:  # (before the check reads them: a write since moves the epoch)
        watch_models(watcher[1], modules)
    params, watch = _full_params(modules)
    key = id(modules[0])
    ref = _weakref.ref(modules[0], lambda _r, k=key: _FAST.pop(k, None))  # type: ignore[misc]
    _FAST[key] = (ref, epoch, params, [_weakref.ref(m) for m in modules], watch, hook_id)
    return params


# User tensor inputs of a static-shape capture: torch's C tensor check
# (torch._C._dynamo.guards.TensorGuards: dtype, device, sizes, strides, requires_grad,
# dispatch keys; part of torch._C, no import of torch._dynamo) built from the last
# call that passed the full check; a call it rejects takes the full check, which
# names the problem or rebuilds the guard.
_TENSOR_GUARDS = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "guards", None), "TensorGuards", None
)
_INPUT_GUARD = [None]


def _check_inputs(tensors, paths):
    """Check the call's tensor leaves ``tensors``; ``paths()`` gives their path texts
    (computed only when the fast guard refuses them). Raises CallError."""
    guard = _INPUT_GUARD[0]
    if guard is not None and guard.check(*tensors):
        return
    leaves = list(zip(tensors, paths()))
    if _DYN:
        _check_dynamic(leaves)
        return
    for (t, path), s in zip(leaves, _META["tensor_inputs"]):
        _check_tensor(t, s, path)
    if _TENSOR_GUARDS is not None and tensors:
        try:
            _INPUT_GUARD[0] = _TENSOR_GUARDS(
                *tensors,
                dynamic_dims_sizes=[list(t.shape) for t in tensors],
                dynamic_dims_strides=[list(t.stride()) for t in tensors],
            )
        except Exception:  # pragma: no cover - an older/newer signature: keep the Python check
            _INPUT_GUARD[0] = None


# ---- ambient state: what changes what eager computes, checked per call ------------
_AMBIENT = _META.get("ambient") or {"autocast": {}}
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)
_DEFAULT_DTYPE = _AMBIENT.get(
    "default_dtype"
)  # recorded where the graph creates tensors without a dtype
_RUNS_BACKWARD = bool(_META.get("grad_param_indices"))


def _autocast_state(device_type):
    if not torch.is_autocast_enabled(device_type):
        return None
    return str(torch.get_autocast_dtype(device_type))


def _check_ambient():
    """Raise CallError where the caller's ambient state would make eager compute
    something else than what was captured: autocast (enabled, dtype) for the
    capture's device type, the default dtype where the graph relies on it, and grad
    mode for a captured backward."""
    want = _AMBIENT["autocast"]
    if want or _ANY_AUTOCAST is None or _ANY_AUTOCAST():
        device_type = _META["device"]
        got = _autocast_state(device_type)
        if got != want.get(device_type):
            cap = want.get(device_type)
            raise CallError(
                f"target {_META['target']!r}: called with {device_type} autocast "
                f"{'to ' + got if got else 'off'}, but captured with it "
                f"{'to ' + cap if cap else 'off'}: the frozen code has the capture's casts "
                "built in and would silently return other dtypes than eager. Call it "
                + (
                    "inside the same torch.autocast(...)"
                    if cap
                    else "outside torch.autocast "
                    "(torch.autocast(..., enabled=False) around the call)"
                )
                + ", or capture again under this autocast"
            )
    if _DEFAULT_DTYPE is not None and str(torch.get_default_dtype()) != _DEFAULT_DTYPE:
        raise CallError(
            f"target {_META['target']!r}: called with the default dtype "
            f"{torch.get_default_dtype()}, but captured with {_DEFAULT_DTYPE}: the function "
            "creates tensors without a dtype, and the pair has the captured one built in. "
            f"Call it with torch.set_default_dtype({_DEFAULT_DTYPE}), or capture again"
        )
    if _RUNS_BACKWARD and not torch.is_grad_enabled():
        raise CallError(
            f"target {_META['target']!r}: called with grad disabled (torch.no_grad() or "
            "torch.inference_mode()), but the captured function runs a backward; eager "
            "would fail here. Call it with grad enabled"
        )


# ---- CUDA graphs (the class is in cuda_graphs.py, appended for CUDA targets) -----
def _cuda_graphs_argument_problem(enabled, copy_outputs, max_graphs, compute_bound):
    """What is wrong with with_cuda_graphs' arguments (text after "with_cuda_graphs("), or None."""
    for name, value in (("enabled", enabled), ("copy_outputs", copy_outputs)):
        if not isinstance(value, bool):
            return f"{name}={value!r}): {name} takes True or False"
    if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
        return f"max_graphs={max_graphs!r}): max_graphs takes a positive int (graphs kept, one per input sizes)"
    if compute_bound not in ("plain", "graph"):
        return f"compute_bound={compute_bound!r}): compute_bound takes 'plain' or 'graph'"
    return None


class CompiledArtifact:
    """The loaded artifact: call it exactly like the captured function.

    Parameters and buffers of nn.Module arguments are read from the modules passed
    at call time (no weights are stored); parameter gradients computed by a captured
    backward are accumulated onto ``.grad`` like eager; buffers mutated by the call
    (BatchNorm statistics, counters) are updated in place. Returned tensors carry no
    autograd history. ``cuda_graphs`` is True when calls replay CUDA graphs (see
    :meth:`with_cuda_graphs`).
    """

    def __init__(self, run, uses_kernels, cuda_graphs=None):
        self._run = run
        self.uses_kernels = uses_kernels
        self.metadata = _META
        self._graphs = cuda_graphs
        self.cuda_graphs = cuda_graphs is not None

    def with_cuda_graphs(
        self, enabled=True, *, copy_outputs=True, max_graphs=8, compute_bound="plain"
    ):
        """A new callable on the same kernels, with CUDA graphs on or off.

        Args:
            enabled: record the frozen kernels' launches into CUDA graphs and replay
                them (bool).
            copy_outputs: True (default): returned tensors are copies the caller
                owns. False: the graph's own output tensors, overwritten by the next
                call with the same sizes (no copy; keep them only until then).
            max_graphs: graphs kept (one per input sizes), least recently
                used dropped first.
            compute_bound: "plain" (default): input sizes whose second call (a
                timed plain run; the first warms up) kept the GPU busy over 1.5
                times as long as the CPU took to issue it
                run without a graph (it would save nothing and cost the copies);
                "graph": every input size gets a graph.
        Returns:
            a :class:`CompiledArtifact`.
        Raises:
            ValueError: an argument of another type or value (enabled and
                copy_outputs take True/False, max_graphs a positive int,
                compute_bound "plain" or "graph"); checked first, whatever the target.
            CallError: enabled for a CPU target, a target without frozen kernels, a
                target that runs a backward, or one whose sizes its values decide.
        """
        problem = _cuda_graphs_argument_problem(enabled, copy_outputs, max_graphs, compute_bound)
        if problem:
            raise ValueError(f"target {_META['target']!r}: with_cuda_graphs({problem}")
        if not enabled:
            return CompiledArtifact(self._run, self.uses_kernels)
        if not self.uses_kernels:
            raise CallError(
                f"target {_META['target']!r}: CUDA graphs replay frozen kernels; "
                "this load has none (a fallback or the eager engine)"
            )
        if _META.get("data_dependent"):  # (capturing/unbacked.py)
            raise CallError(
                f"target {_META['target']!r}: CUDA graphs replay the sizes they recorded, and "
                "this target's code sizes tensors by their values (nonzero, masked_select, "
                "x[mask], .item(): " + ", ".join(_META["data_dependent"]["symbols"]) + "); load it "
                "without cuda_graphs (with_cuda_graphs(False))"
            )
        if _META["device"] != "cuda":
            raise CallError(
                f"target {_META['target']!r}: CUDA graphs need a CUDA target; "
                f"this one was captured on {_META['device']}: load it without "
                "cuda_graphs (with_cuda_graphs(False)), or capture it on a CUDA device"
            )
        return CompiledArtifact(
            self._run, True, _CudaGraphs(self._run, copy_outputs, max_graphs, compute_bound)
        )

    def __call__(self, *args, **kwargs):
        _check_ambient()
        if _GLOBALS:  # module-level values the code read (assumed_state.py)
            _check_globals()
        if _DIST:
            _check_dist()
        if kwargs or len(args) != _N_POS or not _SIMPLE_ARGS:
            modules, tensors = _flatten_call(args, kwargs)
            fast = False
        else:
            modules = [args[i] for i in _MODULE_POS]
            for m in modules:
                if not isinstance(m, torch.nn.Module):
                    _flatten_call(args, kwargs)  # raises, naming the argument
            fast = True
        try:
            params = _cached_params(modules)
        except CallError:
            if _G_CHECKS:  # a submodule of another class: a guard says so (was GELU, now ReLU)
                _check_guards(args, kwargs, modules, full=True, kinds=("type", "class"))
            raise
        if _G_CHECKS:  # the guards Dynamo built at capture (guards.py)
            _check_guards(args, kwargs, modules)
        if _MESH_GROUPS:
            _use_mesh(params)
        if fast:
            tensors = [args[i] for i in _TENSOR_POS]
            guard = _INPUT_GUARD[0]
            if guard is None or not guard.check(*tensors):
                _flatten_call(args, kwargs)
                _check_inputs(tensors, lambda: _tensor_paths(args, kwargs))
        else:
            _check_inputs(tensors, lambda: _tensor_paths(args, kwargs))
        if _MODES_CHECKED:  # the caller's grad mode, deterministic algorithms (grad_modes.py)
            _check_modes(params, tensors)
        flat = params + tensors  # no autograd below: run under no_grad
        cuda = next((t.device for t in flat if t.is_cuda), None) if _ON_CUDA else None
        if _CONST_SPECS:  # the trace-made tensor constants, after the inputs
            flat += _constants(cuda)
            if cuda is None and _ON_CUDA:  # no CUDA input: the constants' device
                cuda = next((t.device for t in flat if t.is_cuda), None)
        if _CHECK_ALIASES:  # (call_args.py)
            _check_no_aliases(
                params,
                flat,
                lambda: (
                    [f"parameter/buffer {_param_label(n)}" for n in _META["param_names"]]
                    + _tensor_paths(args, kwargs)
                ),
            )
        inputs = (
            list(flat) if _OUT_INPUTS else flat
        )  # returned as they are: the wrapper empties `flat`
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            if cuda is None:
                outs = self._run(flat)
            elif torch._C._cuda_getDevice() == cuda.index:
                outs = self._run(flat) if self._graphs is None else self._graphs(flat, cuda)
            else:
                with torch.cuda.device(cuda):
                    outs = self._run(flat) if self._graphs is None else self._graphs(flat, cuda)
        except (AssertionError, RuntimeError):  # a kernel's size/stride/dtype assertion: a
            if modules:  # parameter changed in place (`p.data = w.t()` moves no epoch): the full check names it
                _FAST.pop(id(modules[0]), None)
                _full_params(modules)
            raise
        finally:
            torch._C._set_grad_enabled(grad)
        if _N_GRADS:
            n_user = _META["num_user_outputs"]
            for index, g in zip(_META["grad_param_indices"], outs[n_user:]):
                p = params[index]
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
        if _REASSIGNED:  # `self.steps = self.steps + 1`: the new value, into the caller's buffer
            with torch.no_grad():
                for index, new in zip(_REASSIGNED, outs[_META["num_user_outputs"] + _N_GRADS :]):
                    params[index].copy_(new)
        if _SINGLE_OUT:
            return outs[0]
        return _rebuild(outs, inputs)


_N_GRADS = len(_META["grad_param_indices"])
_CHECK_ALIASES = bool(_META.get("mutated_inputs")) and _META["engine"] == "frozen"
_ON_CUDA = _META["device"] == "cuda"


def load(kernel_dir):
    """Return the callable for this pair.

    Args:
        kernel_dir: directory with the cache's unpacked blobs (frozen kernels), or
            None to run the captured ATen graph in eager mode (slower, no kernels).
    Returns:
        a :class:`CompiledArtifact`; with frozen kernels, it replays CUDA graphs when
        the capture recorded the ``cuda-graphs`` target option
        (``.with_cuda_graphs(enabled)`` gives the other setting).
    Raises:
        CallError: a library whose custom ops the graph calls cannot be imported; a
            pair that runs collectives or is sharded (DTensor parameters) loaded in a
            process whose default group has another world size than the capture's, or
            before ``dist.init_process_group()``.
    """
    _import_op_libraries()  # (op_libraries.py)
    if _DIST:  # a sharded or collective pair: loaded where it can serve, or not at all
        _check_world()
    if kernel_dir is None or _META["engine"] != "frozen":
        return CompiledArtifact(lambda flat: _graph(_GRAPH_SELF, *flat), uses_kernels=False)
    call = _make_call(_load_kernels(kernel_dir))
    art = CompiledArtifact(call, uses_kernels=True)  # call(list) consumes the fresh list
    return art.with_cuda_graphs() if _META.get("cuda_graphs") else art
