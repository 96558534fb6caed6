"""The serving templates (precompile_build/templates/*.py, copied into every source half by codegen.py)
name what they take from the rest of the file in a stand-ins block for linters; the
source half carries them without it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from precompile_build.engines import codegen
from precompile_build.templates import source_names

TEMPLATE_DIR = Path(source_names.__file__).parent
# every file of the folder is copied into source halves, but its __init__ and the stand-ins
TEMPLATES = sorted(
    p.name for p in TEMPLATE_DIR.glob("*.py") if p.name not in ("__init__.py", "source_names.py")
)
# the templates that read names of the other blocks (the others read none)
WITH_STAND_INS = [
    "assumed_state.py",
    "call_args.py",
    "cuda_graphs.py",
    "distributed.py",
    "driver.py",
    "dynamic_sizes.py",
    "grad_modes.py",
    "guards.py",
    "kernel_loader.py",
    "op_libraries.py",
    "triton_launcher.py",
]


def _stand_in_names(text: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module == "source_names" and node.level == 1:
            names += [a.name for a in node.names]
    return names


def test_the_folder_holds_the_templates_codegen_copies():
    """Each template is one codegen.render copies (a file it never copies would be
    dead code that looks served); the list of those with stand-ins is not stale."""
    import inspect

    render = inspect.getsource(codegen)
    assert [n for n in TEMPLATES if f'_template("{n}")' not in render] == []
    assert [
        n for n in TEMPLATES if _stand_in_names((TEMPLATE_DIR / n).read_text(encoding="utf-8"))
    ] == WITH_STAND_INS


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_copy_drops_the_stand_ins_and_keeps_the_rest(name):
    text = (TEMPLATE_DIR / name).read_text(encoding="utf-8")
    copied = codegen._template(name)
    assert "source_names" not in copied and "TYPE_CHECKING" not in copied
    if name not in WITH_STAND_INS:
        assert "# stand-ins:" not in text and copied == text
        return
    start, end = text.index("# stand-ins:"), text.index("# end stand-ins\n")
    rest = text[end + len("# end stand-ins\n") :]
    assert copied == text[:start] + (rest[1:] if rest.startswith("\n") else rest)


@pytest.mark.parametrize("name", WITH_STAND_INS)
def test_every_stand_in_is_declared(name):
    declared = set(vars(source_names)) | set(source_names.__annotations__)
    names = _stand_in_names((TEMPLATE_DIR / name).read_text(encoding="utf-8"))
    assert names and [n for n in names if n not in declared] == []
