"""Rewrite a setuptools-built wheel: add `_precompiled/`, requirements, retag.

All zip work goes through :class:`wheel.wheelfile.WheelFile`: reading verifies every
entry against RECORD, writing computes RECORD on close and honours
``SOURCE_DATE_EPOCH``. Entries are written sorted, ``.dist-info`` last.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from wheel.wheelfile import WHEEL_INFO_RE, WheelFile, get_zipinfo_datetime

from ..builder.workdir import out_tempdir
from ..errors import BuildError

NATIVE_ENGINES = ("frozen", "torch")
PRECOMPILED = "_precompiled"

Entries = dict[str, tuple[bytes, Optional[int]]]  # arcname -> (bytes, unix mode bits or None)


def read_wheel(path: str | os.PathLike[str]) -> Entries:
    """Every entry of a wheel except RECORD, verified against RECORD.

    Returns ``{arcname: (data, mode)}`` (mode: unix permission bits or None).
    Raises BuildError on a bad name, a missing RECORD or a hash mismatch.
    """
    try:
        with WheelFile(path) as wf:
            out: Entries = {}
            for info in wf.infolist():
                if info.filename == wf.record_path or info.filename.endswith("/"):
                    continue
                with wf.open(info) as f:
                    data = f.read()
                mode = (info.external_attr >> 16) & 0o7777 or None
                out[info.filename] = (data, mode)
            return out
    except Exception as e:  # noqa: BLE001 - WheelError, BadZipFile, OSError, a bad RECORD line
        raise BuildError(f"Failed to read wheel {os.fspath(path)}: {e}") from None


def parse_name(path: str | os.PathLike[str]) -> dict[str, Optional[str]]:
    """Parts of a wheel file name: namever, name, ver, build, pyver, abi, plat."""
    m = WHEEL_INFO_RE.match(os.path.basename(path))
    if m is None:
        raise BuildError(f"Failed to read wheel {os.fspath(path)}: not a wheel file name")
    parts: dict[str, Optional[str]] = m.groupdict()
    return parts


def normal_mode(mode: Optional[int]) -> int:
    """0o755 for an executable (any x bit), else 0o644: the builder's umask must not
    reach the wheel (0o600 under umask 077), as in hatchling's and
    scikit-build-core's reproducible wheels."""
    return 0o755 if mode and mode & 0o111 else 0o644


def write_wheel(out_dir: str | os.PathLike[str], name: str, entries: Entries) -> Path:
    """Write ``entries`` as wheel ``out_dir/name``, atomically.

    Builds in a temp directory beside the output, then renames; on failure no
    file (partial or temp) is left, and one a killed build left is removed by the
    next write into ``out_dir`` (builder/workdir.py). Modes are normalised (:func:`normal_mode`).
    Returns the wheel's path.
    """
    import logging

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_tempdir(out_dir)  # (sweeps the ones killed builds left there)
    quiet = logging.getLogger("wheel")  # its "adding 'FILE'" lines: the backend's wheel listed
    level = quiet.level  # them already (a build log had every file twice); the build says
    quiet.setLevel(logging.WARNING)  # what it added in one line (backend._package)
    try:
        with WheelFile(tmp / name, "w") as wf:
            dist_info = wf.dist_info_path + "/"
            ordered = sorted(entries, key=lambda a: (a.startswith(dist_info), a))
            for arc in ordered:
                data, mode = entries[arc]
                info = zipfile.ZipInfo(arc, date_time=get_zipinfo_datetime())
                info.external_attr = (normal_mode(mode) | 0o100000) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                wf.writestr(info, data)
        os.replace(tmp / name, out_dir / name)
    finally:
        quiet.setLevel(level)
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / name


def _installed_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def runtime_requirement() -> str:
    """``precompile-runtime>=X.Y`` for the installed runtime (bare name if unknown)."""
    version = _installed_version("precompile-runtime")
    if version is None:
        try:
            import precompile_runtime

            version = getattr(precompile_runtime, "__version__", None)
        except ImportError:  # pragma: no cover
            version = None
    try:
        v = Version(version) if version else None
    except InvalidVersion:
        v = None
    return f"precompile-runtime>={v.major}.{v.minor}" if v else "precompile-runtime"


