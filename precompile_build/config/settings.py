"""`[tool.precompile]` -> typed settings, with validation and overrides.

Sources, highest precedence first: ``PRECOMPILE_*`` environment variables, PEP 517
config settings with the ``precompile.`` prefix, then ``[tool.precompile]`` of
pyproject.toml. Every problem raises :class:`~precompile_build.errors.ConfigError`
naming the full dotted key; nothing here runs a capture.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from . import target_names
from .cache_settings import (
    DEFAULT_CACHE_MAX_SIZE,
    default_cache_dir,
    parse_cache_dir,
    parse_cache_max_size,
    resolve_cache_dir,
)
from .choices import FALLBACKS, TRACERS, DeviceChoice, Fallback, TracerChoice
from .compile_keys import parse_cuda_archs, parse_mode
from .fields import PROJECT_KEYS
from .fields import TARGET_KEYS as TARGET_TABLE_KEYS
from .messages import PREFIX, fail, invalid, type_name
from .overrides import LIST_OVERRIDES, OVERRIDES, as_bool, collect_overrides, select_targets
from .package_dir import find_package
from .parallel import parse_distributed, parse_world
from .wrapped import parse_backend

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICES = ("cuda", "cpu", "auto")  # DeviceChoice (choices.py), in the order messages give them
TORCH_PINS = ("exact", "minor", "none")
DEFAULT_TIMEOUT = 3600.0  # seconds
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TargetSettings:
    """One `[tool.precompile.targets.NAME]` table."""

    name: str
    """Target name, the table's key; the pair is written as NAME.py / NAME.cache."""
    script: Path
    """Capture script, absolute and resolved (symlinks followed), inside the project root."""
    script_rel: str
    """The script path as written in pyproject.toml (relative to the project root)."""
    args: tuple[str, ...] = ()
    """Extra command-line arguments for the script (`args`, list of strings)."""
    device: DeviceChoice = "auto"
    """`cuda`, `cpu`, or `auto` (cuda when the build host has one)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds before the script's whole process group is killed."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the script (table of strings)."""
    required: bool = True
    """A failed required capture fails the build; a failed optional one is left out."""
    cache_env: tuple[str, ...] = ()
    """`cache-env`: names of environment variables the capture depends on; their
    values (unset counts too) are part of the capture cache key."""
    fallback: Fallback = "none"
    """`fallback`: `"eager"` captures the target with the eager engine (no kernels)
    when the frozen engine's compiler (Inductor) fails on it, an upstream bug; the
    build summary, the manifest and `inspect` say so. `"none"` (default): the
    compiler's failure fails the capture."""
    tracer: Optional[TracerChoice] = None
    """`tracer`: how the frozen/eager engines trace the call: `auto`, `export`,
    `export-strict` or `make_fx` (capturing/tracers.py); passed to the script as
    PRECOMPILE_TRACER. None: the environment's PRECOMPILE_TRACER, else auto."""
    cuda_graphs: bool = False
    """`cuda-graphs`: loads of this (CUDA, inference, frozen) target replay CUDA graphs
    of its kernels; ``load_packaged(..., cuda_graphs=)`` overrides it. With `device =
    "cpu"` it is a ConfigError; a `device = "auto"` target captured on a CPU build host
    is captured without it (the build says so)."""
    cuda_archs: tuple[str, ...] = ()
    """`cuda-archs`: compute capabilities (``"8.0"``, ``"9.0"``, ...) the frozen
    engine's Triton kernels are compiled for besides the build GPU's own: the
    capture traces, autotunes and validates on the build GPU, then compiles each
    kernel's chosen configuration for every other listed architecture
    (engines/cross_arch.py). Resolved: the `cuda-archs` override, else the target's
    key, else the project's; empty: the build GPU's architecture only."""
    mode: str = "default"
    """`mode`: how the frozen engine compiles the kernels: `"default"`, or
    `"max-autotune"`: torch.compile's `max-autotune-no-cudagraphs` (Inductor times
    Triton templates, extern kernels and, on CPU, C++ GEMM templates for each matrix
    product and convolution, and coordinate-descent tunes the other kernels) at
    build time, its choices frozen into the pair so that no load autotunes; a
    choice that cannot be frozen gives way to the best-timed one that can (the build
    line says so; engines/autotune.py). Combinable with `cuda-graphs` and
    `cuda-archs` (the other architectures get the build GPU's choices). Passed to the
    script as PRECOMPILE_MODE. Resolved: the `mode` override, else the target's key,
    else the project's."""
    world_size: Optional[int] = None
    """`world-size`: the script runs as one rank of a world of this many processes
    (torchrun's ``--nproc_per_node``), its model sharded with parallelize_module;
    the build runs every rank or rank 0 alone (the `distributed` setting), keeps
    rank 0's pair, which serves every rank. With only a `mesh`, the product of its
    sizes. None: a single-process target."""
    mesh: tuple[tuple[str, int], ...] = ()
    """`mesh`: the DeviceMesh of a plan with several dimensions, a table of
    dimension names and sizes in mesh order (``mesh = { dp = 2, tp = 4 }``); the
    capture's mesh must have this shape (and these names, where it names its
    dimensions). Empty: the world as one dimension."""


