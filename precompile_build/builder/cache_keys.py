"""The capture cache's key: everything a capture's output depends on
(:func:`key_components`), hashed (:func:`cache_key`); and the entry's format.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precompile_runtime._digest import sha256_file  # one file hash for both sides

from ..config import capture_env
from ..config.settings import Settings, TargetSettings

__all__ = [
    "CAPTURE_ENV",
    "ENTRY_FORMAT",
    "ENTRY_JSON",
    "ENTRY_VERSION",
    "cache_key",
    "key_components",
]

ENTRY_FORMAT = "precompile-build.capture-cache"
ENTRY_VERSION = 3  # 2: entries record what the capture imported; 3: in its import context
ENTRY_JSON = "entry.json"


# Variables every capture reads (precompile_build.config.choices.resolve): always in the key.
CAPTURE_ENV = (capture_env.ENGINE, capture_env.TRACER)


def key_components(
    settings: Settings, target: TargetSettings, device: str, fingerprint: Any, package_sha256: str
) -> dict[str, Any]:
    """Everything a capture's output depends on, as a JSON-able dict.

    ``timeout`` and ``required`` are left out (they change no artifact). The
    declared ``env`` table is part of the target config; ``cache-env`` names and
    :data:`CAPTURE_ENV` are looked up in ``os.environ``, unset as None.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        fingerprint: :func:`host_fingerprints`'s value for ``device``.
        package_sha256: :func:`package_digest` of the project's package.
    Raises:
        OSError: the script or the tool's own files cannot be read (the runner then
            builds without the cache).
    """
    import precompile_runtime
    from precompile_runtime.fingerprint import cpu_flags

    from .._version import __version__

    return {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "precompile_build": __version__,
        "precompile_runtime": precompile_runtime.__version__,
        # the engines write their own code into every pair: a changed engine recaptures
        "tool_code_sha256": _tool_code_sha256(),
        "script_sha256": sha256_file(target.script),
        "package_sha256": package_sha256,
        "target": {
            "name": target.name,
            "script": target.script_rel,
            "args": list(target.args),
            "device": device,
            "env": dict(sorted(target.env.items())),
            "fallback": target.fallback,
            "tracer": target.tracer,
            "cuda_graphs": target.cuda_graphs,
            "cuda_archs": list(target.cuda_archs),
            "mode": target.mode,
        },
        "cache_env": {n: os.environ.get(n) for n in sorted({*target.cache_env, *CAPTURE_ENV})},
        "fingerprint": fingerprint,
        "cpu_flags": hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest(),
    }


@functools.cache
def _tool_code_sha256() -> str:
    """sha256 over the source files of precompile_build and precompile_runtime."""
    import precompile_runtime

    from .._version import __file__ as build_init

    h = hashlib.sha256()
    for pkg in (Path(build_init).parent, Path(precompile_runtime.__file__).parent):
        for f in sorted(pkg.rglob("*.py")):
            h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_key(components: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of :func:`key_components`."""
    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()
