"""The schema snapshot of the formats a wheel carries, and the rule of when their
version must move.

The formats: the pair metadata (``PRECOMPILE_METADATA`` of a source half,
``PairMetadata`` in precompile_runtime/pair_format.py) and the manifest (``Manifest``
in precompile_runtime/manifest.py). The snapshot of each is its format name, its
``VERSION`` and every TypedDict it is made of, read from the TypedDicts themselves
(``typing.get_type_hints``, ``__required_keys__``, ``__optional_keys__``): the
required keys and the optional keys, each with its type. tests/data/schema_snapshot.json
is the checked-in snapshot; tests/test_schema_snapshot.py fails when the tree's schema
differs from it, as torch's ``_export/serde/schema.yaml`` and ``schema_check.py`` do.

When the version must move (:func:`changes`): a change that a reader of the same
version could misread is incompatible and takes a new ``VERSION``: a key removed or
renamed, a key's type changed (a ``Literal``'s values included), an optional key made
required or a required one optional, a required key added, the format name changed.
Adding an optional key is compatible (a reader must not require an optional key, and
ignores keys it does not know), and so is renaming a TypedDict whose keys stay the same
(the JSON does not change). A compatible change keeps the version; the snapshot is
regenerated either way, in the commit that changes the format::

    python -m precompile_build.wheels.schema_snapshot              # tests/data/schema_snapshot.json
    python -m precompile_build.wheels.schema_snapshot --check      # compare only

It refuses to write an incompatible change whose version did not move.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from precompile_runtime import manifest, pair_format

SNAPSHOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "schema_snapshot.json"
"""The checked-in snapshot, in a checkout of this repository."""
REGENERATE = "python -m precompile_build.wheels.schema_snapshot"
"""The command that writes :data:`SNAPSHOT` from the tree."""

# snapshot name -> (module, root TypedDict, the module's file, for messages)
FORMATS: dict[str, tuple[Any, type, str]] = {
    "pair_metadata": (
        pair_format,
        pair_format.PairMetadata,
        "runtime/precompile_runtime/pair_format.py",
    ),
    "manifest": (manifest, manifest.Manifest, "runtime/precompile_runtime/manifest.py"),
}

RULE = (
    "a change a reader of the same version could misread takes a new VERSION (a key "
    "removed, renamed or retyped, made required or optional, a required key added); "
    "adding an optional key keeps it"
)

_UNION_TYPE = getattr(types, "UnionType", None)  # `X | Y` (Python 3.10+)


def _is_typeddict(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def type_text(tp: Any, found: dict[str, type]) -> str:
    """``tp`` as text (``list[Union[int, str]]``, ``Optional[Collectives]``,
    ``Literal["cpu", "cuda"]``): TypedDicts by their name, added to ``found``; a union's
    members and a ``Literal``'s values sorted, so that their order is no change."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if _is_typeddict(tp):
        seen = found.setdefault(tp.__name__, tp)
        if seen is not tp:
            raise TypeError(
                f"two TypedDicts named {tp.__name__!r} in one format: "
                f"{seen.__module__} and {tp.__module__}"
            )
        return str(tp.__name__)
    origin = get_origin(tp)
    if origin is Literal:
        return "Literal[" + ", ".join(sorted(json.dumps(a) for a in get_args(tp))) + "]"
    if origin is Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        members = sorted(type_text(a, found) for a in get_args(tp) if a is not type(None))
        if len(members) < len(get_args(tp)):  # None was one
            return (
                f"Optional[{members[0]}]"
                if len(members) == 1
                else f"Union[{', '.join(members)}, None]"
            )
        return f"Union[{', '.join(members)}]"
    if origin is not None:
        texts = [type_text(a, found) for a in get_args(tp)]
        name = getattr(origin, "__name__", str(origin))
        if all(t == "Any" for t in texts) and not (name == "tuple" and len(texts) == 1):
            texts = []  # list[Any] is the bare list: the same schema, however it is spelled
        return f"{name}[{', '.join(texts)}]" if texts else name
    if isinstance(tp, type):
        return tp.__name__
    raise TypeError(f"no schema text for the type {tp!r}")


def schema(root: type) -> dict[str, dict[str, dict[str, str]]]:
    """TypedDict name -> ``{"required": {key: type}, "optional": {key: type}}`` for
    ``root`` and every TypedDict its keys' types reach."""
    found: dict[str, type] = {}
    type_text(root, found)
    out: dict[str, dict[str, dict[str, str]]] = {}
    while len(out) < len(found):
        name = next(n for n in found if n not in out)
        td = found[name]
        hints = get_type_hints(td)
        out[name] = {
            "required": {k: type_text(hints[k], found) for k in sorted(td.__required_keys__)},  # type: ignore[attr-defined]
            "optional": {k: type_text(hints[k], found) for k in sorted(td.__optional_keys__)},  # type: ignore[attr-defined]
        }
    return out


def snapshot() -> dict[str, Any]:
    """The tree's snapshot: per format its module, format name, version, root TypedDict
    and :func:`schema`."""
    formats = {}
    for name, (module, root, _) in FORMATS.items():
        formats[name] = {
            "module": module.__name__,
            "format": module.FORMAT,
            "version": module.VERSION,
            "root": root.__name__,
            "types": schema(root),
        }
    return {
        "about": f"written by `{REGENERATE}`; when VERSION must move: its docstring",
        "formats": formats,
    }


