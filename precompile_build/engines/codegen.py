"""Write the source half of a `frozen` or `eager` pair.

The file is a readable, self-contained module (torch + stdlib; precompile-runtime's
error and warning classes and its serving guard are used where installed, with
fallbacks), in this order::

    header comment, `import torch`
    PRECOMPILE_METADATA = {...}          literal calling convention (ast.literal_eval-able)
    def _graph(self, ...)                the captured ATen graph (fallback, eager engine)
    def _make_call(_kernels)             frozen: Inductor's wrapper, kernels bound from the cache
    frozen: kernel loader (kernel_loader.py); with Triton kernels the binary choice
      (precompile_runtime/_arch_rules.py) and launcher (triton_launcher.py)
    model settings (module_settings.py), pytree types (pytree_types.py), recorded
    values (state_values.py), arguments and results (call_args.py), the custom ops'
    libraries (op_libraries.py), driver (driver.py), the Python state the trace
    assumed (assumed_state.py)
    frozen CUDA targets: CUDA graphs (cuda_graphs.py)
    the names of the blocks left out, as None (what the driver reads on paths this
      pair never takes)

Each name the file reads is defined in it (ruff's F821), and none twice (F811): an
import line a block repeats of an earlier one is dropped (tests/test_codegen.py
renders every engine, device, Triton and CUDA-graph combination and lints it).
"""

from __future__ import annotations

import ast
import pprint
import re
import textwrap
from pathlib import Path

import torch

from precompile_runtime import _arch_rules
from precompile_runtime.pair_format import FORMAT as SOURCE_FORMAT
from precompile_runtime.pair_format import VERSION as SOURCE_VERSION
from precompile_runtime.pair_format import CallConvention, Kernel, PairMetadata, SourceEngine

from ..templates.guard_values import guard_condition

_TEMPLATES = Path(__file__).parent.parent / "templates"
# A template's imports of the names other blocks define (source_names.py), for linters
_STAND_INS = re.compile(r"^# stand-ins:.*?^# end stand-ins\n\n?", re.M | re.S)
_IMPORT_LINE = re.compile(r"^(import [\w.]+( as \w+)?|from [\w.]+ import \w+( as \w+)?)$", re.M)


def _template(name: str) -> str:
    """The template ``name`` as the source half carries it: without its stand-ins block."""
    return _STAND_INS.sub("", (_TEMPLATES / name).read_text(encoding="utf-8"), count=1)


def triton_launcher_code() -> str:
    """The source half's frozen Triton kernels: the runtime's rules for which binary a
    device runs (precompile_runtime/_arch_rules.py, the same file arch_select builds
    on, so the two cannot disagree) and the launcher (triton_launcher.py)."""
    rules = Path(_arch_rules.__file__).read_text(encoding="utf-8")
    return rules.rstrip("\n") + "\n\n\n" + _template("triton_launcher.py")


def _forward_code(graph_module) -> str:
    code = textwrap.dedent(graph_module.code.strip("\n"))
    if not code.startswith("def forward("):  # pragma: no cover - fx always emits this
        raise AssertionError("unexpected fx code layout")
    return code


def _subgraph_attrs(graph_module, prefix: str, classes: list[str]) -> list[str]:
    """``name = _Graph_x()`` lines for each subgraph child of ``graph_module`` (the
    branches of torch.cond, ...), appending each child's class to ``classes``."""
    lines = []
    for name, child in graph_module.named_children():
        if isinstance(child, torch.fx.GraphModule):
            cls = f"{prefix}_{name}"
            attrs = _subgraph_attrs(child, cls, classes)
            classes.append(
                f"class {cls}:\n"
                + "".join(f"    {a}\n" for a in attrs)
                + textwrap.indent(_forward_code(child), "    ")
                + "\n    __call__ = forward\n"
            )
            lines.append(f"{name} = {cls}()")
    return lines


def graph_source(graph_module) -> str:
    """The fx graph's generated Python as a module-level function ``_graph(self, *args)``
    and ``_GRAPH_SELF``, what to pass as ``self``: None, or an object whose attributes
    are the graph's subgraphs (control-flow branches), each a class with ``forward``."""
    classes: list[str] = []
    attrs = _subgraph_attrs(graph_module, "_Graph", classes)
    code = "def _graph(" + _forward_code(graph_module)[len("def forward(") :]
    if not attrs:
        return code + "\n\n\n_GRAPH_SELF = None\n"
    holder = "class _GraphSelf:  # the graph's subgraphs\n" + "".join(f"    {a}\n" for a in attrs)
    return "\n\n".join(classes + [holder, "_GRAPH_SELF = _GraphSelf()", code]) + "\n"


