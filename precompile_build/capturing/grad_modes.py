"""The caller's global modes a capture builds in, beyond autocast (tracing.py's ambient
state): grad mode and deterministic algorithms, as Dynamo's global-state guard
(``GRAD_MODE``, ``DETERMINISTIC_ALGORITHMS``) keeps them.

Served results carry no autograd history. A trace that ran under the caller's
``torch.no_grad()``/``torch.inference_mode()`` built that in: called with grad enabled
where an input or parameter requires grad, eager would return a result autograd can
differentiate, and the served one would silently cut the gradient. A function that
turns grad off in its own body (``with torch.no_grad():``, a ``@torch.no_grad()``
forward, ``torch.set_grad_enabled(False)``, ``torch.inference_mode()``) returns the same
whatever the caller's mode, so it is not refused. :func:`watch_body` notes which it is
while the body is traced; :func:`modes` gives what the pair records
(``PRECOMPILE_METADATA["ambient"]``: ``grad_off``, ``deterministic``), checked per call by
templates/grad_modes.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _in_torch(filename: str, torch_dir: str) -> bool:
    return os.path.abspath(filename).startswith(torch_dir)


def _turned_off_by_user_code(torch_dir: str) -> bool:
    """Whether the grad-mode call being made (from torch's grad_mode.py machinery) comes
    from code outside torch: the captured function's body, not a torch helper."""
    machinery = (os.path.join(torch_dir, "autograd", "grad_mode.py"),
                 os.path.join(torch_dir, "utils", "_contextlib.py"))
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if name == machinery[1]:  # a decorated function: whose it is decides
            func = frame.f_locals.get("func")
            code = getattr(func, "__code__", None)
            return code is not None and not _in_torch(code.co_filename, torch_dir)
        if name != machinery[0]:
            return not _in_torch(name, torch_dir)
        frame = frame.f_back
    return False


@contextmanager
def watch_body(box: dict) -> Iterator[None]:
    """While the captured function's body runs (inside the trace, outside Dynamo):
    set ``box["sets_grad_off"] = True`` where code outside torch turns grad off
    (``torch.no_grad()``, ``torch.set_grad_enabled(False)``, ``torch.inference_mode()``,
    as a context or a decorator). Grad-mode changes that torch's own helpers make are
    not counted.

    Args:
        box: a dict the capture reads after the trace.
    Yields:
        nothing; torch's grad-mode entry points are watched until the block ends.
    """
    import torch

    torch_dir = _torch_dir()
    set_grad, inference = torch._C._set_grad_enabled, torch._C._InferenceMode

    def watched_set_grad(mode):
        if not mode and _turned_off_by_user_code(torch_dir):
            box["sets_grad_off"] = True
        return set_grad(mode)

    def watched_inference(mode=True):
        if mode and _turned_off_by_user_code(torch_dir):
            box["sets_grad_off"] = True
        return inference(mode)

    c: Any = torch._C  # its entry points are looked up at each call (torch/autograd/grad_mode.py)
    c._set_grad_enabled, c._InferenceMode = watched_set_grad, watched_inference
    try:
        yield
    finally:
        c._set_grad_enabled, c._InferenceMode = set_grad, inference


def modes(box: dict) -> tuple[bool, bool]:
    """The modes the pair records and the driver checks per call.

    Args:
        box: the dict :func:`watch_body` filled during the trace.
    Returns:
        ``(grad_off, deterministic)``: grad_off is True where the trace ran with grad
        disabled by the caller and the body did not turn it off itself (a grad-enabled
        call with an input or parameter that requires grad is refused); deterministic
        is True where ``torch.use_deterministic_algorithms(True)`` was on.
    """
    import torch

    grad_off = not torch.is_grad_enabled() and not box.get("sets_grad_off")
    return grad_off, torch.are_deterministic_algorithms_enabled()
