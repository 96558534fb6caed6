"""Inductor's extern kernels as plain torch calls in the source half.

Inductor's wrapper calls the library kernels it chose (by default, or as
max-autotune's best-timed choice: ``ExternKernelChoice`` in
torch/_inductor/select_algorithm.py and torch/_inductor/kernel/mm.py) as
``extern_kernels.NAME(...)``, a namespace of ``torch._inductor.select_algorithm``.
Each is a plain callable with fixed arguments, one of:

- a torch function, also under another name (``mm`` and ``mm_dtype`` are
  ``torch.mm``, ``bmm`` is ``torch.bmm``): bound as ``torch.mm``;
- an operator registered by torch's C++ library or outside the compiler stack
  (``_mm_plus_mm`` is ``torch.ops.inductor._mm_plus_mm``, registered in
  torch/csrc/inductor): bound as ``torch.ops.NS.NAME``;
- a small Python function over torch alone (``bias_addmm`` of kernel/mm.py, which
  hands cuBLASLt a 1-D bias; ``conv1x1_via_mm``, ``call_aten_dw`` of kernel/conv.py):
  its source is copied into the source half, without docstring or annotations.

:func:`namespace` writes the source half's ``extern_kernels`` class for a wrapper;
:func:`problem` says why a callable cannot be bound (max-autotune's choices that
cannot be frozen are kept from winning: autotune.py).
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CaptureError

_COMPILER = ("torch._inductor", "torch._dynamo")
_SAFE_GLOBALS = ("torch",)  # the only module global a copied function may read
# torch namespaces searched for a builtin function (torch.mm is _VariableFunctions.mm)
_TORCH_NAMESPACES = ("", "nn.functional", "linalg", "special", "fft", "sparse")


@dataclass(frozen=True)
class Binding:
    """How the source half binds ``extern_kernels.NAME``."""

    name: str
    """The attribute of ``extern_kernels`` the wrapper reads."""
    expr: str
    """What the class attribute is bound to: ``torch.addmm``, ``staticmethod(_extern_bias_addmm)``."""
    code: str = ""
    """Module-level code ``expr`` needs (a copied function's ``def``), or ``""``."""


class Unbindable(Exception):
    """A callable that the source half cannot have without the compiler stack; the
    message says why."""


def bind(name: str, impl: Any) -> Binding:
    """The binding of ``extern_kernels.<name>`` to ``impl`` (what Inductor registered
    under that name).

    Raises:
        Unbindable: ``impl`` is none of a torch function, an operator registered
            outside the compiler stack, or a plain Python function whose only module
            global is ``torch`` (its message says which).
    """
    if impl is None:
        raise Unbindable("Inductor has no extern kernel of that name")
    if isinstance(impl, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return Binding(name, _operator(impl))
    path = _torch_path(impl)
    if path is not None:
        return Binding(name, path)
    if isinstance(impl, types.FunctionType):
        fn = f"_extern_{name}"
        return Binding(name, f"staticmethod({fn})", _copied_function(impl, fn))
    raise Unbindable(
        f"{_describe(impl)} is neither a torch function nor a Python function over torch"
    )


def problem(name: str, impl: Any) -> str | None:
    """Why ``extern_kernels.<name>`` (``impl``) cannot be bound (:func:`bind`), or None."""
    try:
        bind(name, impl)
    except Unbindable as e:
        return str(e)
    return None


def namespace(tree: ast.Module, target: str) -> list[str]:
    """The source half's lines that define ``extern_kernels`` for the wrapper
    ``tree`` (Inductor's wrapper module, parsed): each copied function, then the
    class, one attribute per name the wrapper reads; [] when it reads none.

    Raises:
        CaptureError: the wrapper reads a name that cannot be bound (:func:`bind`).
    """
    from torch._inductor.select_algorithm import extern_kernels

    used = sorted(
        {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "extern_kernels"
        }
    )
    bindings = []
    for attr in used:
        try:
            bindings.append(bind(attr, getattr(extern_kernels, attr, None)))
        except Unbindable as e:
            raise CaptureError(
                f"Inductor chose the extern kernel {attr!r}, which the frozen engine cannot "
                f"bind without the compiler stack ({e}); capture with engine='eager' or "
                "report this kernel",
                target=target,
            ) from None
    if not bindings:
        return []
    return (
        [b.code for b in bindings if b.code]
        + [
            "class extern_kernels:  # Inductor's extern kernels as torch calls (engines/extern_calls.py)"
        ]
        + [f"    {b.name} = {b.expr}" for b in bindings]
    )


def _describe(impl: Any) -> str:
    module = getattr(impl, "__module__", None) or "?"
    return f"{module}.{getattr(impl, '__qualname__', None) or type(impl).__name__}"


def _torch_path(impl: Any) -> str | None:
    """``torch.X`` (or ``torch.nn.functional.X``...) when that is ``impl`` itself."""
    name = getattr(impl, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        return None
    for ns in _TORCH_NAMESPACES:
        owner: Any = torch
        for part in filter(None, ns.split(".")):
            owner = getattr(owner, part, None)
        if owner is not None and getattr(owner, name, None) is impl:
            return ".".join(filter(None, ("torch", ns, name)))
    return None


def _operator(op: Any) -> str:
    """``torch.ops.NS.NAME[.OVERLOAD]`` for an operator registered where the served
    process has it: by torch's C++ library or by a module outside the compiler stack
    (the registration's file, from the dispatcher's record of it).
    Raises Unbindable for one that torch._inductor / torch._dynamo register."""
    qualified = (
        op._qualified_op_name if hasattr(op, "_qualified_op_name") else op.name().split(".")[0]
    )
    ns, _, opname = qualified.partition("::")
    overload = getattr(op, "_overloadname", None)
    try:
        dump = torch._C._dispatch_dump(qualified)
    except RuntimeError:
        dump = ""
    where = next(
        (
            ln.split("registered at", 1)[1].strip()
            for ln in dump.splitlines()
            if ln.startswith("debug:") and "registered at" in ln
        ),
        "",
    )
    if any(part in where.replace("\\", "/") for part in ("/torch/_inductor/", "/torch/_dynamo/")):
        raise Unbindable(f"the operator {qualified} is registered by the compiler stack ({where})")
    path = f"torch.ops.{ns}.{opname}"
    return f"{path}.{overload}" if isinstance(op, torch._ops.OpOverload) and overload else path


def _copied_function(fn: types.FunctionType, new_name: str) -> str:
    """``fn``'s source as ``def new_name(...)``: no docstring, no annotations, no
    decorators. Raises Unbindable unless the function reads no module global but
    ``torch`` (the torch module itself), has no closure and literal defaults."""
    where = _describe(fn)
    if fn.__closure__:
        raise Unbindable(f"{where} is a closure")
    for global_name in sorted(_globals_read(fn.__code__)):
        if global_name in fn.__globals__:
            if not (global_name in _SAFE_GLOBALS and fn.__globals__[global_name] is torch):
                raise Unbindable(f"{where} reads {global_name!r} of its module")
        elif not hasattr(builtins, global_name):
            raise Unbindable(
                f"{where} reads {global_name!r}, which is neither a module global nor a builtin"
            )
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise Unbindable(f"the source of {where} cannot be read ({e})") from None
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise Unbindable(f"the source of {where} is not a plain def")
    if node.decorator_list:
        raise Unbindable(f"{where} is decorated")
    for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
        try:
            ast.literal_eval(default)
        except ValueError:
            raise Unbindable(
                f"{where} has a default that is not a literal ({ast.unparse(default)})"
            ) from None
    node.name = new_name
    node.returns = None
    for arg in [
        *node.args.posonlyargs,
        *node.args.args,
        *node.args.kwonlyargs,
        *filter(None, (node.args.vararg, node.args.kwarg)),
    ]:
        arg.annotation = None
    body = node.body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        node.body = body[1:] or [ast.Pass()]  # its docstring
    origin = where.replace(
        "torch._inductor.", "Inductor's ", 1
    )  # the text must not name the compiler
    code = f"# {origin}, copied (engines/extern_calls.py)\n" + ast.unparse(node)
    if any(m in code for m in _COMPILER):
        raise Unbindable(f"{where} names the compiler stack")
    return code


def _globals_read(code: types.CodeType) -> set[str]:
    """The global (or builtin) names ``code`` and the code nested in it load."""
    names = {
        i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return {n for n in names if isinstance(n, str)}