def torch_requirement(torch_version: Optional[str], policy: str) -> Optional[str]:
    """The torch pin for ``policy`` (`exact`, `minor`, `none`).

    Args:
        torch_version: the capture host's torch (e.g. ``2.13.0+cu130``), or None.
    Returns:
        ``torch==2.13.0`` / ``torch>=2.13,<2.14`` / None (policy none, or no torch).
    """
    if policy == "none" or not torch_version:
        return None
    v = Version(torch_version)
    if policy == "exact":
        return f"torch=={v.public}"
    return f"torch>={v.major}.{v.minor},<{v.major}.{v.minor + 1}"


def build_requirements(variants: Iterable[Mapping[str, Any]], policy: str) -> list[str]:
    """Requirements the wheel gains: precompile-runtime, then the torch pin.

    The torch version is the one recorded in the variants' fingerprints, else the
    torch installed where the build runs. Raises BuildError when variants disagree.
    """
    versions = {v["fingerprint"].get("torch") for v in variants} - {None}
    if len(versions) > 1:
        raise BuildError(
            "Failed to pin torch: variants were captured with different "
            f"torch versions ({', '.join(sorted(versions))})"
        )
    version = versions.pop() if versions else _installed_version("torch")
    pin = torch_requirement(version, policy)
    return [runtime_requirement()] + ([pin] if pin else [])


def requirement_of(line: str) -> Optional[Requirement]:
    """The requirement of a METADATA ``Requires-Dist:`` line (``packaging``'s parse), or
    None for another header or a requirement it cannot read."""
    name, sep, value = line.partition(":")
    if not sep or name != "Requires-Dist":
        return None
    try:
        return Requirement(value.strip())
    except InvalidRequirement:
        return None


def requires_project(line: str, project: str) -> bool:
    """Whether METADATA ``line`` is a ``Requires-Dist`` of ``project`` (names compared
    canonically: ``Torch``, ``torch``)."""
    req = requirement_of(line)
    return req is not None and canonicalize_name(req.name) == canonicalize_name(project)