@dataclass(frozen=True)
class Settings:
    """The whole resolved configuration of one project."""

    root: Path
    """Project root (directory of pyproject.toml), resolved."""
    package: str
    """Import package that receives `_precompiled/`."""
    package_dir: Path
    """Source directory of `package` (root/PKG or root/src/PKG)."""
    targets: Mapping[str, TargetSettings]
    """Every declared target, in pyproject order."""
    selected: tuple[str, ...]
    """Targets to run (all, or the `targets` override), in pyproject order."""
    skip: bool = False
    """`skip` override: build without running captures."""
    strict: bool = False
    """`strict` override: treat every target as required."""
    verbose: bool = False
    """`verbose` override: stream capture output to stderr."""
    torch_pin: str = "exact"
    """`torch-pin`: `exact` (torch==X.Y.Z), `minor` (>=X.Y,<X.Y+1) or `none`."""
    cache: bool = True
    """`cache`: reuse an earlier capture whose inputs are unchanged (capture_cache.py)."""
    cache_dir: Optional[Path] = None
    """`cache-dir`: capture cache directory, absolute; None: the per-user default
    (:func:`default_cache_dir`)."""
    cache_max_size: Optional[int] = DEFAULT_CACHE_MAX_SIZE
    """`cache-max-size`: most bytes the capture cache keeps (`"10GiB"`, `"512MB"`, or bytes
    as an integer; default 10 GiB; `"none"`: no bound). After each build the least
    recently used entries, with their `.lock` files, are removed until it fits (never
    one this build used); the build's summary says its size (builder/cache_bound.py)."""
    jobs: Optional[int] = None
    """`jobs`: most captures at once; None is `auto` (one per GPU for CUDA targets,
    ``os.cpu_count() // 2`` (at least 1) for CPU targets)."""
    project: Optional[Mapping[str, Any]] = None
    """The `[project]` table of pyproject.toml as parsed (None when absent or not a
    table): the build compares its static `dependencies` with what it adds."""
    distributed: str = "auto"
    """`distributed`: how a target with a `world-size` runs its ranks: `real` (each
    rank in its own process, with real collectives: gloo on the CPU, one GPU per rank
    for CUDA; each rank's pair validated against its eager call), `fake` (rank 0 alone
    under torch's fake process group: compile-only, the manifest and `inspect` say it
    was not validated at that world size), `auto` (default: real on the CPU and
    where the build host has a GPU per rank, else fake)."""
    backend: str = "setuptools.build_meta"
    """`backend`: the PEP 517 build backend the project builds with (its object
    reference, ``module`` or ``module:object``: `"hatchling.build"`, `"flit_core.buildapi"`,
    `"pdm.backend"`, `"scikit_build_core.build"`), which `precompile_build.backend`
    wraps: every hook is that backend's, and the wheel it writes gets `_precompiled/`,
    the platform tag and the `Requires-Dist` lines. List its distribution in
    `build-system.requires` beside precompile-build."""
    backend_path: tuple[Path, ...] = ()
    """`backend-path`: directories (relative to the project root, inside it) put first on
    `sys.path` to import `backend`, as `build-system.backend-path` for an in-tree
    backend (PEP 517)."""


