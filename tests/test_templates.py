"""The serving templates (precompile_build/templates/*.py, copied into every source half by codegen.py)
name what they take from the rest of the file in a stand-ins block for linters; the
source half carries them without it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from precompile_build.engines import codegen
from precompile_build.templates import source_names

ENGINES = Path(codegen.__file__).parent
TEMPLATES = ["kernel_loader.py", "triton_launcher.py", "call_args.py", "distributed.py", "driver.py", "cuda_graphs.py"]


def _stand_in_names(text: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module == "_source_names":
            names += [a.name for a in node.names]
    return names


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_copy_drops_the_stand_ins_and_keeps_the_rest(name):
    text = (ENGINES / name).read_text(encoding="utf-8")
    copied = codegen._template(name)
    assert _stand_in_names(text), f"{name}: no stand-ins block"
    assert "_source_names" not in copied and "TYPE_CHECKING" not in copied
    start, end = text.index("# stand-ins:"), text.index("# end stand-ins\n")
    rest = text[end + len("# end stand-ins\n"):]
    assert copied == text[:start] + (rest[1:] if rest.startswith("\n") else rest)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_stand_in_is_declared(name):
    declared = set(vars(source_names)) | set(source_names.__annotations__)
    missing = [n for n in _stand_in_names((ENGINES / name).read_text(encoding="utf-8")) if n not in declared]
    assert missing == []