def _renames(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """Old TypedDict name -> new name, for TypedDicts renamed with their keys unchanged."""
    gone = [n for n in old if n not in new]
    added = [n for n in new if n not in old]
    return {
        o: next(a for a in added if new[a] == old[o])
        for o in gone
        if any(new[a] == old[o] for a in added)
    }


def changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(incompatible, compatible)``: the changes from format ``old`` to ``new`` (entries of
    a snapshot's ``formats``), versions left aside, each as a line of text."""
    incompatible: list[str] = []
    compatible: list[str] = []
    if old["format"] != new["format"]:
        incompatible.append(f"the format name changed: {old['format']!r} -> {new['format']!r}")
    renames = _renames(old["types"], new["types"])
    compatible += [
        f"TypedDict {o} renamed {n}, its keys unchanged" for o, n in sorted(renames.items())
    ]

    def renamed(text: str) -> str:
        for o, n in renames.items():
            text = re.sub(rf"\b{re.escape(o)}\b", n, text)
        return text

    for name, definition in sorted(old["types"].items()):
        now = new["types"].get(renames.get(name, name))
        if now is None:
            continue  # no key's type names it any more: that key's change is reported
        for kind, other in (("required", "optional"), ("optional", "required")):
            for key, text in sorted(definition[kind].items()):
                where = f"{name}.{key}"
                if key in now[other]:
                    incompatible.append(f"{where} was {kind}, is {other}")
                elif key not in now[kind]:
                    incompatible.append(f"{where} ({kind}, {text}) removed or renamed")
                elif now[kind][key] != renamed(text):
                    incompatible.append(f"{where} retyped: {text} -> {now[kind][key]}")
            for key, text in sorted(now[kind].items()):
                if key not in definition["required"] and key not in definition["optional"]:
                    line = f"{name}.{key} ({kind}, {text}) added"
                    (incompatible if kind == "required" else compatible).append(line)
    for name in sorted(set(new["types"]) - set(old["types"]) - set(renames.values())):
        compatible.append(f"TypedDict {name} added")
    return incompatible, compatible


def problems(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes snapshot ``new`` no valid successor of ``old``: an incompatible change of a
    format whose version did not move, or a version that went down."""
    found = []
    for name, now in new["formats"].items():
        before = old["formats"].get(name)
        if before is None:
            continue
        where = FORMATS[name][2] if name in FORMATS else now["module"]
        if now["version"] < before["version"]:
            found.append(
                f"{name}: VERSION went down, {before['version']} -> {now['version']} ({where})"
            )
        elif now["version"] == before["version"]:
            incompatible, _ = changes(before, now)
            found += [
                f"{name} (VERSION {now['version']} in {where}): {line}" for line in incompatible
            ]
    return found


def summary(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every change from snapshot ``old`` to ``new``, a line each, versions included."""
    lines = []
    for name, now in new["formats"].items():
        before = old["formats"].get(name)
        if before is None:
            lines.append(f"{name}: a new format")
            continue
        if before["version"] != now["version"]:
            lines.append(f"{name}: VERSION {before['version']} -> {now['version']}")
        incompatible, compatible = changes(before, now)
        lines += [f"{name}: {line}" for line in incompatible + compatible]
    lines += [
        f"{name}: no longer in the snapshot"
        for name in old["formats"]
        if name not in new["formats"]
    ]
    return lines


def explain(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Why snapshot ``old`` (the checked-in one) is not ``new`` (the tree's), and what to do."""
    found = problems(old, new)
    if found:
        return (
            "the pair metadata or manifest changed incompatibly without a version change:\n  "
            + "\n  ".join(found)
            + f"\nRule: {RULE}. Move VERSION in the module named (for the pair metadata also "
            "READS, the versions the runtime loads), then regenerate the snapshot: "
            f"{REGENERATE}"
        )
    return (
        "tests/data/schema_snapshot.json is not the tree's schema (no version needs to move):\n  "
        + "\n  ".join(summary(old, new) or ["(its other entries)"])
        + f"\nRule: {RULE}. Regenerate it and commit it with the change: {REGENERATE}"
    )


def dumps(snap: dict[str, Any]) -> str:
    """The snapshot file's text: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(snap, sort_keys=True, indent=2) + "\n"


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    """The command (see the module's docstring) with ``argv`` (None: ``sys.argv[1:]``);
    returns its exit status: 0 written or up to date, 1 refused or (``--check``) not
    the tree's schema."""
    parser = argparse.ArgumentParser(
        prog=REGENERATE,
        description=(
            "Write the schema snapshot of the pair metadata and the manifest from the tree; "
            f"refused where a format changed incompatibly without a version change ({RULE})."
        ),
    )
    parser.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=SNAPSHOT,
        help=f"the snapshot file (default: {SNAPSHOT})",
    )
    parser.add_argument("--check", action="store_true", help="compare only: exit 1 when it differs")
    args = parser.parse_args(argv)
    current = snapshot()
    try:
        old = json.loads(args.path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        old = None
    if old == current:
        print(f"{args.path}: up to date")
        return 0
    if old is not None and (args.check or problems(old, current)):
        print(f"{args.path}: {explain(old, current)}", file=sys.stderr)
        return 1
    if args.check:
        print(f"{args.path}: missing; write it with {REGENERATE}", file=sys.stderr)
        return 1
    _write(args.path, dumps(current))
    print("\n  ".join([f"{args.path}: written", *(summary(old, current) if old else [])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
