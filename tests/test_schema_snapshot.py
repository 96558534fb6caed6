"""The pair metadata and the manifest cannot change unseen: their keys, required or
optional, and types are snapshotted in tests/data/schema_snapshot.json from the
TypedDicts (precompile_build/wheels/schema_snapshot.py), a change of the tree fails
here until the snapshot is regenerated, and an incompatible change also until its
format's VERSION moves. (What the documented and written manifests hold is checked
against the same TypedDicts in test_manifest_schema.py; which versions load, in
test_pair_format.py.)"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal, Optional, TypedDict, Union

import pytest

from precompile_build.wheels import schema_snapshot
from precompile_build.wheels.schema_snapshot import REGENERATE, SNAPSHOT, changes, problems
from precompile_runtime import manifest, pair_format


def test_the_checked_in_snapshot_is_the_tree_s_schema():
    """On failure the message says which keys changed, whether VERSION must move, and the
    command that regenerates the snapshot."""
    stored = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    current = schema_snapshot.snapshot()
    assert stored == current, schema_snapshot.explain(stored, current)


def test_the_snapshot_holds_each_format_s_version_and_keys():
    formats = schema_snapshot.snapshot()["formats"]
    pair, man = formats["pair_metadata"], formats["manifest"]
    assert (pair["format"], pair["version"]) == (pair_format.FORMAT, pair_format.VERSION)
    assert (man["format"], man["version"]) == (manifest.FORMAT, manifest.VERSION)
    meta = pair["types"]["PairMetadata"]
    assert set(meta["required"]) == pair_format.PairMetadata.__required_keys__
    assert set(meta["optional"]) == pair_format.PairMetadata.__optional_keys__
    assert meta["optional"]["guards"] == "dict[str, Any]"
    assert meta["required"]["collectives"] == "Optional[Collectives]"
    assert pair["types"]["TensorSpec"]["required"]["shape"] == "list[Union[int, str]]"
    assert pair["types"]["Fallback"]["required"] == {"from": "str", "reason": "str"}
    variant = man["types"]["Variant"]
    assert variant["required"]["engine"] == 'Literal["eager", "frozen", "torch"]'
    assert variant["optional"]["capture_device"] == "Union[int, str, None]"
    assert man["types"]["Manifest"]["required"]["targets"] == "dict[str, Target]"


class _Inner(TypedDict):
    a: int


class _Base(TypedDict):
    inner: Optional[_Inner]
    kinds: list[Literal["y", "x"]]


class _Root(_Base, total=False):
    either: Union[str, int]
    bare: list
    table: dict[str, list[_Inner]]


def test_types_as_text():
    """TypedDicts by name (each reached one defined once), unions and Literals sorted, so
    that their order is no change; inherited keys keep whether they are required."""
    assert schema_snapshot.schema(_Root) == {
        "_Root": {
            "required": {"inner": "Optional[_Inner]", "kinds": 'list[Literal["x", "y"]]'},
            "optional": {
                "bare": "list",
                "either": "Union[int, str]",
                "table": "dict[str, list[_Inner]]",
            },
        },
        "_Inner": {"required": {"a": "int"}, "optional": {}},
    }


def _pair(snap: dict[str, Any]) -> dict[str, Any]:
    return snap["formats"]["pair_metadata"]


def _types(snap: dict[str, Any]) -> dict[str, Any]:
    return _pair(snap)["types"]


def _rename_type(snap: dict[str, Any], old: str, new: str) -> None:
    types = _types(snap)
    types[new] = types.pop(old)
    for definition in types.values():
        for kind in ("required", "optional"):
            for key, text in definition[kind].items():
                definition[kind][key] = text.replace(old, new)


INCOMPATIBLE = {
    "a required key removed": (
        lambda s: _types(s)["PairMetadata"]["required"].pop("tracer"),
        "PairMetadata.tracer (required, Literal",
    ),
    "a key renamed": (
        lambda s: _types(s)["TensorSpec"]["required"].update(
            strides=_types(s)["TensorSpec"]["required"].pop("stride")
        ),
        "TensorSpec.stride (required",
    ),
    "an optional key removed": (
        lambda s: _types(s)["PairMetadata"]["optional"].pop("guards"),
        "PairMetadata.guards (optional, dict[str, Any]) removed",
    ),
    "a key retyped": (
        lambda s: _types(s)["ConstantSpec"]["required"].update(shape="list[str]"),
        "ConstantSpec.shape retyped: list[int] -> list[str]",
    ),
    "a Literal widened": (
        lambda s: _types(s)["PairMetadata"]["required"].update(
            engine='Literal["eager", "frozen", "new"]'
        ),
        "PairMetadata.engine retyped",
    ),
    "an optional key made required": (
        lambda s: _types(s)["PairMetadata"]["required"].update(
            guards=_types(s)["PairMetadata"]["optional"].pop("guards")
        ),
        "PairMetadata.guards was optional, is required",
    ),
    "a required key made optional": (
        lambda s: _types(s)["Dynamic"]["optional"].update(
            guards=_types(s)["Dynamic"]["required"].pop("guards")
        ),
        "Dynamic.guards was required, is optional",
    ),
    "a required key added": (
        lambda s: _types(s)["Kernel"]["required"].update(arch="str"),
        "Kernel.arch (required, str) added",
    ),
    "the format renamed": (lambda s: _pair(s).update(format="other"), "the format name changed"),
}


@pytest.mark.parametrize("change", INCOMPATIBLE.values(), ids=list(INCOMPATIBLE))
def test_an_incompatible_change_needs_a_new_version(change):
    edit, finding = change
    old = schema_snapshot.snapshot()
    new = copy.deepcopy(old)
    edit(new)
    found = problems(old, new)
    where = "pair_metadata (VERSION 1 in runtime/precompile_runtime/pair_format.py): "
    assert found and all(f.startswith(where) for f in found), found
    assert any(f.startswith(where + finding) for f in found), found
    message = schema_snapshot.explain(old, new)
    assert "changed incompatibly without a version change" in message
    assert "Move VERSION" in message and message.endswith(REGENERATE)
    _pair(new)["version"] += 1
    assert problems(old, new) == []
    assert "VERSION 1 -> 2" in schema_snapshot.explain(old, new)


COMPATIBLE = {
    "an optional key added": (
        lambda s: _types(s)["PairMetadata"]["optional"].update(extra="list[str]"),
        "PairMetadata.extra (optional, list[str]) added",
    ),
    "an optional key of a nested TypedDict added": (
        lambda s: _types(s)["TensorSpec"]["optional"].update(memory_format="str"),
        "TensorSpec.memory_format (optional, str) added",
    ),
    "a TypedDict renamed, its keys unchanged": (
        lambda s: _rename_type(s, "TensorSpec", "TensorInfo"),
        "TypedDict TensorSpec renamed TensorInfo, its keys unchanged",
    ),
}


@pytest.mark.parametrize("change", COMPATIBLE.values(), ids=list(COMPATIBLE))
def test_a_compatible_change_keeps_the_version_and_regenerates_the_snapshot(change):
    edit, finding = change
    old = schema_snapshot.snapshot()
    new = copy.deepcopy(old)
    edit(new)
    assert problems(old, new) == []
    incompatible, compatible = changes(_pair(old), _pair(new))
    assert incompatible == [] and finding in compatible
    message = schema_snapshot.explain(old, new)
    assert "no version needs to move" in message and f"pair_metadata: {finding}" in message
    assert message.endswith(REGENERATE)


def test_a_version_never_goes_down():
    old = schema_snapshot.snapshot()
    new = copy.deepcopy(old)
    old["formats"]["manifest"]["version"] += 1
    assert problems(old, new) == [
        f"manifest: VERSION went down, {manifest.VERSION + 1} -> {manifest.VERSION} "
        "(runtime/precompile_runtime/manifest.py)"
    ]


def test_the_command_writes_checks_and_refuses(tmp_path, capsys):
    """It writes a missing or compatibly changed snapshot; ``--check`` only compares; it
    refuses to write over a snapshot the tree changed incompatibly without a new version."""
    path = tmp_path / "schema_snapshot.json"
    assert schema_snapshot.main([str(path), "--check"]) == 1
    assert schema_snapshot.main([str(path)]) == 0
    assert json.loads(path.read_text()) == schema_snapshot.snapshot()
    assert schema_snapshot.main([str(path), "--check"]) == 0

    older = schema_snapshot.snapshot()
    _types(older)["PairMetadata"]["optional"].pop("guards")  # the tree added it since
    path.write_text(schema_snapshot.dumps(older))
    assert schema_snapshot.main([str(path), "--check"]) == 1
    assert schema_snapshot.main([str(path)]) == 0
    assert (
        "pair_metadata: PairMetadata.guards (optional, dict[str, Any]) added"
        in capsys.readouterr().out
    )
    assert json.loads(path.read_text()) == schema_snapshot.snapshot()

    _types(older)["PairMetadata"]["optional"]["gone"] = "str"  # the tree removed it
    path.write_text(schema_snapshot.dumps(older))
    capsys.readouterr()
    assert schema_snapshot.main([str(path)]) == 1
    assert "PairMetadata.gone (optional, str) removed or renamed" in capsys.readouterr().err
    assert path.read_text() == schema_snapshot.dumps(older)  # left as it was


def test_a_bare_generic_and_its_any_spelling_are_one_schema():
    """``list`` and ``list[Any]`` (what ``mypy --strict`` asks for) are the same type:
    spelling one as the other is no change, while a real argument is."""
    assert (
        schema_snapshot.type_text(list[list[Any]], {})
        == schema_snapshot.type_text(list[list], {})
        == "list[list]"
    )
    assert schema_snapshot.type_text(dict[str, list[Any]], {}) == "dict[str, list]"
    assert schema_snapshot.type_text(list[list[int]], {}) == "list[list[int]]"
