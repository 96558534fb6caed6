"""PEP 517 build backend: setuptools' plus the captures.

``build-backend = "precompile_build.backend"``. Every ``setuptools.build_meta`` hook
is re-exported (looked up lazily, so hooks setuptools adds later are inherited);
``build_wheel`` and ``build_editable`` run the capture scripts first and package
their pairs; ``build_sdist`` ships the capture scripts and no artifacts; the
``prepare_metadata_*`` hooks add the same ``Requires-Dist`` lines the wheel gets.

Captures run side by side and unchanged ones are reused from the capture cache
(``runner.run_captures``; `jobs`, `cache`, `cache-dir` settings).

Torch must be importable where the build runs (the scripts run with the build's
own interpreter): list it in ``build-system.requires`` or build with
``--no-isolation``. ``get_requires_for_build_wheel`` adds nothing.

Editable installs (PEP 660): the pairs and manifest are written into the *source*
package directory, ``<package dir>/_precompiled/`` (atomically, replacing an older
one), since an editable import resolves the package to the source tree. Add
``_precompiled/`` to ``.gitignore``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .builder.workdir import build_tempdir

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]


def __getattr__(name: str) -> Any:
    """Forward every other public hook to ``setuptools.build_meta``."""
    if name.startswith("_"):
        raise AttributeError(name)
    from setuptools import build_meta

    return getattr(build_meta, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _setuptools_settings(config_settings: Optional[Mapping[str, Any]]) -> Optional[dict]:
    if config_settings is None:
        return None
    return {k: v for k, v in config_settings.items() if not str(k).startswith("precompile.")}


def _settings(config_settings: Optional[Mapping[str, Any]]):
    from .config.settings import load_settings

    return load_settings(os.getcwd(), config_settings)


def _capture(settings, work: Path) -> dict[str, bytes]:
    from .builder.runner import run_captures
    from .wheels.manifest import assemble

    return assemble(settings.package, run_captures(settings, work))


def _requirements(settings, variants: list) -> list:
    """What the wheel's ``Requires-Dist`` gains: precompile-runtime and the torch pin
    of the captures; with `skip`, precompile-runtime only (there are no captures to
    take the torch version from; see :func:`_say_skipped`)."""
    from .wheels.rewrite import build_requirements, runtime_requirement

    return [runtime_requirement()] if settings.skip else build_requirements(
        variants, settings.torch_pin)


def _say_skipped(settings) -> None:
    """One line on stderr: the wheel is built without its precompiled targets."""
    import sys

    from .wheels.rewrite import runtime_requirement

    print(f"precompile: skipped the precompiled targets ({', '.join(settings.targets)}) "
          "as `skip` asks (-C precompile.skip=true or PRECOMPILE_SKIP): the wheel has no "
          f"_precompiled/ and adds {runtime_requirement()} to its requirements but no torch "
          "pin, which comes from the captures' torch (list torch in `project.dependencies` "
          "if the library needs it)", file=sys.stderr)


def _package(settings, plain: Path, out_dir: str, files: dict, *, add: bool) -> str:
    """Rewrite setuptools' wheel ``plain`` into ``out_dir``; ``add``: put ``files``
    into it (regular wheel) or only take requirements and tags from them (editable)."""
    from .wheels.manifest import variants
    from .wheels.rewrite import NATIVE_ENGINES, package_wheel

    found = variants(files) if files else []  # skip: no captures, no manifest
    native = any(v["engine"] in NATIVE_ENGINES for v in found)
    requires = _requirements(settings, found)
    _warn_static_dependencies(settings.project, requires)
    return package_wheel(plain, out_dir, settings.package, files if add else None,
                         requires, native=native, kernels=files).name


def static_dependencies_gap(project: Optional[Mapping[str, Any]], requires: list) -> list:
    """The build's requirements that ``project.dependencies`` does not already state,
    when that list is static (not in ``project.dynamic``); [] when it is dynamic.

    Args:
        project: the `[project]` table of pyproject.toml as parsed
            (:attr:`precompile_build.config.settings.Settings.project`; None: no such table,
            the metadata comes from setup.py/setup.cfg).
        requires: requirement strings the build adds (``wheel.build_requirements``).
    Returns:
        those of ``requires`` that a static ``dependencies`` lacks (or pins to
        something else); [] when ``dependencies`` is dynamic or ``project`` is None.
    Raises:
        nothing: an unparsable line of ``dependencies`` is skipped (setuptools
        reports it).

    Tools that read pyproject.toml (uv) take static dependencies as final, so these
    would not be installed by them: list them, or make the dependencies dynamic.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if not isinstance(project, Mapping) or "dependencies" in (project.get("dynamic") or []):
        return []
    static = []
    for line in project.get("dependencies") or []:
        try:
            static.append(Requirement(line))
        except InvalidRequirement:
            continue
    gap = []
    for r in requires:
        want = Requirement(r)
        same = [s for s in static if canonicalize_name(s.name) == canonicalize_name(want.name)]
        if not same or (canonicalize_name(want.name) != "precompile-runtime"
                        and not any(set(s.specifier) >= set(want.specifier) for s in same)):
            gap.append(r)
    return gap


def _warn_static_dependencies(project: Optional[Mapping[str, Any]], requires: list) -> None:
    import sys

    gap = static_dependencies_gap(project, requires)
    if gap:
        print("precompile: warning: `project.dependencies` in pyproject.toml is static, but "
              f"this build adds {', '.join(gap)} to the wheel; tools that read "
              "pyproject.toml (uv) will not install them. Add \"dependencies\" to "
              "`project.dynamic` (list your own in `[tool.setuptools.dynamic]`), or add "
              "these to `project.dependencies` (docs/publishing.md)", file=sys.stderr)