# Keys of the tables, kebab-case as written in TOML, and the overrides (config setting
# `precompile.KEY` / environment variable): from the one table, config/fields.py.
__all__ = [
    "DEFAULT_CACHE_MAX_SIZE",
    "DEFAULT_TIMEOUT",
    "DEVICES",
    "LIST_OVERRIDES",
    "OVERRIDES",
    "TARGET_KEYS",
    "TOP_KEYS",
    "TORCH_PINS",
    "Settings",
    "TargetSettings",
    "collect_overrides",
    "default_cache_dir",
    "find_package",
    "load_settings",
    "read_pyproject",
    "resolve_cache_dir",
    "select_targets",
    "settings_from_table",
]

TOP_KEYS = tuple(k.key for k in PROJECT_KEYS if k.toml)
TARGET_KEYS = tuple(k.key for k in TARGET_TABLE_KEYS)


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = (
                f"; did you mean `{prefix}.{close[0]}`?"
                if close
                else (f"; valid keys: {', '.join(allowed)}")
            )
            raise fail(f"unknown key `{prefix}.{key}`{hint}")


def _read_toml(root: Path) -> dict[str, Any]:
    """``root/pyproject.toml``, parsed. Raises ConfigError: missing or unparsable."""
    path = root / "pyproject.toml"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"Failed to read {path}: file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"Failed to parse {path}: {e}") from None


def read_pyproject(root: Path) -> dict[str, Any]:
    """``root/pyproject.toml``, parsed. Raises ConfigError: missing or unparsable."""
    return _read_toml(root)


def _precompile_table(doc: Mapping[str, Any]) -> dict[str, Any]:
    tool = doc.get("tool", {})
    table = tool.get("precompile") if isinstance(tool, dict) else None
    if table is None:
        raise fail("the table is missing; add `[tool.precompile.targets.NAME]` with a `script`")
    if not isinstance(table, dict):
        raise fail(f"`{PREFIX}` must be a table, not {type_name(table)}")
    return table


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _script(script_rel: Any, key: str, root: Path) -> tuple[str, Path]:
    """`script` as written and as a resolved path: a file inside the project root."""
    if not isinstance(script_rel, str) or not script_rel or "\0" in script_rel:
        raise fail(f"`{key}.script` must be a non-empty string without NUL characters")
    try:
        script = (root / script_rel).resolve()
        is_file = script.is_file()
    except (OSError, RuntimeError) as e:  # name too long, symlink loop
        raise fail(f"`{key}.script` = {script_rel!r} is not a usable path ({e})") from None
    if not _inside(script, root):
        raise fail(
            f"`{key}.script` = {script_rel!r} resolves to {script}, outside "
            f"the project root {root}; keep capture scripts inside the project"
        )
    if not is_file:
        raise fail(f"`{key}.script` = {script_rel!r}: no such file {script}")
    return script_rel, script