def pair_metadata(
    call: CallConvention, engine: SourceEngine, kernels: list[Kernel]
) -> PairMetadata:
    """The pair's ``PRECOMPILE_METADATA``: the trace's ``call`` (copied), this pair
    format's ``format`` and ``version``, the ``engine`` and its ``kernels`` (``[]``:
    eager); the engine may add the optional keys of PairMetadata after."""
    return {
        **call,
        "format": SOURCE_FORMAT,
        "version": SOURCE_VERSION,
        "engine": engine,
        "kernels": kernels,
    }


def render(metadata: PairMetadata, graph_code: str, wrapper_code: str | None) -> str:
    """Assemble the source half.

    Args:
        metadata: PRECOMPILE_METADATA (precompile_runtime.pair_format.PairMetadata, as
            :func:`pair_metadata` makes it); a literal, it must round-trip through repr.
        graph_code: output of :func:`graph_source`.
        wrapper_code: the body of ``_make_call(_kernels)`` (frozen), or None (eager).
    Returns:
        the file's text (str); its UTF-8 bytes are what code_hash covers.
    """
    meta = {"format": SOURCE_FORMAT, "version": SOURCE_VERSION, **metadata}
    uses_device = re.search(r"\bdevice\b", graph_code) is not None  # fx prints device(type=...)
    parts = [
        f"# Generated by precompile-build, engine {meta['engine']!r}, target {meta['target']!r}.\n"
        "# Do not edit: the cache half is bound to these exact bytes by its code_hash.\n"
        "# Runs on its own with torch alone: load(None) runs the captured ATen graph.\n",
        "import torch\n"
        + (
            "from torch import device  # names used by generated graph code\n"
            if uses_device
            else ""
        )
        + "from math import inf, nan\n",
        "PRECOMPILE_METADATA = " + pprint.pformat(meta, width=100, sort_dicts=True) + "\n",
        "# ---- the captured ATen graph ----------------------------------------------------\n"
        + graph_code
        + "\n",
    ]
    if wrapper_code is not None:
        parts.append(
            "# ---- Inductor's generated wrapper; kernels are bound from the cache -----------\n"
            "def _make_call(_kernels):\n" + textwrap.indent(wrapper_code, "    ") + "\n"
            "    return call\n"
        )
        parts.append(_template("kernel_loader.py"))
    triton = wrapper_code is not None and any(
        k["kind"] == "triton" for k in metadata.get("kernels", [])
    )
    if triton:
        parts.append(triton_launcher_code())
    parts.append(_template("module_settings.py"))  # the driver checks models with it
    parts.append(_template("pytree_types.py"))  # and registers transformers' caches with it
    parts.append(_template("state_values.py"))  # the recorded Python state's encoding
    parts.append(_template("guard_values.py"))  # the guards' values, and their generated checks
    parts.append(guards_code(metadata.get("guards")))
    parts.append(_template("call_args.py"))  # its arguments and results, through pytree
    parts.append(_template("op_libraries.py"))  # imports the libraries of the custom ops it calls
    parts.append(_template("distributed.py"))  # the world, its groups, DTensor shards
    parts.append(_template("dict_watch.py"))  # a write to a watched dict moves the epoch
    parts.append(_template("driver.py"))
    parts.append(_template("dynamic_sizes.py"))  # the check of dynamic dims the driver calls
    parts.append(_template("grad_modes.py"))  # the caller's grad mode and deterministic algorithms
    parts.append(_template("assumed_state.py"))  # what the trace assumed, checked per call
    parts.append(_template("guards.py"))  # the guards Dynamo built, checked per call
    graphs = wrapper_code is not None and metadata.get("device") == "cuda"
    if graphs:
        parts.append(_template("cuda_graphs.py"))  # CUDA graphs of the frozen kernels
    absent = (
        ["_make_call", "_load_kernels"]
        if wrapper_code is None  # eager: no kernels
        else []
        if triton
        else ["_TritonKernel"]
    ) + ([] if graphs else ["_CudaGraphs"])
    if absent:
        parts.append(
            "# ---- not in this pair: what the driver would call on the paths it does not take\n"
            + "".join(f"{n} = None\n" for n in absent)
        )
    return "\n\n".join(p.rstrip("\n") + "\n" for p in _without_repeated_imports(parts))


