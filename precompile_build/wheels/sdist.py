"""Make a setuptools sdist carry the capture scripts and no artifacts.

A capture script usually lives outside the package (``captures/llama.py``), where
setuptools' sdist does not look; so do the modules it imports from its own folder
(``captures/shapes.py``: the script's folder is first on its ``sys.path``). The sdist
gets both, or a wheel built from it (what ``python -m build`` does) fails to capture.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Optional

from ..builder.workdir import out_tempdir
from ..config.settings import Settings
from ..errors import BuildError
from .rewrite import PRECOMPILED


def _mtime() -> int:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(epoch) if epoch.isdigit() else 0


def mark_dynamic(text: str) -> str:
    """PKG-INFO with ``Dynamic: Requires-Dist`` (PEP 643): the wheel's requirements
    are decided by its build (precompile-runtime, the torch pin), so tools must not
    take the sdist's list as final. Raises Metadata-Version to 2.2 where lower.
    Idempotent; the description body is untouched."""
    head, sep, body = text.partition("\n\n")
    if not sep:
        head, sep, body = text.rstrip("\n"), "\n", ""
    lines = head.split("\n")
    if any(ln.lower().replace(" ", "") == "dynamic:requires-dist" for ln in lines):
        return text
    for i, ln in enumerate(lines):
        if ln.startswith("Metadata-Version:"):
            try:
                major, minor = (int(x) for x in ln.split(":", 1)[1].strip().split(".")[:2])
            except ValueError:
                continue
            if (major, minor) < (2, 2):
                lines[i] = "Metadata-Version: 2.2"
    idx = max(
        (i for i, ln in enumerate(lines) if ln.startswith("Requires-Dist:")), default=len(lines) - 1
    )
    lines.insert(idx + 1, "Dynamic: Requires-Dist")
    return "\n".join(lines) + sep + body


def _normal_mode(info: tarfile.TarInfo) -> int:
    """0o755 for directories and executables, 0o644 for other files (as `wheel`
    does), so the sdist does not depend on the builder's umask."""
    return 0o755 if info.isdir() or info.mode & 0o111 else 0o644


def _pkg_info(info: tarfile.TarInfo, data: bytes | None, base: str) -> bytes | None:
    parts = info.name.split("/")
    if (
        data is None
        or parts[-1] != "PKG-INFO"
        or parts[0] != base
        or not (len(parts) == 2 or (len(parts) == 3 and parts[1].endswith(".egg-info")))
    ):
        return data
    out = mark_dynamic(data.decode("utf-8")).encode("utf-8")
    info.size = len(out)
    return out


def _capture_files(settings: Settings) -> list[Path]:
    """Each target's script and the ``*.py`` files beside it, inside the project root
    (a script outside it is refused when the settings are read), sorted."""
    root = settings.root.resolve()
    found: set[Path] = set()
    for t in settings.targets.values():
        script = Path(os.path.normpath(settings.root / t.script_rel))
        found.add(script)
        if script.parent.resolve().is_relative_to(root):
            found.update(p for p in script.parent.glob("*.py") if p.is_file())
    return sorted(found)


def package_sdist(
    sdist_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], settings: Settings
) -> Path:
    """Rewrite an sdist: add every configured capture script it lacks, and the Python
    modules beside each script (its folder's ``*.py``, not its subfolders), drop
    ``<package>/_precompiled/`` (artifacts of an editable build in the source tree).

    Every ``PKG-INFO`` gets ``Dynamic: Requires-Dist`` (:func:`mark_dynamic`); file
    modes are normalised (0o644, or 0o755 for directories and executables).

    Args:
        sdist_path: the ``.tar.gz`` setuptools built.
        out_dir: where the result goes, under the same name (written to a temp
            file beside it, then renamed).
        settings: the project's settings (scripts, package directory).
    Returns:
        path of the new sdist.
    Raises:
        BuildError: the sdist cannot be read.
    """
    sdist_path, out_dir = Path(sdist_path), Path(out_dir)
    rel_pkg = settings.package_dir.relative_to(settings.root).as_posix()
    try:
        with tarfile.open(sdist_path, "r:gz") as src:
            members = [
                (m, src.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                for m in src.getmembers()
            ]
    except (OSError, tarfile.TarError) as e:
        raise BuildError(f"Failed to read sdist {sdist_path}: {e}") from None
    base = members[0][0].name.split("/")[0] if members else sdist_path.name[:-7]
    drop = f"{base}/{rel_pkg}/{PRECOMPILED}"
    kept: list[tuple[tarfile.TarInfo, Optional[bytes]]] = [
        (m, d) for m, d in members if m.name != drop and not m.name.startswith(drop + "/")
    ]
    for m, _ in kept:
        m.mode = _normal_mode(m)
    kept = [(m, _pkg_info(m, d, base)) for m, d in kept]
    names = {m.name for m, _ in kept}
    for path in _capture_files(settings):
        arc = f"{base}/{path.relative_to(settings.root).as_posix()}"
        if arc not in names:
            data = path.read_bytes()
            info = tarfile.TarInfo(arc)
            info.size, info.mode, info.mtime = len(data), 0o644, _mtime()
            kept.append((info, data))
            names.add(arc)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_tempdir(out_dir)  # (sweeps the ones killed builds left there)
    try:
        with (
            open(tmp / sdist_path.name, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_mtime()) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as dst,
        ):
            for info, blob in kept:
                dst.addfile(info, io.BytesIO(blob) if blob is not None else None)
        os.replace(tmp / sdist_path.name, out_dir / sdist_path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / sdist_path.name
