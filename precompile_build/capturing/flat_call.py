"""The captured call over flat tensors: what tracing.trace_call traces.

:func:`flatten_call` flattens the call's arguments with pytree (pytree_io.py) and lifts
its modules' parameters and buffers (a sharded model's DTensors as their local shards:
dtensors.py) into a :class:`FlatCall`; :func:`flat_function` is ``fn`` over those flat
tensors, the function a tracer traces: the lifted tensors swapped into the modules
(:func:`_reparametrize`), plain references to them re-pointed (aliases.py), and what
the call returned, computed the gradients of and reassigned, returned flat.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..errors import CaptureError
from ..templates import pytree_types
from ..templates.module_settings import module_setting_items, module_tensors
from . import aliases, collectives, dtensors, grad_modes, graph_attrs, pytree_io


@dataclass
class FlatCall:
    """The call flattened for the trace (:func:`flatten_call`): what the steps of
    tracing.trace_call share. ``params`` are the lifted tensors, ``user_tensors`` the
    tensor arguments; the graph's inputs are ``params + user_tensors``."""

    arg_names: list[str]
    in_spec: Any  # the arguments' pytree spec
    in_kinds: list  # per leaf: ["module", i], ["tensor", i] or ["const", value]
    leaf_paths: list[str]
    in_text: str  # the spec as the pair records it, and its types
    in_types: Any
    modules: list  # the nn.Module arguments
    user_tensors: list
    paths: list[str]  # the tensor arguments' paths
    names: list[str]  # the lifted tensors' names (m<i>.path)
    params: list  # the lifted tensors (a DTensor's local shard)
    wants_grad: list[bool]  # a parameter whose gradient the call may compute
    requires_grad: list[bool]
    lifted: list  # the DTensors lifted as local shards (dtensors.lift)
    settings_before: list  # each module's settings as the trace sees them
    held: Any  # plain references to the inputs (aliases.find_aliases)

    @property
    def n_params(self) -> int:
        return len(self.params)


def flatten_call(fn: Callable, args: tuple, kwargs: dict, target: str) -> FlatCall:
    """The call's arguments through pytree, its modules' tensors lifted (a sharded
    model's DTensors as their local shards); CaptureError for an argument the pair
    cannot take (a data-parallel wrapper, a DTensor argument, an unsupported type)."""
    arg_names = _arg_names(fn, len(args))
    if "transformers.cache_utils" in sys.modules:  # its StaticCache: an argument like any other
        pytree_types.register_cache_types()
    try:
        leaves, in_spec, in_kinds, leaf_paths = pytree_io.flatten_inputs(args, kwargs, arg_names)
        in_text, in_types = pytree_io.dump_spec(in_spec, "an argument")
    except CaptureError as e:
        raise e.for_target(target) from None
    modules = [v for v, k in zip(leaves, in_kinds) if k[0] == "module"]
    user_tensors = [v for v, k in zip(leaves, in_kinds) if k[0] == "tensor"]
    paths = [p for p, k in zip(leaf_paths, in_kinds) if k[0] == "tensor"]
    collectives.refuse_data_parallel(fn, modules, target)
    names, params = module_tensors(modules)  # the driver's walk (module_settings.py)
    wants_grad = [isinstance(p, torch.nn.Parameter) and p.requires_grad for p in params]
    requires_grad = [p.requires_grad for p in params]
    params, lifted = dtensors.lift(params)  # a sharded model's DTensors: their local shards
    dtensors.refuse_dtensor_arguments(user_tensors, paths, target)
    settings_before = [module_setting_items(m) for m in modules]  # as the trace sees them
    return FlatCall(
        arg_names=arg_names,
        in_spec=in_spec,
        in_kinds=in_kinds,
        leaf_paths=leaf_paths,
        in_text=in_text,
        in_types=in_types,
        modules=modules,
        user_tensors=user_tensors,
        paths=paths,
        names=names,
        params=params,
        wants_grad=wants_grad,
        requires_grad=requires_grad,
        lifted=lifted,
        settings_before=settings_before,
        # plain references to the inputs (a cache object that holds the module's buffers)
        held=aliases.find_aliases(modules, params + user_tensors),
    )