def guards_code(guards: dict | None) -> str:
    """The generated checks of the guards Dynamo built (capturing/dynamo_guards.py):
    ``_guards_full(_R, <the function's parameters>)`` runs every check,
    ``_guards_call`` the per-call ones; each returns the index of the first check that
    fails (in ``guards["checks"]``), or -1. ``_guards_dicts`` returns the dicts whose
    versions stand for the other checks between full checks (templates/guards.py).
    ``_guard_bind`` binds a call's arguments to
    the parameters' names (for the message of a failed check). A check that starts
    from a module this process cannot import holds (templates/guard_values.py)."""
    params = (guards or {}).get("params")
    params = params if params is not None else "*args, **kwargs"
    checks = (guards or {}).get("checks") or []
    head = '# ---- the guards\' checks, generated from PRECOMPILE_METADATA["guards"] --------\n'
    out = [head + "_NODEFAULT = object()  # a default that is no literal: not bound by name\n"]
    for name, every in (("_guards_full", True), ("_guards_call", False)):
        lines = [f"def {name}(_R, {params}):" if params else f"def {name}(_R):"]
        for i, (_label, kind, expr, expected, per_call, *_rest) in enumerate(checks):
            if not (every or per_call):
                continue
            cond = guard_condition(kind, expr, expected)
            roots = sorted(set(re.findall(r"_R\[\d+\]", expr)))
            if roots:
                cond = " or ".join(f"{r} is _G_ABSENT" for r in roots) + f" or ({cond})"
            lines += [
                "    try:",
                f"        if not ({cond}):",
                f"            return {i}",
                "    except Exception:",
                f"        return {i}",
            ]
        lines.append("    return -1")
        out.append("\n".join(lines) + "\n")
    by_identity = set((guards or {}).get("by_identity") or ())
    covers = list(dict.fromkeys(c[6] for c in checks if len(c) > 6 and c[6]))
    lines = [
        f"def _guards_dicts(_R, {params}):" if params else "def _guards_dicts(_R):",
        "    out = []",
    ]
    for expr in covers:
        if expr not in by_identity:
            lines += [
                "    try:",
                f"        out.append({expr})",
                "    except Exception:",
                "        out.append(None)",
            ]
    out.append("\n".join(lines + ["    return out"]) + "\n")
    out.append(_watch_code(params, [e for e in covers if e in by_identity]))
    out.append(_slots_code(params, (guards or {}).get("slots") or []))
    out.append(
        f"def _guard_bind({params}):\n    return dict(locals())\n"
        if params
        else "def _guard_bind():\n    return {}\n"
    )
    return "\n\n".join(out)


def _watch_code(params: str, covers: list[str]) -> str:
    """``_guards_watch(_R, <the function's parameters>)``: for each cover compared by
    identity (capturing/dict_covers.py), the dict's id and version, and the class of the
    object whose ``__dict__`` it is, as one tuple (None where one does not resolve). A
    call whose tuple equals the last full check's meets the same dicts, unwritten
    (versions are unique across dicts: templates/guards.py checks that at load)."""
    lines = [f"def _guards_watch(_R, {params}):" if params else "def _guards_watch(_R):"]
    if not covers:
        return "\n".join(lines + ["    return ()"]) + "\n"
    lines.append("    try:")
    parts = []
    for i, expr in enumerate(covers):
        node = ast.parse(expr, mode="eval").body
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            lines += [
                f"        _o{i} = {ast.unparse(node.value)}",
                f"        _d{i} = _o{i}.__dict__",
            ]
            parts.append(f"type(_o{i})")
        else:
            lines.append(f"        _d{i} = {expr}")
        parts += [f"id(_d{i})", f"_DICT_VERSION(_d{i})"]
    lines += [
        f"        return ({', '.join(parts)},)",
        "    except Exception:",
        "        return None",
    ]
    return "\n".join(lines) + "\n"


def _slots_code(params: str, slots: list) -> str:
    """``_guards_slots(_R, <the function's parameters>)``: the objects of
    ``guards["slots"]`` (a function whose defaults or code, a cell whose contents can be
    rebound in place: capturing/dict_covers.py's slots), in order, or None where one
    does not resolve (templates/guards.py compares what their attributes hold)."""
    lines = [f"def _guards_slots(_R, {params}):" if params else "def _guards_slots(_R):"]
    if not slots:
        return "\n".join(lines + ["    return []"]) + "\n"
    items = "".join(f"            {expr},\n" for expr, _attr in slots)
    lines += [
        "    try:",
        "        return [\n" + items + "        ]",
        "    except Exception:",
        "        return None",
    ]
    return "\n".join(lines) + "\n"


def _without_repeated_imports(parts: list[str]) -> list[str]:
    """``parts`` less each top-level one-line import that an earlier part has already."""
    seen: set[str] = set()
    out = []
    for part in parts:
        repeated = [m.group(0) for m in _IMPORT_LINE.finditer(part) if m.group(0) in seen]
        seen.update(m.group(0) for m in _IMPORT_LINE.finditer(part))
        if repeated:
            part = "".join(
                line for line in part.splitlines(keepends=True) if line.rstrip("\n") not in repeated
            )
        out.append(part)
    return out
