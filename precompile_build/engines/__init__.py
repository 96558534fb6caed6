"""Engines: what turns a captured call into an artifact pair.

Each engine module has ``capture_pair(fn, args, kwargs, *, target, device, options)
-> (source_bytes, cache_bytes)``; one whose ``JUDGES_EAGER_CALL`` is true (frozen,
eager) also takes ``real_call=``, the user's call run once for real, and judges the
pair by its results. :func:`precompile_build.capture` (api.py) takes the
module from :func:`get` (``config/choices.py`` has already resolved ``engine="auto"``)
and writes the two halves atomically. ``torch_engine.available()`` says whether this
torch has ``torch.compiler.precompile``; the frozen and eager engines run on any torch
the project supports.

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
    """The module implementing ``engine``: ``"frozen"``, ``"eager"`` or ``"torch"``
    (already resolved); ValueError for any other name."""
    if engine == "frozen":
        from . import frozen

        return frozen
    if engine == "eager":
        from . import eager

        return eager
    if engine == "torch":
        from . import torch_engine

        return torch_engine
    raise ValueError(engine)  # pragma: no cover - resolve() rejects these
