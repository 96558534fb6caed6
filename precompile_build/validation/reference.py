"""The wide reference run: the captured graph in fp64 within the memory the model needs.

numerics.py judges the frozen kernels against the graph run in a wider dtype (fp64;
fp32 on MPS), as torch's accuracy checks do. Widening every input up front holds a
whole fp64 copy of the weights (4x a bf16 model), more than the model itself needs;
:func:`reference_run` instead runs the graph through an ``fx.Interpreter`` that

- widens a parameter right before the op that computes with it (its views, such as
  the trace's ``detach`` or a ``t``, are taken of the narrow tensor) and drops the
  wide copy after that op ran: one weight is wide at a time (a matrix product's
  weight past :data:`BLOCK_BYTES` by blocks of output columns; a gather's table,
  an embedding, not at all: its rows are widened once gathered); inputs
  the graph writes (``sharing.written_inputs``) are widened once, up front, so that the
  writes land in them;
- frees each intermediate after its last use (``garbage_collect_values``);
- maps every floating dtype argument to the reference dtype (``_to_copy(dtype=bf16)``,
  ``convert_element_type``, ``full(dtype=)``; not ``view.dtype``, a bitcast), as torch's
  minifier does (``torch._dynamo.debug_utils.cast_dtype_args_to_fp64``); an op with no
  kernel in the wide dtype runs in fp32, else in its captured dtypes, its result
  widened (listed in ``fallback_ops``);
- gives each op's result the strides the narrow run had (``node.meta["val"]``) where
  the wide kernel chose others: a ``view`` recorded after a transpose of an attention
  output (CUDA flash attention writes (B, L, H, D) memory, fp64's math kernel (B, H,
  L, D)) or of a channels-last convolution is then valid, and ``as_strided`` reads the
  same elements; a ``view`` that still is not (symbolic strides) is a ``reshape``;
- moves the rest of the run to the CPU when a CUDA op (widening its arguments, running,
  restriding its result) runs out of memory (the spilled
  values are listed in ``spilled``).
"""

from __future__ import annotations

import operator
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ..capturing.layouts import memory_layout
from ..capturing.sharing import written_inputs

BLOCK_BYTES = 256 << 20
"""The largest wide copy of one matrix product's weight the reference makes at once:
larger ones are widened and multiplied by blocks of output columns."""


def _gather_table(target):
    """The position of the table an op copies elements of (``embedding``,
    ``index_select``), else None: a wide run gathers from the narrow table and widens
    the result, the same values."""
    aten = torch.ops.aten
    return {aten.embedding.default: 0, aten.index_select.default: 0}.get(target)


def reference_dtype(device_type: str):
    """fp64 where the device has it, else fp32 (MPS)."""
    return torch.float32 if device_type == "mps" else torch.float64


def _float_dtype(d) -> bool:
    return isinstance(d, torch.dtype) and d.is_floating_point


def _widen(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    return x


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)
    )  # CPU allocator


def _concrete_layout(val):
    """``(shape, strides)`` of a traced value when both are plain ints, else None."""
    if not isinstance(val, torch.Tensor):
        return None
    try:
        shape, stride = tuple(val.shape), tuple(val.stride())
    except Exception:  # noqa: BLE001 - a sparse or otherwise strideless value
        return None
    if all(type(s) is int for s in shape + stride):
        return shape, stride
    return None


def _restrided(out, val):
    """``out`` laid out as the narrow run laid out ``val`` (same shape, strides taken
    from it), a copy; ``out`` itself where they already agree or cannot be compared."""
    layout = _concrete_layout(val)
    if not isinstance(out, torch.Tensor) or layout is None or out.layout != torch.strided:
        return out
    shape, stride = layout
    if tuple(out.shape) != shape or tuple(out.stride()) == stride or out.numel() <= 1:
        return out
    if memory_layout(val) == "overlapping":
        return out
    return torch.empty_strided(shape, stride, dtype=out.dtype, device=out.device).copy_(out)


def _returns_alias(target) -> bool:
    """True when the op's result may share memory with an argument (a view)."""
    if not isinstance(target, torch._ops.OpOverload):
        return target is not operator.getitem
    return any(r.alias_info is not None for r in target._schema.returns)