def flat_function(fn: Callable, call: FlatCall, out_box: dict, target: str) -> Callable:
    """``fn`` over flat tensors (the lifted tensors, then the tensor arguments), the
    function the tracer traces: it returns the flat results, then the gradients the
    call computed, then the buffers it reassigned, and writes into ``out_box`` what
    the trace learnt (the result's spec and kinds, the gradients' indexes, ...)."""
    modules, n_params, in_kinds = call.modules, call.n_params, call.in_kinds

    def rebuild_args(flat_user):
        it, mods = iter(flat_user), iter(modules)
        values = [
            next(mods) if k[0] == "module" else next(it) if k[0] == "tensor" else k[1]
            for k in in_kinds
        ]
        return pytree.tree_unflatten(values, call.in_spec)

    def flat_fn(*flat):
        if torch.compiler.is_dynamo_compiling():
            # export-strict: Dynamo (torch 2.11) refuses requires_grad_(); its graphs are
            # forward-only (a backward inside fails there), so the inputs serve as leaves
            leaves = list(flat[:n_params])
        else:
            leaves = [
                t.detach().requires_grad_(True) if g else t
                for t, g in zip(flat[:n_params], call.wants_grad)
            ]
        call_args, call_kwargs = rebuild_args(flat[n_params:])
        watched = (
            contextlib.nullcontext()
            if torch.compiler.is_dynamo_compiling()
            else grad_modes.watch_body(out_box, fn)
        )  # the body's own no_grad (grad_modes.py)
        with (
            _reparametrize(modules, call.names, dtensors.wrap(leaves, call.lifted)),
            aliases.repointed(call.held, [*leaves, *flat[n_params:]]),
        ):
            with watched:
                result = fn(*call_args, **call_kwargs)
            reassigned = graph_attrs.reassigned_buffers(modules, call.names, leaves, target)
        out_box["reassigned"] = [i for i, _ in reassigned]
        if not torch.compiler.is_dynamo_compiling():
            out_box["changed"] = pytree_io.changed_argument(
                call_args,
                call_kwargs,
                call.in_spec,
                flat[n_params:],
                in_kinds,
                call.leaf_paths,
                call.arg_names,
            )
        res_leaves, out_box["spec"] = pytree_io.flatten_result(result)
        dtensors.refuse_dtensor_result(res_leaves, target)
        out_box["kinds"], outs = pytree_io.result_leaves(res_leaves, [*leaves, *flat[n_params:]])
        # A returned view would alias an input or an intermediate buffer of the
        # compiled graph; return a fresh tensor so every output owns its storage.
        outs = [o.detach().clone() if o._base is not None else o.detach() for o in outs]
        grads, grad_indices = [], []
        for i, (leaf, g) in enumerate(zip(leaves, call.wants_grad)):
            if g and leaf.grad is not None:
                grads.append(leaf.grad)
                grad_indices.append(i)
        out_box["grad_indices"] = grad_indices
        out_box["num_user_outputs"] = len(outs)
        return (
            *outs,
            *grads,
            *(
                new.detach().clone() if new._base is not None else new.detach()
                for _, new in reassigned
            ),
        )

    return flat_fn


def _reparametrize(modules, names, tensors):
    """One context that swaps every module's parameters/buffers for ``tensors`` (nested
    ``with`` blocks, no ExitStack: TorchDynamo, the strict tracer, follows these). A
    tensor registered in two module arguments is lifted once (under the first) and
    swapped in both."""
    from torch.nn.utils import stateless

    lifted = {}
    for name, t in zip(names, tensors):
        i, _, local = name.partition(".")
        lifted[id(_named_tensor(modules[int(i[1:])], local))] = t
    per_module: list[dict] = []
    for mod in modules:
        own = {}
        for kind in (mod.named_parameters, mod.named_buffers):
            for local, t in kind(remove_duplicate=False):
                if t is not None and id(t) in lifted:
                    own[local] = lifted[id(t)]
        per_module.append(own)

    @contextlib.contextmanager
    def nested(i):
        if i == len(modules):
            yield
            return
        # tie_weights: a tied tensor is one input, seen under every name it has
        with (
            stateless._reparametrize_module(modules[i], per_module[i], tie_weights=True),
            nested(i + 1),
        ):
            yield

    return nested(0)


def _named_tensor(module, name: str):
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module._parameters[leaf] if leaf in module._parameters else module._buffers[leaf]


def _arg_names(fn, n: int) -> list[str]:
    """Names of fn's first ``n`` positional parameters, for messages (may be empty)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:n] if len(names) >= n else []
