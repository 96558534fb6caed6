"""The source halves' bytecode, shipped beside them: ``_precompiled/NAME.<cache tag>.pyc``.

pip byte-compiles a wheel's ``.py`` files at install and the loader takes that pyc
(precompile_runtime/_bytecode.py). An installer that does not (``uv pip install``
without ``--compile-bytecode``, ``pip install --no-compile``) would leave every load
compiling the source half, 0.10 s of an 8B Llama's first result on an H200
(bench/results/llama_cold_h200.md), since the runtime never writes inside the installed
package. So the build ships a checked-hash pyc (PEP 552) of each source half for the
interpreter that builds, the one the wheel's ``cpXY`` tag names: the loader takes it
only for the very bytes it was compiled from. It is made in a fresh isolated
interpreter, so that its bytes depend only on the source and the Python (marshal's
output can follow the compiling process's reference counts): a reproducible build
stays reproducible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping

from precompile_runtime._bytecode import shipped_path

from ..errors import BuildError
from ..programs import path as program_path


def shipped_bytecode(sources: Mapping[str, bytes]) -> dict[str, bytes]:
    """Checked-hash pycs of ``sources`` for this interpreter.

    Args:
        sources: ``{"NAME.py": bytes}``, the source halves by their ``_precompiled/`` name.
    Returns:
        ``{"NAME.<cache tag>.pyc": bytes}`` (empty when this Python caches no bytecode).
    Raises:
        BuildError: a source half does not compile (its SyntaxError's line), or the
            interpreter could not be run (the error says which).
    """
    if not sources or sys.implementation.cache_tag is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="precompile-pyc-") as tmp:
        jobs = []
        for name, data in sources.items():
            src = os.path.join(tmp, name)
            with open(src, "wb") as f:
                f.write(data)
            pyc = shipped_path(src)
            assert pyc is not None
            jobs.append((src, pyc, name))
        try:
            done = subprocess.run(
                [sys.executable, "-I", program_path("compile_pycs"), json.dumps(jobs)],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(
                f"Failed to byte-compile the source halves with {sys.executable}: {e}"
            ) from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise BuildError(
                f"Failed to byte-compile the source halves ({', '.join(sources)}): {last}. "
                "A source half that does not compile is a capture bug: please report it with "
                "the captured file (`python -m precompile_build capture`)."
            )
        out = {}
        for _, pyc, _ in jobs:
            with open(pyc, "rb") as f:
                out[os.path.basename(pyc)] = f.read()
        return out
