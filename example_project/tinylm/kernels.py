"""A custom Triton kernel (fused RMSNorm), traceable by make_fx / torch.export.

``fused_rmsnorm`` launches the kernel through ``torch.library.wrap_triton`` so that a
trace records it as a ``triton_kernel_wrapper_*`` higher-order op instead of an opaque
call. Triton is imported lazily: ``import tinylm`` works without it.
"""

from __future__ import annotations

import torch

from .model import rms_norm


def triton_available() -> bool:
    """True when triton can be imported and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def fused_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` in one Triton kernel (CUDA only).

    Args:
        x: ``(..., n)`` CUDA tensor.
        weight: ``(n,)`` CUDA tensor.
        eps: added to the mean square before the reciprocal square root.
    Returns:
        a new tensor shaped like ``x``; no autograd (use :func:`rmsnorm_reference`
        where gradients are needed).
    Raises:
        RuntimeError: ``x`` is not on a CUDA device, or triton is not installed.
    """
    if x.device.type != "cuda":
        raise RuntimeError(f"fused_rmsnorm needs a CUDA tensor, got one on {x.device}")
    try:
        from . import _triton_kernels
    except ImportError as e:
        raise RuntimeError(f"fused_rmsnorm needs triton ({e}); install triton") from e
    import triton

    n = x.shape[-1]
    x2 = x.contiguous().view(-1, n)
    out = torch.empty_like(x2)
    block = triton.next_power_of_2(n)
    torch.library.wrap_triton(_triton_kernels.rmsnorm_fwd_kernel)[(x2.shape[0],)](
        x2, weight.contiguous(), out, n, x2.stride(0), out.stride(0), eps, BLOCK=block
    )
    return out.view(x.shape)


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """The eager reference for :func:`fused_rmsnorm` (any device)."""
    return rms_norm(x, weight, eps)
