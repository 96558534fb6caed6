"""The one table of `[tool.precompile]` keys and their overrides.

Each :class:`Key` names a TOML key (kebab-case), the :class:`~.settings.Settings` or
:class:`~.settings.TargetSettings` attribute it sets, whether pyproject.toml may set it
and the environment variable that overrides it (with ``-C precompile.KEY``). settings.py
derives the accepted keys and the overrides from it, and reference.py the settings
reference in docs/settings.md from it and the attributes' docstrings (a test keeps the
two equal: regenerate with ``python -m precompile_build.config.reference > docs/settings.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import capture_env


@dataclass(frozen=True)
class Key:
    """One key of `[tool.precompile]` or of its targets."""

    key: str
    """The kebab-case name: the TOML key and the config setting ``precompile.KEY``."""
    attr: str
    """The settings attribute it sets."""
    toml: bool = True
    """pyproject.toml may set it (False: an override only)."""
    env: Optional[str] = None
    """The environment variable that overrides it (with ``-C precompile.KEY``), or None."""


# [tool.precompile]; in this order: TOML keys and overrides are listed (and suggested)
# in it. Names the runtime also reads get a BUILD_ infix (PRECOMPILE_STRICT,
# PRECOMPILE_CACHE_DIR).
PROJECT_KEYS = (
    Key("package", "package"),
    Key("skip", "skip", toml=False, env="PRECOMPILE_SKIP"),
    Key("targets", "selected", env="PRECOMPILE_TARGETS"),
    Key("strict", "strict", toml=False, env="PRECOMPILE_BUILD_STRICT"),
    Key("verbose", "verbose", toml=False, env="PRECOMPILE_VERBOSE"),
    Key("torch-pin", "torch_pin", env="PRECOMPILE_TORCH_PIN"),
    Key("cache", "cache", env="PRECOMPILE_CACHE"),
    Key("cache-dir", "cache_dir", env="PRECOMPILE_BUILD_CACHE_DIR"),
    Key("cache-max-size", "cache_max_size", env="PRECOMPILE_CACHE_MAX_SIZE"),
    Key("jobs", "jobs", env="PRECOMPILE_JOBS"),
    Key("cuda-archs", "cuda_archs", env=capture_env.CUDA_ARCHS),  # the targets' default
    Key("mode", "mode", env=capture_env.MODE),  # the targets' default
    Key("distributed", "distributed", env="PRECOMPILE_DISTRIBUTED"),
    Key("backend", "backend"),
    Key("backend-path", "backend_path"),
)
# [tool.precompile.targets.NAME]
TARGET_KEYS = (
    Key("script", "script_rel"),
    Key("args", "args"),
    Key("device", "device"),
    Key("timeout", "timeout"),
    Key("env", "env"),
    Key("required", "required"),
    Key("cache-env", "cache_env"),
    Key("fallback", "fallback"),
    Key("tracer", "tracer"),
    Key("cuda-graphs", "cuda_graphs"),
    Key("cuda-archs", "cuda_archs"),
    Key("mode", "mode"),
    Key("world-size", "world_size"),
    Key("mesh", "mesh"),
)