class _Reference:
    """The graph interpreted in ``dtype`` (see the module docstring)."""

    def __init__(self, gm, dtype, narrow: list, owned: list):
        import torch.fx

        self.dtype = dtype
        self.owned = owned  # the wide copies of the inputs the graph writes (moved on a spill)
        self.fallback_ops: set[str] = set()
        # the caller's tensors and views of them, widened at each use (weak: an id freed
        # and given to a new tensor is no longer narrow)
        self.narrow = weakref.WeakValueDictionary({id(t): t for t in narrow})
        self.spilled = False
        outer = self

        class Interp(torch.fx.Interpreter):
            def run_node(self, n):
                self._node = n
                return super().run_node(n)

            def call_function(self, target, args, kwargs):
                return outer._call(self, self._node, target, args, kwargs)

        self.interp = Interp(gm, garbage_collect_values=True)

    def _map_dtypes(self, target, args, kwargs):
        """Every floating dtype argument (``_to_copy(dtype=)``, ``convert_element_type``,
        ``full(dtype=)``, ``_softmax_backward_data``'s input dtype) -> the reference
        dtype; not ``view.dtype`` (a bitcast: the dtype is the bit layout)."""
        name = str(getattr(target, "__name__", ""))
        if name.startswith("view.dtype"):
            return args, kwargs
        args = tuple(self.dtype if _float_dtype(a) else a for a in args)
        kwargs = {k: self.dtype if _float_dtype(v) else v for k, v in kwargs.items()}
        if name.startswith(("_softmax.", "_log_softmax.")) and len(args) > 2:
            args = (*args[:2], False, *args[3:])  # half_to_float: there is no half here
        return args, kwargs

    def _fetch(self, x):
        """An argument as the wide run reads it: the caller's tensors widened (a
        temporary), on the CPU once the run spilled there."""
        if not isinstance(x, torch.Tensor):
            if self.spilled and isinstance(x, torch.device) and x.type == "cuda":
                return torch.device("cpu")
            return x
        narrow = self._is_narrow(x)
        if self.spilled and x.device.type == "cuda":
            x = x.to("cpu")  # the caller's tensor: a copy; an intermediate: already moved
        return _widen(x, self.dtype) if narrow else x

    def _spill(self, interp) -> None:
        """Every value the run holds on a CUDA device -> the CPU (they are freed there)."""
        slots = {id(t): i for i, t in enumerate(self.owned)}

        def move(x):
            if isinstance(x, torch.Tensor) and x.device.type == "cuda" and not self._is_narrow(x):
                moved = x.to("cpu")
                if id(x) in slots:  # the graph's later writes land in the moved copy
                    self.owned[slots[id(x)]] = moved
                return moved
            return x

        self.spilled = True
        for node, value in list(interp.env.items()):
            interp.env[node] = tree_map(move, value)
        torch.cuda.empty_cache()

    def _views_of_narrow(self, target, args, kwargs) -> bool:
        """True for a view op (``detach``, ``t``, ``permute``, ``view``, ``split``...)
        of the caller's tensors alone: it runs on them (no copy), its results are
        widened where an op computes with them."""
        if (
            not isinstance(target, torch._ops.OpOverload)
            or not target._schema.returns
            or any(r.alias_info is None or r.alias_info.is_write for r in target._schema.returns)
        ):
            return False
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        return bool(tensors) and all(self._is_narrow(x) for x in tensors)

    def _is_narrow(self, x) -> bool:
        return self.narrow.get(id(x)) is x

    def _call(self, interp, node, target, args, kwargs):
        if self._views_of_narrow(target, args, kwargs):
            out = target(*args, **kwargs)
            self.narrow.update({id(x): x for x in tree_leaves(out) if isinstance(x, torch.Tensor)})
            return out
        while True:
            try:  # widening an argument or restriding the result may run out of memory too
                keep = self._kept_narrow(
                    target, args, kwargs
                )  # widened by blocks, or after a gather
                a = tuple(x if j == keep else tree_map(self._fetch, x) for j, x in enumerate(args))
                k = tree_map(self._fetch, kwargs)
                if self.spilled and "device" in k and str(k["device"]).startswith("cuda"):
                    k = dict(k, device="cpu")
                out = (
                    self._gathered(target, args, a, k)
                    if keep is not None and _gather_table(target) is not None
                    else self._by_column_blocks(target, args, kwargs, a, k)
                )
                if out is None:
                    out = self._run(node, target, a, k)
                return self._laid_out(node, target, out)
            except Exception as e:
                if not (_is_oom(e) and not self.spilled and self._on_cuda(args, kwargs)):
                    raise
            # out of the handler: its traceback no longer holds the wide temporaries
            a = k = None  # type: ignore[assignment]
            self._spill(interp)  # then the same op again, on the CPU

    def _kept_narrow(self, target, args, kwargs):
        """The position of the argument an op reads narrow: the table of a gather
        (:func:`_gather_table`) that is the caller's tensor, or a large weight
        (:meth:`_large_weight`); else None."""
        at = _gather_table(target)
        if (
            at is not None
            and len(args) > at
            and isinstance(args[at], torch.Tensor)
            and args[at].is_floating_point()
            and self._is_narrow(args[at])
        ):
            return at
        return self._large_weight(target, args, kwargs)

    def _gathered(self, target, args, a, k):
        """A gather of rows of the caller's table (an embedding) run on the narrow table,
        its result widened: the same values (a gather copies elements), without a wide
        copy of the table (an 8B Llama's is 4 GiB in fp64)."""
        at = _gather_table(target)
        table = args[at]
        if self.spilled and table.device.type == "cuda":
            table = table.to("cpu")  # where _fetch moved the indices
        return _widen(target(*a[:at], table, *a[at + 1 :], **k), self.dtype)

    def _large_weight(self, target, args, kwargs):
        """The position of the weight of a matrix product (``mm``'s or ``addmm``'s right
        operand, ``linear``'s weight) when it is the caller's tensor and its wide copy
        would exceed :data:`BLOCK_BYTES`; else None."""
        aten = torch.ops.aten
        at = {aten.mm.default: 1, aten.addmm.default: 2, aten.linear.default: 1}.get(target)
        if at is None or kwargs or len(args) <= at:
            return None
        w = args[at]
        if not (
            isinstance(w, torch.Tensor)
            and w.dim() == 2
            and w.is_floating_point()
            and self._is_narrow(w)
        ):
            return None
        return at if w.numel() * self.dtype.itemsize > BLOCK_BYTES else None

    def _by_column_blocks(self, target, args, kwargs, a, k):
        """The matrix product with a large weight (:meth:`_large_weight`) computed by
        blocks of output columns, each block of the weight widened on its own: the
        wide copy of an 8B model's 4 GiB fp64 output projection is never whole. Each
        output element is the same fp64 dot product. None for other ops."""
        at = self._large_weight(target, args, kwargs)
        if at is None:
            return None
        aten = torch.ops.aten
        w = args[at]  # the caller's tensor (narrow), on its device
        if self.spilled and w.device.type == "cuda":
            w = w.to("cpu")
        x = a[at - 1]
        linear = target is aten.linear.default
        n, depth = (w.shape[0], w.shape[1]) if linear else (w.shape[1], w.shape[0])
        step = max(1, BLOCK_BYTES // max(1, depth * self.dtype.itemsize))
        out = torch.empty((*x.shape[:-1], n), dtype=self.dtype, device=x.device)
        bias = a[0] if target is aten.addmm.default else (a[2] if linear and len(a) > 2 else None)
        if bias is not None:
            bias = bias.expand(out.shape)
        for j in range(0, n, step):  # addmm's beta and alpha are 1: no kwargs (_large_weight)
            block = _widen(w[j : j + step] if linear else w[:, j : j + step], self.dtype)
            part = torch.nn.functional.linear(x, block) if linear else torch.mm(x, block)
            if bias is not None:
                part = part.add_(bias[..., j : j + step])
            out[..., j : j + step] = part
            del block, part
        return out

    @staticmethod
    def _laid_out(node, target, out):
        """``out`` with the narrow run's strides (:func:`_restrided`); a view as it is
        (in-place ops return their argument: never run twice after a spill)."""
        if _returns_alias(target):
            return out
        val = node.meta.get("val")
        if (
            isinstance(out, (tuple, list))
            and isinstance(val, (tuple, list))
            and len(out) == len(val)
        ):
            return type(out)(_restrided(o, v) for o, v in zip(out, val))
        return _restrided(out, val)

    @staticmethod
    def _on_cuda(args, kwargs) -> bool:
        return any(
            isinstance(x, torch.Tensor) and x.device.type == "cuda"
            for x in tree_leaves((args, kwargs))
        ) or "cuda" in str(kwargs.get("device", ""))

    def _run(self, node, target, args, kwargs):
        from torch.fx.node import map_arg

        wide_args, wide_kwargs = self._map_dtypes(target, args, kwargs)
        try:
            return target(*wide_args, **wide_kwargs)
        except Exception as e:
            if _is_oom(e):
                raise
            if target is torch.ops.aten.view.default:
                # a view the wide kernel's strides do not allow (symbolic strides
                # could not be restrided): the same values, copied
                return torch.ops.aten.reshape.default(*wide_args, **wide_kwargs)

        # no kernel in the wide dtype: fp32, else the captured dtypes, widened after
        def captured(n):
            return getattr(n.meta.get("val"), "dtype", None)

        def to_captured(x, d):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and isinstance(d, torch.dtype):
                return x.to(d)
            return x

        def fp32(x):
            return _widen(x, torch.float32)

        tries = [
            lambda: (tree_map(fp32, args), tree_map(fp32, kwargs)),
            lambda: (
                tree_map(to_captured, args, map_arg(node.args, captured)),
                tree_map(to_captured, kwargs, map_arg(node.kwargs, captured)),
            ),
        ]
        for cast in tries:
            try:
                a, k = cast()
                out = target(*a, **k)
            except Exception as e:
                if _is_oom(e):
                    raise
                continue
            self.fallback_ops.add(str(getattr(target, "__name__", target)))
            return tree_map(lambda x: _widen(x, self.dtype), out)
        return target(*args, **kwargs)  # raises: the graph itself fails here


def reference_run(
    gm, inputs: list, device_type: str, dtype=None, written=None
) -> tuple[list, list, dict]:
    """Run the graph in the reference dtype without changing ``inputs``.

    Args:
        gm: the captured fx GraphModule over flat tensors.
        inputs: flat input tensors (not modified).
        device_type: ``"cpu"``/``"cuda"``: picks fp64 or fp32 (:func:`reference_dtype`).
        dtype: the reference dtype instead (fp32 when an fp64 run failed).
        written: indices of the inputs the graph may write
            (:func:`.sharing.written_inputs`; None: computed from ``gm``): these are
            copied (widened) up front; the others are widened op by op.
    Returns:
        ``(outputs, inputs_after, info)``: the reference outputs (on the CPU where the
        run spilled there), the inputs after the run (the wide copies for ``written``,
        with the graph's writes applied; the caller's own tensor for the others), and
        ``{"reference": "float64", "fallback_ops": [...], "spilled_to_cpu": bool}``.
    Raises:
        whatever the graph raises on these inputs; torch.OutOfMemoryError (or
        MemoryError) when even the CPU cannot hold what one op needs.
    """
    dtype = dtype or reference_dtype(device_type)
    written = written_inputs(gm) if written is None else set(written)
    run_inputs = [
        (t.detach().to(dtype, copy=True) if t.is_floating_point() else t.detach().clone())
        if i in written
        else t.detach()
        for i, t in enumerate(inputs)
    ]
    ref = _Reference(
        gm, dtype, [t for i, t in enumerate(run_inputs) if i not in written], run_inputs
    )
    with torch.no_grad():
        outs = ref.interp.run(*run_inputs)
    info: dict[str, Any] = {
        "reference": str(dtype).replace("torch.", ""),
        "fallback_ops": sorted(ref.fallback_ops),
    }
    if ref.spilled:
        info["spilled_to_cpu"] = True
    return list(outs), run_inputs, info
