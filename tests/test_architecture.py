"""The layout: every module is on docs/architecture.md's map, each imports only its own
stage or the stages before it in the map's stage order, and no modules import each other
in a circle, counting the imports inside functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "precompile_build": ROOT / "precompile_build",
    "precompile_runtime": ROOT / "runtime" / "precompile_runtime",
}


def _modules() -> dict[str, Path]:
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its text (top level or inside
    a function). ``from pkg import name`` counts as importing the submodule ``pkg.name``
    where that is a module, else ``pkg`` itself."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods]
                deps.update(subs)
                if len(subs) < len(node.names) and mod in mods:
                    deps.add(mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        deps.discard(name)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def stage_order() -> list[list[str]]:
    """docs/architecture.md's stage order: the lines of the code block under "## The
    stage order", each a stage of one or more names (``config/``, ``api.py``,
    ``precompile_runtime``)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^## The stage order\n.*?^```\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/architecture.md needs a '## The stage order' section with a code block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def _stage_name(module: str) -> str:
    """The name a module's stage goes by in the stage order: ``precompile_runtime`` for
    the runtime, ``NAME/`` for a subpackage's modules, ``NAME.py`` for a top-level module
    (``__init__.py`` for the package itself)."""
    parts = module.split(".")
    if parts[0] != "precompile_build":
        return parts[0]
    if len(parts) == 1:
        return "__init__.py"
    path = PACKAGES["precompile_build"] / parts[1]
    return f"{parts[1]}/" if path.is_dir() else f"{parts[1]}.py"


def _back_edges(graph: dict[str, set[str]], order: list[list[str]]) -> list[str]:
    """``"a -> b"`` for every import of a module of a later stage (``b``) by ``a``, and
    ``"a: in no stage"`` for a module whose stage the order does not name."""
    rank = {name: i for i, names in enumerate(order) for name in names}
    found = [f"{m}: in no stage" for m in sorted(graph) if _stage_name(m) not in rank]
    for a in sorted(graph):
        for b in sorted(graph[a]):
            ra, rb = rank.get(_stage_name(a)), rank.get(_stage_name(b))
            if ra is not None and rb is not None and rb > ra:
                found.append(f"{a} -> {b}")
    return found


def test_each_module_imports_only_its_stage_and_the_stages_before_it():
    """Package level, imports inside functions counted: a module imports its own stage's
    modules or those of stages before it in docs/architecture.md's order."""
    assert _back_edges(import_graph(), stage_order()) == [], (
        "an import against docs/architecture.md's stage order (or a module in no stage)"
    )


def test_the_stage_check_sees_an_import_of_a_later_stage():
    order = [
        ["precompile_runtime"],
        ["config/"],
        ["capturing/"],
        ["api.py"],
        ["cli.py", "__init__.py"],
    ]
    graph = {
        "precompile_build.config.settings": {"precompile_build.capturing.tracers"},
        "precompile_build.capturing.tracers": {"precompile_build.config.choices"},
        "precompile_build.config.choices": {"precompile_runtime.pair_format"},
        "precompile_runtime.pair_format": {"precompile_build"},
        "precompile_build": {"precompile_build.cli", "precompile_build.api"},
        "precompile_build.cli": {"precompile_build"},
        "precompile_build.api": set(),
    }
    assert _back_edges(graph, order) == [
        "precompile_build.config.settings -> precompile_build.capturing.tracers",
        "precompile_runtime.pair_format -> precompile_build",
    ]
    assert _back_edges({"precompile_build.nowhere": set()}, order) == [
        "precompile_build.nowhere: in no stage"
    ]


def test_every_stage_in_the_order_exists():
    names = [name for stage in stage_order() for name in stage]
    assert len(names) == len(set(names)), "a name twice in the stage order"
    present = {_stage_name(m) for m in _modules()}
    assert sorted(set(names) - present) == [], "the stage order names what does not exist"


def test_no_modules_import_each_other_in_a_circle():
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_sees_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_every_module_is_on_the_architecture_map():
    """docs/architecture.md lists each module as `` - `file.py`: ...`` under a heading
    naming its folder; a module added without a line fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed: set[str] = set()
    folder = None
    for line in text.splitlines():
        head = re.match(r"### `([^`]+)/`", line)
        if head:
            folder = head.group(1).removesuffix(" (top level)")
            continue
        item = re.match(r"- `([^`]+\.py)`: \S", line)
        if item and folder:
            listed.add(f"{folder}/{item.group(1)}")
    present = {str(p.relative_to(ROOT)) for p in _modules().values()}
    assert sorted(present - listed) == [], "add a line to docs/architecture.md for these"
    assert sorted(listed - present) == [], "docs/architecture.md lists modules that do not exist"


def test_each_stage_package_says_what_it_takes_and_gives():
    for name, path in _modules().items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            assert doc and len(doc.split()) >= 8, (
                f"{name} needs a docstring saying what the stage does"
            )