def _timeout(timeout: Any, key: str) -> float:
    """`timeout` in seconds: a positive finite number (not a bool)."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not _finite(timeout)
        or timeout <= 0
    ):
        raise fail(f"`{key}.timeout` must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


def _env(env: Any, key: str) -> dict[str, str]:
    """`env`: a table of strings keyed by environment variable names."""
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) and "\0" not in v
        for k, v in env.items()
    ):
        raise fail(
            f"`{key}.env` must be a table of strings whose keys are environment "
            "variable names (letters, digits, underscores) and whose values have "
            "no NUL characters"
        )
    return dict(env)


def _cache_env(cache_env: Any, key: str) -> tuple[str, ...]:
    """`cache-env`: environment variable names, each once, in their order."""
    if not isinstance(cache_env, list) or not all(
        isinstance(n, str) and _ENV_NAME.match(n) for n in cache_env
    ):
        raise fail(
            f"`{key}.cache-env` must be an array of environment variable names "
            "(letters, digits, underscores; not starting with a digit)"
        )
    return tuple(dict.fromkeys(cache_env))


def _parse_target(name: Any, raw: Any, root: Path) -> TargetSettings:
    key = f"{PREFIX}.targets.{name}"
    bad = target_names.problem(name)
    if bad is not None:
        raise fail(f"target name {name!r} in `{key}` {bad}")
    if not isinstance(raw, dict):
        raise fail(f"`{key}` must be a table, not {type_name(raw)}")
    _check_keys(raw, TARGET_KEYS, key)
    if "script" not in raw:
        raise fail(f"`{key}.script` is required (path of the capture script)")
    script_rel, script = _script(raw["script"], key, root)
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise fail(f"`{key}.args` must be an array of strings without NUL characters")
    device = raw.get("device", "auto")
    if device not in DEVICES:
        raise fail(f"`{key}.device` must be one of {', '.join(map(repr, DEVICES))}, not {device!r}")
    timeout = _timeout(raw.get("timeout", DEFAULT_TIMEOUT), key)
    env = _env(raw.get("env", {}), key)
    required = raw.get("required", True)
    if not isinstance(required, bool):
        raise fail(f"`{key}.required` must be a boolean, not {type_name(required)}")
    cache_env = _cache_env(raw.get("cache-env", []), key)
    fallback = raw.get("fallback", "none")
    if fallback not in FALLBACKS:
        raise fail(
            f"`{key}.fallback` must be one of {', '.join(map(repr, FALLBACKS))}, not {fallback!r}"
        )
    tracer = raw.get("tracer")
    if tracer is not None and tracer not in TRACERS:
        raise fail(f"`{key}.tracer` must be one of {', '.join(map(repr, TRACERS))}, not {tracer!r}")
    cuda_graphs = raw.get("cuda-graphs", False)
    if not isinstance(cuda_graphs, bool):
        raise fail(f"`{key}.cuda-graphs` must be a boolean, not {type_name(cuda_graphs)}")
    if cuda_graphs and device == "cpu":
        raise fail(
            f"`{key}.cuda-graphs` = true replays CUDA graphs of CUDA kernels, but "
            f'`{key}.device` is "cpu": set `device` to "auto" (a CPU build '
            'host captures without the option, a CUDA one with it) or "cuda", or '
            "drop `cuda-graphs`"
        )
    mode = parse_mode(raw["mode"], f"`{key}.mode`") if "mode" in raw else None
    cuda_archs = (
        parse_cuda_archs(raw["cuda-archs"], f"`{key}.cuda-archs`") if "cuda-archs" in raw else None
    )
    world_size, mesh = parse_world(raw, key)
    if cuda_archs and device == "cpu":
        raise fail(
            f"`{key}.cuda-archs` compiles CUDA kernels for other GPUs, but `{key}.device` "
            'is "cpu": set `device` to "auto" or "cuda", or drop `cuda-archs`'
        )
    return TargetSettings(
        name=name,
        script=script,
        script_rel=script_rel,
        args=tuple(args),
        device=device,
        timeout=timeout,
        env=env,
        required=required,
        cache_env=cache_env,
        fallback=fallback,
        tracer=tracer,
        cuda_graphs=cuda_graphs,
        mode=mode,  # type: ignore[arg-type]  # None: not set here
        world_size=world_size,
        mesh=mesh,
        cuda_archs=cuda_archs,  # type: ignore[arg-type]  # None: not set here
    )


def _jobs(table: Mapping[str, Any], overrides: Mapping[str, tuple[Any, str]]) -> Optional[int]:
    value, where = table.get("jobs", "auto"), f"`{PREFIX}.jobs`"
    if "jobs" in overrides:
        value, where = overrides["jobs"]
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,6}", value.strip()):
            value = int(value.strip())
    if isinstance(value, str) and value.strip() == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(where, f'must be "auto" or a positive integer, not {value!r}')
    return value


def _resolve_cuda_archs(
    table: Mapping[str, Any],
    targets: dict[str, TargetSettings],
    overrides: Mapping[str, tuple[Any, str]],
) -> dict[str, TargetSettings]:
    """Each target with its effective `cuda-archs`: the override (environment, then
    config settings) for every target, else the target's key, else the project's."""
    project: tuple[str, ...] = ()
    if "cuda-archs" in table:
        project = parse_cuda_archs(table["cuda-archs"], f"`{PREFIX}.cuda-archs`")
    forced = None
    if "cuda-archs" in overrides:
        value, where = overrides["cuda-archs"]
        forced = parse_cuda_archs(str(value), where)
    out = {}
    for name, t in targets.items():
        archs = (
            forced if forced is not None else t.cuda_archs if t.cuda_archs is not None else project
        )
        if t.device == "cpu":  # the project's list is for its CUDA targets
            archs = () if forced is not None or t.cuda_archs is None else archs
        out[name] = dataclasses.replace(t, cuda_archs=tuple(archs))
    return out


def _resolve_mode(
    table: Mapping[str, Any],
    targets: dict[str, TargetSettings],
    overrides: Mapping[str, tuple[Any, str]],
) -> dict[str, TargetSettings]:
    """Each target with its effective `mode`: the override (environment, then config
    settings) for every target, else the target's key, else the project's, else
    ``"default"``."""
    project = parse_mode(table["mode"], f"`{PREFIX}.mode`") if "mode" in table else "default"
    forced = None
    if "mode" in overrides:
        value, where = overrides["mode"]
        forced = parse_mode(str(value), where)
    return {
        name: dataclasses.replace(t, mode=forced or t.mode or project)
        for name, t in targets.items()
    }


def load_settings(
    root: str | os.PathLike[str],
    config_settings: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read, validate and override the configuration of the project at ``root``.

    Args:
        root: project root (holds pyproject.toml).
        config_settings: PEP 517 config settings (``precompile.*`` keys are ours).
        environ: environment (default ``os.environ``).
    Returns:
        the resolved :class:`Settings`.
    Raises:
        ConfigError: any invalid key, type, path, package or override.
    """
    root = Path(root).resolve()
    doc = _read_toml(root)
    return settings_from_table(
        root, _precompile_table(doc), config_settings, environ, project=doc.get("project")
    )


