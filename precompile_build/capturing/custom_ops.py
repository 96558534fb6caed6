"""The custom ops a graph calls, and the Python modules that register them.

A graph may call ops that a library registers with torch's dispatcher when it is
imported (``torchvision::nms``, loaded by ``import torchvision``; a
``torch.library.custom_op`` defined in a model's module). In a process that has not
imported that library, ``torch.ops.torchvision.nms`` is an AttributeError. The pair
records, per op namespace, the ops and the modules to import (:func:`op_libraries`);
the served pair imports them at load (templates/op_libraries.py).

Which module registered an op, in order: a namespace that is itself an imported
top-level package (``torchvision``); a ``torch.library.custom_op``'s function's
module; the Python files the dispatcher names for the op's registrations
(``torch._C._dispatch_dump``: "registered at FILE:LINE", e.g. torchvision's
``_meta_registrations.py``); the package holding a C++ library loaded with
``torch.ops.load_library``. An op none of these places (libtorch's own:
``aten``, ``_c10d_functional``, ``quantized``...) is torch's and is not recorded.
"""

from __future__ import annotations

import os
import re
import sys

import torch

from precompile_runtime.pair_format import OpLibrary

# torch's own namespaces that every graph uses: not looked up
_TORCH_OWN = frozenset(("aten", "prims", "prim", "_c10d_functional", "c10d", "profiler"))
_REGISTERED_AT = re.compile(r"registered at (.+?):\d+")
# torch's registration helpers: the file the dispatcher names when a library calls them
_HELPERS = ("torch/library.py", "torch/_library/", "torch/_custom_ops.py", "torch/_ops.py")
SCRIPT = "__main__"
"""The module name recorded for an op the capture script itself defined."""


def _graph_ops(graph_module) -> list:
    ops = {}
    for gm in graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            op = node.target
            if (
                node.op == "call_function"
                and isinstance(op, torch._ops.OpOverload)
                and op.namespace not in _TORCH_OWN
            ):
                ops[op._schema.name] = op
    return [ops[k] for k in sorted(ops)]


def _modules_by_file() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str):
            out.setdefault(os.path.realpath(path), name)
    return out


def _package_of(path: str, files: dict[str, str]) -> str | None:
    """The imported top-level package whose folder holds ``path`` (a loaded .so)."""
    real = os.path.realpath(path)
    for file, name in files.items():
        if (
            os.path.basename(file) == "__init__.py"
            and "." not in name
            and real.startswith(os.path.dirname(file) + os.sep)
        ):
            return name
    return None


def defining_modules(qualname: str, files: dict[str, str] | None = None) -> list[str]:
    """The modules whose import registers the op ``qualname`` (``"ns::name"``), or []
    where torch itself registers it (see the module docstring for the order)."""
    ns = qualname.partition("::")[0]
    if ns in sys.modules and "." not in ns and ns != "torch":
        return [ns]
    from torch._library import custom_ops

    opdef = getattr(custom_ops, "OPDEFS", {}).get(qualname)
    init = getattr(opdef, "_init_fn", None)
    if init is not None and getattr(init, "__module__", None):
        return [init.__module__]
    files = _modules_by_file() if files is None else files
    try:
        dump = torch._C._dispatch_dump(qualname)
    except Exception:  # noqa: BLE001 - (an op this torch cannot describe: looked up by its library below)
        dump = ""
    found: list[str] = []
    for where in _REGISTERED_AT.findall(dump):
        if where.startswith("<") or any(h in where.replace(os.sep, "/") for h in _HELPERS):
            if where in ("<stdin>", "<string>"):
                found.append(SCRIPT)
            continue
        name = files.get(os.path.realpath(where))
        if name is not None and not name.startswith("torch.") and name not in found:
            found.append(name)
    if found:
        return found
    libraries = [
        p
        for p in (_package_of(p, files) for p in sorted(getattr(torch.ops, "loaded_libraries", ())))
        if p and p != "torch"
    ]
    return [ns] if ns in libraries else []


def op_libraries(graph_module) -> dict[str, OpLibrary]:
    """The custom ops the graph (and its subgraphs) calls, by namespace.

    Returns:
        ``{namespace: {"ops": ["ns::name", ...], "modules": [module, ...]}}``, with
        the modules to import before a served call (:data:`SCRIPT` for an op the
        capture script defined); empty where the graph calls torch's ops only.
    """
    ops = _graph_ops(graph_module)
    files = _modules_by_file() if ops else {}  # (a realpath per imported module: only when needed)
    out: dict[str, OpLibrary] = {}
    for op in ops:
        qualname = op._schema.name
        modules = defining_modules(qualname, files)
        if not modules:
            continue
        entry = out.setdefault(qualname.partition("::")[0], {"ops": [], "modules": []})
        entry["ops"].append(qualname)
        entry["modules"] += [m for m in modules if m not in entry["modules"]]
    return out
