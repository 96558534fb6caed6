"""Engines: what turns a captured call into an artifact pair.

Each engine module exposes ``capture_pair(fn, args, kwargs, *, target, device,
options) -> (source_bytes, cache_bytes)``; :func:`precompile_build.capture` picks one
(``config/choices.py`` resolves ``engine="auto"``) and writes the two halves atomically.
``available()`` says whether an engine can run here.

- ``frozen.py``: Inductor's kernels frozen into the pair (``triton_freeze.py`` takes a
  CUDA kernel's cubin and launch, ``cross_arch.py`` and its worker ``cross_compile.py``
  compile them for the other `cuda-archs`, ``kernel_size.py`` strips CPU kernels);
- ``torch_engine.py``: ``torch.compiler.precompile``'s own pair;
- ``eager.py``: the captured ATen graph, no kernels;
- ``codegen.py``: the source half of a frozen or eager pair, from the graph, Inductor's
  wrapper and the serving templates (``precompile_build/templates``).
"""

from __future__ import annotations


def get(engine: str):
    """The module implementing ``engine`` (already resolved)."""
    if engine == "frozen":
        from . import frozen as mod
    elif engine == "eager":
        from . import eager as mod
    elif engine == "torch":
        from . import torch_engine as mod
    else:  # pragma: no cover - resolve() rejects these
        raise ValueError(engine)
    return mod