def settings_from_table(
    root: Path,
    table: Mapping[str, Any],
    config_settings: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    project: Any = None,
) -> Settings:
    """As :func:`load_settings`, from an already-parsed `[tool.precompile]` table
    (``root`` resolved) and `[project]` table (``project``: kept as
    :attr:`Settings.project`, None unless a dict). Raises ConfigError for anything
    invalid, including a ``table`` that is not a dict."""
    if not isinstance(table, dict):
        raise fail(f"`{PREFIX}` must be a table, not {type_name(table)}")
    _check_keys(table, TOP_KEYS, PREFIX)
    raw_targets = table.get("targets")
    if raw_targets is None:
        raise fail(f"`{PREFIX}.targets` is missing; add `[{PREFIX}.targets.NAME]` with a `script`")
    if not isinstance(raw_targets, dict):
        raise fail(f"`{PREFIX}.targets` must be a table, not {type_name(raw_targets)}")
    if not raw_targets:
        raise fail(f"`{PREFIX}.targets` is empty; add `[{PREFIX}.targets.NAME]`")
    targets = {n: _parse_target(n, t, root) for n, t in raw_targets.items()}
    clash = target_names.case_clash(targets)
    if clash is not None:
        raise fail(
            f"target names {clash[0]!r} and {clash[1]!r} in `{PREFIX}.targets` differ only in case: "
            "their files would be one on a file system that ignores case (macOS, Windows); rename one"
        )
    package, package_dir = find_package(root, table.get("package"))
    overrides = collect_overrides(config_settings, environ)
    torch_pin = table.get("torch-pin", "exact")
    where = f"`{PREFIX}.torch-pin`"
    if "torch-pin" in overrides:
        torch_pin, where = overrides["torch-pin"]
    if torch_pin not in TORCH_PINS:
        raise fail(f"{where} must be one of {', '.join(map(repr, TORCH_PINS))}, not {torch_pin!r}")
    flags = {
        k: as_bool(overrides[k][0], overrides[k][1]) if k in overrides else False
        for k in ("skip", "strict", "verbose")
    }
    cache = table.get("cache", True)
    if not isinstance(cache, bool):
        raise fail(f"`{PREFIX}.cache` must be a boolean, not {type_name(cache)}")
    if "cache" in overrides:
        cache = as_bool(overrides["cache"][0], overrides["cache"][1])
    cache_dir, jobs = parse_cache_dir(table, overrides, root), _jobs(table, overrides)
    cache_max_size = parse_cache_max_size(table, overrides)
    targets = _resolve_cuda_archs(table, targets, overrides)
    targets = _resolve_mode(table, targets, overrides)
    selected = tuple(targets)
    if "targets" in overrides:
        value, where = overrides["targets"]
        selected = select_targets(targets, str(value), where)
    backend, backend_path = parse_backend(table, root)
    return Settings(
        root=root,
        package=package,
        package_dir=package_dir,
        targets=targets,
        selected=selected,
        skip=flags["skip"],
        strict=flags["strict"],
        verbose=flags["verbose"],
        torch_pin=torch_pin,
        cache=cache,
        cache_dir=cache_dir,
        cache_max_size=cache_max_size,
        jobs=jobs,
        project=project if isinstance(project, dict) else None,
        distributed=parse_distributed(table, overrides),
        backend=backend,
        backend_path=backend_path,
    )