def written_requirements(wheel: Path, requires: Sequence[str]) -> list[str]:
    """The ``Requires-Dist`` values of ``wheel``'s METADATA for the projects of
    ``requires``, as :func:`patch_metadata` left them (the library's own line of a
    project kept or merged: ``torch==2.13.0,>=1.13``, a bare ``precompile-runtime``)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(
            n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1
        )
        head = zf.read(name).decode("utf-8").partition("\n\n")[0]
    names = {canonicalize_name(Requirement(r).name) for r in requires}
    return [
        ln.split(":", 1)[1].strip()
        for ln in head.split("\n")
        if any(requires_project(ln, n) for n in names)
    ]


def insert_requires(lines: list[str], new: Sequence[str]) -> list[str]:
    """Header ``lines`` with the ``Requires-Dist`` lines ``new`` after the last one
    there (after the last header when there is none)."""
    idx = max(
        (i for i, ln in enumerate(lines) if ln.startswith("Requires-Dist:")), default=len(lines) - 1
    )
    return lines[: idx + 1] + list(new) + lines[idx + 1 :]


def patch_metadata(text: str, requires: Sequence[str]) -> str:
    """METADATA with the build's requirements merged in: one line per project.

    A project the metadata already requires is not added again: its existing lines
    (any markers and extras kept) get the build's version specifier added, so
    ``torch`` and ``torch==2.13.0`` become one ``torch==2.13.0``; an existing
    ``precompile-runtime`` line is kept as it is. Other requirements are added after
    the existing ``Requires-Dist`` lines. Idempotent. Headers end at the first blank
    line; the description body is untouched.

    Raises:
        BuildError: an existing requirement excludes the version the build pins
            (``torch<2`` in ``project.dependencies`` and artifacts for torch 2.13).
    """
    head, sep, body = text.partition("\n\n")
    if not sep:  # no description body
        head, sep, body = text.rstrip("\n"), "\n", ""
    lines = head.split("\n")
    new = []
    for r in requires:
        want = Requirement(r)
        name = canonicalize_name(want.name)
        hits = [i for i, ln in enumerate(lines) if requires_project(ln, name)]
        if not hits:
            new.append(f"Requires-Dist: {r}")
            continue
        if name == "precompile-runtime":
            continue
        for i in hits:
            got = requirement_of(lines[i])
            assert got is not None
            pinned = [s for s in want.specifier if s.operator == "=="]
            if pinned and not got.specifier.contains(pinned[0].version, prereleases=True):
                raise BuildError(
                    f"Failed to write the wheel's metadata: the artifacts need {r}, but "
                    f"`project.dependencies` requires {got}; widen that requirement or "
                    "build with the torch it allows"
                )
            got.specifier &= want.specifier
            lines[i] = f"Requires-Dist: {got}"
    return "\n".join(insert_requires(lines, new)) + sep + body


def patch_wheel_info(text: str, tags: Sequence[str]) -> str:
    """WHEEL file with its Tag lines replaced and Root-Is-Purelib matching them."""
    purelib = all(t.endswith("-none-any") for t in tags)
    out = []
    for ln in text.rstrip("\n").split("\n"):
        if ln.startswith("Tag:"):
            continue
        if ln.startswith("Root-Is-Purelib:"):
            ln = f"Root-Is-Purelib: {'true' if purelib else 'false'}"
        out.append(ln)
    return "\n".join(out + [f"Tag: {t}" for t in tags]) + "\n"


def compress_tags(tags: Sequence[str]) -> str:
    """The file-name tag part for ``tags`` (PEP 425 compressed tag sets)."""
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    return "-".join(".".join(p) for p in parts)


def wheel_name(parsed: Mapping[str, Optional[str]], tags: Sequence[str]) -> str:
    """File name for a wheel of ``parsed`` (see :func:`parse_name`) with ``tags``."""
    build = f"-{parsed['build']}" if parsed.get("build") else ""
    return f"{parsed['namever']}{build}-{compress_tags(tags)}.whl"


def package_wheel(
    wheel_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    package: str,
    files: Optional[Mapping[str, bytes]],
    requires: Sequence[str],
    *,
    native: bool,
    kernels: Optional[Mapping[str, bytes]] = None,
) -> Path:
    """Rewrite a wheel with `_precompiled/` files, requirements and tags.

    Args:
        wheel_path: the wheel setuptools built.
        out_dir: where the result goes (may hold ``wheel_path``).
        package: import package; files go to ``<package>/_precompiled/NAME``.
            Stale ``<package>/_precompiled/`` entries of the input are dropped.
        files: ``{file name: bytes}`` (see ``wheels.manifest.assemble``), or None
            to add nothing (editable wheels).
        requires: requirement strings to add as ``Requires-Dist``.
        native: retag for the kernels (frozen/torch engines):
            :func:`precompile_build.wheels.platform_tags.wheel_tags` of the wheel's entries
            and ``kernels`` (a ``manylinux_X_Y`` tag where a policy fits).
        kernels: more ``{name: bytes}`` to inspect for the tag (an editable wheel's
            ``_precompiled/`` files, which live in the source tree).
    Returns:
        path of the new wheel. The input is removed when the name changed.
    Raises:
        BuildError: the input wheel is unreadable or invalid.
    """
    wheel_path = Path(wheel_path)
    parsed = parse_name(wheel_path)
    entries = read_wheel(wheel_path)
    prefix = f"{package}/{PRECOMPILED}/"
    entries = {a: e for a, e in entries.items() if not a.startswith(prefix)}
    for name, data in (files or {}).items():
        entries[prefix + name] = (data, 0o644)
    dist_info = next(
        (a.split("/")[0] for a in entries if a.endswith(".dist-info/WHEEL") and a.count("/") == 1),
        None,
    )
    if dist_info is None:
        raise BuildError(f"Failed to read wheel {wheel_path}: no .dist-info/WHEEL")
    meta_arc, wheel_arc = f"{dist_info}/METADATA", f"{dist_info}/WHEEL"
    entries[meta_arc] = (
        patch_metadata(entries[meta_arc][0].decode(), requires).encode(),
        entries[meta_arc][1],
    )
    old_tags = [
        ln[4:].strip()
        for ln in entries[wheel_arc][0].decode().splitlines()
        if ln.startswith("Tag:")
    ]
    if native:
        from .platform_tags import wheel_tags

        inspected = {a: d for a, (d, _) in entries.items()}
        inspected.update({prefix + n: d for n, d in (kernels or {}).items()})
        tags = wheel_tags(inspected)
    else:
        tags = old_tags
    entries[wheel_arc] = (
        patch_wheel_info(entries[wheel_arc][0].decode(), tags).encode(),
        entries[wheel_arc][1],
    )
    out = write_wheel(out_dir, wheel_name(parsed, tags), entries)
    if out.resolve() != wheel_path.resolve() and wheel_path.exists():
        wheel_path.unlink()
    return out
