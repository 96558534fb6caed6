"""The programs the build runs in a subprocess of its own interpreter, each by its file.

Takes nothing but ``sys.argv``, stdin and the environment the builder gives each
(builder/script.py: the capture script's runner and the imports check;
builder/capture_cache.py: the host fingerprints; builder/runner.py: the CUDA GPU count;
wheels/bytecode.py: the shipped pycs), and gives what each prints or writes. Each is run
as ``python FILE`` (:func:`path`), not ``python -m``: the capture's runner and the imports
check must not import precompile_build before the script's own sys.path is set, the
bytecode compile runs isolated (``-I`` ignores PYTHONPATH), and the probes need only
torch and the runtime; so none needs this package importable in the child. Their folder
holds nothing else, so ``sys.path[0]`` (this folder, until a program replaces it) shadows
no module.
"""

from __future__ import annotations

import os


def path(name: str) -> str:
    """The file of the program ``name`` (``"run_script"``, ...), for ``python FILE``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