def build_wheel(wheel_directory: str, config_settings: Optional[Mapping[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    """Run the captures, build the wheel with setuptools, add `_precompiled/`.

    Returns the wheel's file name in ``wheel_directory``. Raises ConfigError before
    any capture, CaptureError for a failed required target; no wheel is left in
    ``wheel_directory`` on failure.
    """
    from setuptools import build_meta

    settings = _settings(config_settings)
    st_settings = _setuptools_settings(config_settings)
    if settings.skip:
        _say_skipped(settings)
    with build_tempdir() as tmp:
        files = {} if settings.skip else _capture(settings, Path(tmp) / "capture")
        name = build_meta.build_wheel(str(Path(tmp) / "wheel"), st_settings,
                                      metadata_directory)
        return _package(settings, Path(tmp) / "wheel" / name, wheel_directory, files,
                        add=True)


def build_editable(wheel_directory: str, config_settings: Optional[Mapping[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """PEP 660: run the captures, write them to ``<package dir>/_precompiled/`` in the
    source tree, then build setuptools' editable wheel (requirements added).

    The manifest records the package source's digest (``editable``), so a load after
    the source changed serves no stale kernels. With ``editable_mode=strict``
    (setuptools' link tree under ``build/``), ``_precompiled/`` is written into the
    link tree too: it holds only what setuptools knew of."""
    from setuptools import build_meta

    from .builder.capture_cache import package_digest
    from .wheels.manifest import mark_editable, write_dir_atomic
    from .wheels.rewrite import PRECOMPILED

    settings = _settings(config_settings)
    st_settings = _setuptools_settings(config_settings)
    if settings.skip:  # the source tree's _precompiled/ is left as it is
        _say_skipped(settings)
        with build_tempdir() as tmp:
            name = build_meta.build_editable(str(Path(tmp) / "wheel"), st_settings,
                                             metadata_directory)
            return _package(settings, Path(tmp) / "wheel" / name, wheel_directory, {},
                            add=False)
    with build_tempdir() as tmp:
        digest = package_digest(settings.package_dir)
        files = mark_editable(_capture(settings, Path(tmp) / "capture"),
                              settings.package_dir, digest)
        name = build_meta.build_editable(str(Path(tmp) / "wheel"), st_settings,
                                         metadata_directory)
        write_dir_atomic(settings.package_dir / PRECOMPILED, files)
        for tree in _link_trees(Path(tmp) / "wheel" / name):
            pkg = tree.joinpath(*settings.package.split("."))
            if pkg.is_dir() and pkg.resolve() != settings.package_dir.resolve():
                write_dir_atomic(pkg / PRECOMPILED, files)
        return _package(settings, Path(tmp) / "wheel" / name, wheel_directory, files,
                        add=False)


def _link_trees(editable_wheel: Path) -> list:
    """Directories an editable wheel's ``.pth`` files put on ``sys.path`` (strict
    mode: setuptools' link tree; lenient mode: none, or the source tree's root)."""
    import zipfile

    out = []
    with zipfile.ZipFile(editable_wheel) as zf:
        for n in zf.namelist():
            if "/" in n or not n.endswith(".pth"):
                continue
            for line in zf.read(n).decode("utf-8", "replace").splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import ")) and Path(line).is_dir():
                    out.append(Path(line))
    return out


def build_sdist(sdist_directory: str,
                config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """setuptools' sdist, plus every capture script, minus `_precompiled/`."""
    from setuptools import build_meta

    from .wheels.sdist import package_sdist

    settings = _settings(config_settings)
    with build_tempdir() as tmp:
        name = build_meta.build_sdist(tmp, _setuptools_settings(config_settings))
        return package_sdist(Path(tmp) / name, sdist_directory, settings).name


def _patch_metadata_dir(settings, metadata_directory: str, dist_info: str) -> str:
    from .wheels.rewrite import patch_metadata

    path = Path(metadata_directory) / dist_info / "METADATA"
    text = path.read_text(encoding="utf-8")
    path.write_text(patch_metadata(text, _requirements(settings, [])), encoding="utf-8")
    return dist_info


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """setuptools' metadata plus the Requires-Dist lines the wheel will carry
    (torch pin from the torch installed here)."""
    from setuptools import build_meta

    settings = _settings(config_settings)
    name = build_meta.prepare_metadata_for_build_wheel(
        metadata_directory, _setuptools_settings(config_settings))
    return _patch_metadata_dir(settings, metadata_directory, name)


def prepare_metadata_for_build_editable(metadata_directory: str,
                                        config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """As :func:`prepare_metadata_for_build_wheel`, for editable installs."""
    from setuptools import build_meta

    settings = _settings(config_settings)
    name = build_meta.prepare_metadata_for_build_editable(
        metadata_directory, _setuptools_settings(config_settings))
    return _patch_metadata_dir(settings, metadata_directory, name)


def get_requires_for_build_wheel(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """setuptools' requirements; nothing added (torch: see the module docstring)."""
    from setuptools import build_meta

    return build_meta.get_requires_for_build_wheel(_setuptools_settings(config_settings))


def get_requires_for_build_editable(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """setuptools' requirements for an editable build; nothing added."""
    from setuptools import build_meta

    return build_meta.get_requires_for_build_editable(_setuptools_settings(config_settings))


def get_requires_for_build_sdist(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """setuptools' requirements for an sdist; nothing added."""
    from setuptools import build_meta

    return build_meta.get_requires_for_build_sdist(_setuptools_settings(config_settings))
