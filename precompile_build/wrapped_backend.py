"""The PEP 517 backend that ``precompile_build.backend`` wraps: `backend` and
`backend-path` of `[tool.precompile]`.

``backend = "hatchling.build"`` (any PEP 517 backend object, ``module`` or
``module:object``; default ``setuptools.build_meta``) builds the project's own wheel,
sdist and metadata; precompile_build.backend adds the captures to what it wrote.
``backend-path`` (directories relative to the project root, inside it) go first on
``sys.path`` when the backend is imported, as `build-system.backend-path` does for an
in-tree backend (PEP 517).

A backend other than setuptools' that cannot be imported, fails in a hook, or writes
no file raises :class:`~precompile_build.errors.BuildError` naming it; setuptools'
own errors pass through as they always have.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .config.messages import PREFIX
from .config.wrapped import DEFAULT, parse_backend
from .errors import BuildError

# the distribution a message tells the user to list, by the backend's top-level module
DISTRIBUTIONS = {
    "setuptools": "setuptools",
    "hatchling": "hatchling",
    "flit_core": "flit-core",
    "pdm": "pdm-backend",
    "scikit_build_core": "scikit-build-core",
    "mesonpy": "meson-python",
    "maturin": "maturin",
    "poetry": "poetry-core",
}


@dataclass(frozen=True)
class Wrapped:
    """The wrapped backend: its object reference and where it is imported from."""

    spec: str
    """The object reference as written (``hatchling.build``, ``pkg.mod:obj``)."""
    path: tuple[Path, ...] = ()
    """`backend-path` entries, absolute, first on ``sys.path`` while importing."""

    @property
    def is_default(self) -> bool:
        return self.spec == DEFAULT and not self.path

    def load(self) -> Any:
        """The backend object. Raises BuildError naming it when it cannot be imported."""
        module, _, attrs = self.spec.partition(":")
        added = [str(p) for p in self.path if str(p) not in sys.path]
        sys.path[:0] = added
        try:
            obj = importlib.import_module(module)
            for attr in filter(None, attrs.split(".")):
                obj = getattr(obj, attr)
        except (ImportError, AttributeError) as e:
            if self.is_default:
                raise
            dist = DISTRIBUTIONS.get(module.split(".")[0], module.split(".")[0])
            where = (
                f" (`{PREFIX}.backend-path` = {[str(p) for p in self.path]})" if self.path else ""
            )
            raise BuildError(
                f"Failed to load the build backend `{self.spec}` (`{PREFIX}.backend`){where}: "
                f"{type(e).__name__}: {e}; list its distribution ({dist}) in "
                "`build-system.requires` of pyproject.toml (or install it where you build "
                "with --no-isolation)"
            ) from None
        return obj

    def has(self, hook: str) -> bool:
        """Whether the backend has the optional hook ``hook``."""
        return hasattr(self.load(), hook)

    def call(self, hook: str, *args: Any) -> Any:
        """``backend.hook(*args)``; a backend other than setuptools' that fails raises
        BuildError naming it and the hook (the backend's own ``UnsupportedOperation``
        passes through, as PEP 517 frontends expect it)."""
        backend = self.load()
        if self.is_default:
            return getattr(backend, hook)(*args)
        unsupported = getattr(backend, "UnsupportedOperation", None)
        try:
            return getattr(backend, hook)(*args)
        except Exception as e:
            if isinstance(unsupported, type) and isinstance(e, unsupported):
                raise
            raise BuildError(
                f"Failed in {hook}: the wrapped build backend `{self.spec}` "
                f"(`{PREFIX}.backend`) raised {type(e).__name__}: {e}"
            ) from e
        except SystemExit as e:  # a backend that exits (a CLI error) still names itself
            raise BuildError(
                f"Failed in {hook}: the wrapped build backend `{self.spec}` "
                f"(`{PREFIX}.backend`) exited ({e.code})"
            ) from e

    def built(self, hook: str, directory: Path, name: Any) -> Path:
        """The file ``name`` that ``hook`` reports it wrote into ``directory``. Raises
        BuildError naming the backend when it returned no name or wrote no such file."""
        path = directory / name if isinstance(name, str) and name else None
        if path is None or not path.is_file():
            wrote = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
            raise BuildError(
                f"Failed in {hook}: the wrapped build backend `{self.spec}` "
                f"(`{PREFIX}.backend`) returned {name!r}, but wrote no such file "
                f"(found: {', '.join(wrote) or 'nothing'})"
            )
        return path


def for_project(root: Optional[Path] = None) -> Wrapped:
    """The wrapped backend of the project at ``root`` (default: the working directory,
    where a frontend runs the hooks), read from pyproject.toml alone: the hooks that
    take no settings (``get_requires_for_build_*``) use it. No pyproject.toml, or no
    `[tool.precompile]` table: setuptools'. Raises ConfigError for a bad `backend` or
    `backend-path`, or an unparsable pyproject.toml."""
    from .config.settings import read_pyproject

    root = Path(root or os.getcwd()).resolve()
    if not (root / "pyproject.toml").is_file():
        return Wrapped(DEFAULT)
    tool = read_pyproject(root).get("tool", {})
    table = tool.get("precompile") if isinstance(tool, dict) else None
    return Wrapped(*parse_backend(table, root)) if isinstance(table, dict) else Wrapped(DEFAULT)
