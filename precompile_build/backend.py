"""PEP 517 build backend: the project's own backend plus the captures.

``build-backend = "precompile_build.backend"``. It wraps the backend named by
`[tool.precompile] backend` (default ``setuptools.build_meta``; wrapped_backend.py):
every hook of that backend is re-exported (looked up lazily, so hooks it adds later
are inherited); ``build_wheel`` and ``build_editable`` run the capture scripts first
and add their pairs to the wheel that backend wrote (wheels/rewrite.py: RECORD, the
platform tag, ``Requires-Dist``); ``build_sdist`` ships the capture scripts and no
artifacts; the ``prepare_metadata_*`` hooks add the same ``Requires-Dist`` lines the
wheel gets; ``get_requires_for_build_*`` are the wrapped backend's.

Captures run side by side and unchanged ones are reused from the capture cache
(``runner.run_captures``; `jobs`, `cache`, `cache-dir` settings).

Torch must be importable where the build runs (the scripts run with the build's
own interpreter): list it in ``build-system.requires`` (with the wrapped backend's
distribution) or build with ``--no-isolation``. ``get_requires_for_build_wheel`` adds
nothing to the wrapped backend's list.

Editable installs (PEP 660): the pairs and manifest are written into the *source*
package directory, ``<package dir>/_precompiled/`` (atomically, replacing an older
one), since an editable import resolves the package to the source tree. Add
``_precompiled/`` to ``.gitignore``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, TypeVar

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
    """Forward every other public hook (and a backend's ``UnsupportedOperation``) to the
    wrapped backend of the project in the working directory (setuptools' when it has
    none, or it cannot be read or imported: the hooks themselves then say why)."""
    if name.startswith("_"):
        raise AttributeError(name)
    from .wrapped_backend import for_project

    try:
        target: Any = for_project().load()
    except Exception:  # noqa: BLE001 - any failure of the project's backend: setuptools' hooks say why
        import setuptools.build_meta

        target = setuptools.build_meta
    return getattr(target, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


F = TypeVar("F", bound=Callable[..., Any])


def _short(hook: F) -> F:
    """A hook whose own errors (PrecompileBuildError: a config error, a failed capture,
    a wrapped backend's failure, whose cause stays chained) reach the frontend with a
    traceback of this one frame: a frontend prints the hook's whole traceback before
    the one-line message (was 30 lines of this package's frames for a misspelt key)."""

    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        from .errors import PrecompileBuildError

        try:
            return hook(*args, **kwargs)
        except PrecompileBuildError as e:
            raise e.with_traceback(None)  # noqa: B904 (the same exception, its frames cut)

    return run  # type: ignore[return-value]


def _wrapped(settings=None):
    """The wrapped backend (wrapped_backend.Wrapped): the settings', else read from the
    working directory's pyproject.toml (the hooks that take no settings)."""
    from .wrapped_backend import Wrapped, for_project

    return for_project() if settings is None else Wrapped(settings.backend, settings.backend_path)


def _setuptools_settings(config_settings: Optional[Mapping[str, Any]]) -> Optional[dict]:
    """The config settings for the wrapped backend: all but ours (``precompile.*``)."""
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

    return (
        [runtime_requirement()]
        if settings.skip
        else build_requirements(variants, settings.torch_pin)
    )


def _say_skipped(settings) -> None:
    """One line on stderr: the wheel is built without its precompiled targets."""
    import sys

    from .wheels.rewrite import runtime_requirement

    print(
        f"precompile: skipped the precompiled targets ({', '.join(settings.targets)}) "
        "as `skip` asks (-C precompile.skip=true or PRECOMPILE_SKIP): the wheel has no "
        f"_precompiled/ and adds {runtime_requirement()} to its requirements but no torch "
        "pin, which comes from the captures' torch (list torch in `project.dependencies` "
        "if the library needs it)",
        file=sys.stderr,
    )


def _package(settings, plain: Path, out_dir: str, files: dict, *, add: bool) -> str:
    """Rewrite the wrapped backend's wheel ``plain`` into ``out_dir``; ``add``: put
    ``files`` into it (regular wheel) or only take requirements and tags from them
    (editable)."""
    from .wheels.manifest import variants
    from .wheels.rewrite import NATIVE_ENGINES, package_wheel, written_requirements

    found = variants(files) if files else []  # skip: no captures, no manifest
    native = any(v["engine"] in NATIVE_ENGINES for v in found)
    requires = _requirements(settings, found)
    _warn_static_dependencies(settings.project, requires, settings.backend)
    out = package_wheel(
        plain,
        out_dir,
        settings.package,
        files if add else None,
        requires,
        native=native,
        kernels=files,
    )
    import sys

    added = (
        f"{settings.package.replace('.', '/')}/_precompiled/ ({len(files)} files), "
        if add and files
        else ""
    )
    print(
        f"precompile: wrote {out.name}: the wheel {settings.backend} built, plus {added}"
        f"Requires-Dist {', '.join(written_requirements(out, requires))}",
        file=sys.stderr,
    )
    return out.name


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
        if not same or (
            canonicalize_name(want.name) != "precompile-runtime"
            and not any(set(s.specifier) >= set(want.specifier) for s in same)
        ):
            gap.append(r)
    return gap


def _warn_static_dependencies(
    project: Optional[Mapping[str, Any]], requires: list, backend: str = "setuptools.build_meta"
) -> None:
    import sys

    gap = static_dependencies_gap(project, requires)
    if gap:
        dynamic = (
            'Add "dependencies" to `project.dynamic` (list your own in '
            "`[tool.setuptools.dynamic]`), or add these to `project.dependencies`"
            if backend.startswith("setuptools")
            else "Add these to `project.dependencies`"
        )
        print(
            "precompile: warning: `project.dependencies` in pyproject.toml is static, but "
            f"this build adds {', '.join(gap)} to the wheel; tools that read "
            f"pyproject.toml (uv) will not install them. {dynamic} (docs/publishing.md)",
            file=sys.stderr,
        )


@_short
def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """Run the captures, build the wheel with the wrapped backend, add `_precompiled/`.

    Returns the wheel's file name in ``wheel_directory``. Raises ConfigError before
    any capture, BuildError for a wrapped backend that cannot be imported (before any
    capture), fails or writes no wheel, CaptureError for a failed required target; no
    wheel is left in ``wheel_directory`` on failure.
    """
    settings = _settings(config_settings)
    wrapped = _wrapped(settings)
    wrapped.load()
    st_settings = _setuptools_settings(config_settings)
    if settings.skip:
        _say_skipped(settings)
    with build_tempdir() as tmp:
        files = {} if settings.skip else _capture(settings, Path(tmp) / "capture")
        out = Path(tmp) / "wheel"
        out.mkdir()  # flit-core writes into it and does not make it
        name = wrapped.call("build_wheel", str(out), st_settings, metadata_directory)
        return _package(
            settings, wrapped.built("build_wheel", out, name), wheel_directory, files, add=True
        )


def _editable_hook(wrapped) -> None:
    """Raises BuildError when the wrapped backend has no PEP 660 ``build_editable``."""
    from .errors import BuildError

    if not wrapped.has("build_editable"):
        raise BuildError(
            f"Failed to build an editable wheel: the wrapped build backend "
            f"`{wrapped.spec}` (`tool.precompile.backend`) has no build_editable "
            "hook (PEP 660); install without -e, or use a backend that has one"
        )


@_short
def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """PEP 660: run the captures, write them to ``<package dir>/_precompiled/`` in the
    source tree, then build the wrapped backend's editable wheel (requirements added).

    The manifest records the package source's digest (``editable``), so a load after
    the source changed serves no stale kernels. With setuptools'
    ``editable_mode=strict`` (a link tree under ``build/``), ``_precompiled/`` is
    written into the link tree too: it holds only what setuptools knew of. Raises
    BuildError when the wrapped backend has no ``build_editable``."""
    from .builder.capture_cache import package_digest
    from .wheels.manifest import mark_editable, write_dir_atomic
    from .wheels.rewrite import PRECOMPILED

    settings = _settings(config_settings)
    wrapped = _wrapped(settings)
    _editable_hook(wrapped)
    st_settings = _setuptools_settings(config_settings)
    if settings.skip:  # the source tree's _precompiled/ is left as it is
        _say_skipped(settings)
        with build_tempdir() as tmp:
            out = Path(tmp) / "wheel"
            out.mkdir()
            name = wrapped.call("build_editable", str(out), st_settings, metadata_directory)
            return _package(
                settings, wrapped.built("build_editable", out, name), wheel_directory, {}, add=False
            )
    with build_tempdir() as tmp:
        digest = package_digest(settings.package_dir)
        files = mark_editable(
            _capture(settings, Path(tmp) / "capture"), settings.package_dir, digest
        )
        out = Path(tmp) / "wheel"
        out.mkdir()  # flit-core writes into it and does not make it
        name = wrapped.call("build_editable", str(out), st_settings, metadata_directory)
        plain = wrapped.built("build_editable", out, name)
        write_dir_atomic(settings.package_dir / PRECOMPILED, files)
        for tree in _link_trees(plain):
            pkg = tree.joinpath(*settings.package.split("."))
            if pkg.is_dir() and pkg.resolve() != settings.package_dir.resolve():
                write_dir_atomic(pkg / PRECOMPILED, files)
        return _package(settings, plain, wheel_directory, files, add=False)


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


@_short
def build_sdist(sdist_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """The wrapped backend's sdist, plus every capture script, minus `_precompiled/`."""
    from .wheels.sdist import package_sdist

    settings = _settings(config_settings)
    wrapped = _wrapped(settings)
    with build_tempdir() as tmp:
        name = wrapped.call("build_sdist", tmp, _setuptools_settings(config_settings))
        return package_sdist(
            wrapped.built("build_sdist", Path(tmp), name), sdist_directory, settings
        ).name


def _patch_metadata_dir(settings, metadata_directory: str, dist_info: str) -> str:
    from .wheels.rewrite import patch_metadata

    path = Path(metadata_directory) / dist_info / "METADATA"
    text = path.read_text(encoding="utf-8")
    path.write_text(patch_metadata(text, _requirements(settings, [])), encoding="utf-8")
    return dist_info


def _prepare_metadata(
    hook: str,
    build_hook: str,
    metadata_directory: str,
    config_settings: Optional[Mapping[str, Any]],
) -> str:
    """The wrapped backend's ``hook`` (its metadata), or, where it has none, the
    ``.dist-info`` of the wheel its ``build_hook`` builds (no captures), as PEP 517
    frontends do; then the build's ``Requires-Dist`` lines added."""
    import zipfile

    settings = _settings(config_settings)
    wrapped = _wrapped(settings)
    st_settings = _setuptools_settings(config_settings)
    if wrapped.has(hook):
        return _patch_metadata_dir(
            settings, metadata_directory, wrapped.call(hook, metadata_directory, st_settings)
        )
    with build_tempdir() as tmp:
        name = wrapped.call(build_hook, tmp, st_settings)
        with zipfile.ZipFile(wrapped.built(build_hook, Path(tmp), name)) as zf:
            dist_info = next(
                n.split("/")[0]
                for n in zf.namelist()
                if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            )
            for n in zf.namelist():
                if n.startswith(dist_info + "/") and not n.endswith("/"):
                    zf.extract(n, metadata_directory)
    return _patch_metadata_dir(settings, metadata_directory, dist_info)


@_short
def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Optional[Mapping[str, Any]] = None
) -> str:
    """The wrapped backend's metadata plus the Requires-Dist lines the wheel will carry
    (torch pin from the torch installed here)."""
    return _prepare_metadata(
        "prepare_metadata_for_build_wheel", "build_wheel", metadata_directory, config_settings
    )


@_short
def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Optional[Mapping[str, Any]] = None
) -> str:
    """As :func:`prepare_metadata_for_build_wheel`, for editable installs."""
    _editable_hook(_wrapped(_settings(config_settings)))
    return _prepare_metadata(
        "prepare_metadata_for_build_editable", "build_editable", metadata_directory, config_settings
    )


def _requires(hook: str, config_settings: Optional[Mapping[str, Any]]) -> list:
    wrapped = _wrapped()
    return (
        list(wrapped.call(hook, _setuptools_settings(config_settings))) if wrapped.has(hook) else []
    )


@_short
def get_requires_for_build_wheel(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """The wrapped backend's requirements; nothing added (torch: see the module docstring)."""
    return _requires("get_requires_for_build_wheel", config_settings)


@_short
def get_requires_for_build_editable(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """The wrapped backend's requirements for an editable build; nothing added."""
    return _requires("get_requires_for_build_editable", config_settings)


@_short
def get_requires_for_build_sdist(config_settings: Optional[Mapping[str, Any]] = None) -> list:
    """The wrapped backend's requirements for an sdist; nothing added."""
    return _requires("get_requires_for_build_sdist", config_settings)
