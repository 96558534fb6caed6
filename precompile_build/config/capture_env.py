"""The environment between the build and a capture script: one table of its variables.

The build (builder/script.py) starts each capture script with these variables set;
``precompile_build.capture()`` and the modules it runs read them there (and a capture
script may: ``DEVICE``). Every module that sets or reads one spells it through the
names here. docs/capture-environment.md is generated from :data:`VARIABLES`
(``python -m precompile_build.config.reference environment >
docs/capture-environment.md``, reference.py); a test keeps the two equal. The `[tool.precompile]` overrides (``PRECOMPILE_SKIP``,
``PRECOMPILE_TARGETS``, ...) are the settings' (fields.py, docs/settings.md), and the
runtime reads its own (``PRECOMPILE_STRICT``, ``PRECOMPILE_NO_COMPILE``,
``PRECOMPILE_CACHE_DIR``: docs/errors.md).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET = "PRECOMPILE_TARGET"
ARTIFACT_PATH = "PRECOMPILE_ARTIFACT_PATH"
CACHE_PATH = "PRECOMPILE_CACHE_PATH"
DEVICE = "PRECOMPILE_DEVICE"
ENGINE = "PRECOMPILE_ENGINE"
TRACER = "PRECOMPILE_TRACER"
FALLBACK = "PRECOMPILE_FALLBACK"
CUDA_GRAPHS = "PRECOMPILE_CUDA_GRAPHS"
CUDA_ARCHS = "PRECOMPILE_CUDA_ARCHS"
MODE = "PRECOMPILE_MODE"
IMPORTS_PATH = "PRECOMPILE_IMPORTS_PATH"
PROJECT_ROOT = "PRECOMPILE_PROJECT_ROOT"
PACKAGE_DIR = "PRECOMPILE_PACKAGE_DIR"
STATS_PATH = "PRECOMPILE_STATS_PATH"
SCRIPT_STARTED = "PRECOMPILE_SCRIPT_STARTED"
CAPTURE_ID = "PRECOMPILE_CAPTURE_ID"
TEST_CROSS_NATIVE = "PRECOMPILE_TEST_CROSS_NATIVE"


@dataclass(frozen=True)
class Variable:
    """One variable of a capture script's environment."""

    name: str
    """The variable, ``PRECOMPILE_...``."""
    value: str
    """What it holds, and its format."""
    set_by: str
    """Where its value comes from."""
    read_by: str
    """The modules (or the user's script) that read it."""


VARIABLES = (
    Variable(
        TARGET,
        "the target's name",
        "the build: the `[tool.precompile.targets.NAME]` table",
        "api.py: `capture(target=)`'s default, for messages",
    ),
    Variable(
        ARTIFACT_PATH,
        "a file path: where the source half goes (`NAME.py`)",
        "the build: its temp dir's `pairs/NAME/`",
        "api.py (`capture(artifact_path=)`'s default), engines/torch_engine.py",
    ),
    Variable(
        CACHE_PATH,
        "a file path: where the cache half goes (`NAME.cache`)",
        "the build, beside it",
        "api.py (`capture(cache_path=)`'s default), engines/torch_engine.py",
    ),
    Variable(
        DEVICE,
        "`cpu` or `cuda`: the device the target is built for (with `cpu`, "
        "`CUDA_VISIBLE_DEVICES` is empty)",
        "the build: the target's `devices`, one capture each",
        'the capture script itself (`os.environ.get("PRECOMPILE_DEVICE", "cpu")`)',
    ),
    Variable(
        ENGINE,
        'an engine name: what `engine="auto"` resolves to',
        "the user's environment (the build passes it on; it is part of the capture cache's key)",
        "config/choices.py, config/capture_options.py, builder/cache_keys.py",
    ),
    Variable(
        TRACER,
        "a tracer name: `capture(tracer=)`'s default",
        "the build: the target's `tracer` key when set, else the user's environment "
        "(part of the capture cache's key)",
        "capturing/tracers.py, config/capture_options.py, builder/cache_keys.py",
    ),
    Variable(
        FALLBACK,
        "`none` or `eager`: `capture(fallback=)`'s default",
        "the build: the target's `fallback` key",
        "api.py",
    ),
    Variable(
        CUDA_GRAPHS,
        "`1`: the frozen CUDA kernels replay through CUDA graphs",
        "the build: the target's `cuda-graphs = true` (unset otherwise)",
        "config/capture_options.py (the `cuda_graphs` option)",
    ),
    Variable(
        CUDA_ARCHS,
        "comma-separated compute capabilities (`8.0,9.0,12.0`): the other GPUs "
        "to compile the frozen Triton kernels for",
        "the build: the target's `cuda-archs`, for CUDA captures only (removed for CPU "
        "ones); in the user's environment, the same name overrides the project's "
        "`cuda-archs` (docs/settings.md)",
        "config/capture_options.py (the `cuda_archs` option), engines/cross_arch.py",
    ),
    Variable(
        MODE,
        '`max-autotune`: the capture\'s `options["mode"]` where the call gives none',
        "the build: the target's resolved `mode` (unset for `default`); in the user's "
        "environment, the same name overrides the project's `mode` (docs/settings.md)",
        "config/capture_options.py",
    ),
    Variable(
        IMPORTS_PATH,
        "a file path: where the capture writes what it imported (JSON)",
        "the build, beside the pair",
        "process/imported.py: the capture cache's second key",
    ),
    Variable(
        PROJECT_ROOT,
        "a folder: the project root (the capture's files inside it are recorded relative to it)",
        "the build",
        "process/imported.py",
    ),
    Variable(
        PACKAGE_DIR,
        "a folder: the project's import package (its modules are keyed by "
        "content, package_sha256, not recorded as imports)",
        "the build",
        "process/imported.py",
    ),
    Variable(
        STATS_PATH,
        "a file path: where the capture writes its peak memory and seconds per step (JSON lines)",
        "the build, beside the log",
        "process/stats.py",
    ),
    Variable(
        SCRIPT_STARTED,
        "`<time.time()> <pid>`: when the build started the script, and the "
        "script's process id (processes it starts inherit it and record no setup)",
        "the build (the time) and the script's first line (the pid)",
        "process/stats.py",
    ),
    Variable(
        CAPTURE_ID,
        "a random token of one capture (its ranks share it): the processes the "
        "script starts inherit it, and the build ends those still running when the capture "
        "ends, also in other sessions (a daemon holding the script's output open)",
        "the build",
        "builder/leftovers.py (Linux: a `/proc` walk)",
    ),
    Variable(
        TEST_CROSS_NATIVE,
        "`1`: also compile the build GPU's own architecture through the "
        "cross-compile path and freeze those cubins (tests only)",
        "the tests, never the build",
        "engines/cross_arch.py",
    ),
)
"""Every variable, in the order of the reference page."""
