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
while the body is traced: a grad-mode change counts when it is made by the captured
function's own code (its body, or a ``@torch.no_grad()`` on it; a module captured as
the function: its ``forward``), not by what it calls (a library layer's
``@torch.no_grad()``, such as a rotary embedding's, leaves the rest of the model
differentiable, so the call is still checked); :func:`modes` gives what the pair records
(``PRECOMPILE_METADATA["ambient"]``: ``grad_off``, ``deterministic``), checked per call by
templates/grad_modes.py.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch


def _torch_dir() -> str:
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _own_code(fn: Any) -> Any:
    """The code object of the captured function's own body (unwrapped; a module's forward)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    target = inspect.unwrap(getattr(target, "__func__", target))
    return getattr(target, "__code__", None)


def _turned_off_by(own: Any, torch_dir: str) -> bool:
    """Whether the grad-mode call being made (from torch's grad_mode.py machinery) comes
    from the captured function's own code ``own``: a statement of its body, or the
    ``@torch.no_grad()`` on it."""
    machinery = (
        os.path.join(torch_dir, "autograd", "grad_mode.py"),
        os.path.join(torch_dir, "utils", "_contextlib.py"),
    )
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if name == machinery[1]:  # a decorated function: whose it is decides
            func = frame.f_locals.get("func")
            return func is not None and getattr(inspect.unwrap(func), "__code__", None) is own
        if name != machinery[0]:
            return frame.f_code is own
        frame = frame.f_back
    return False


@contextmanager
def watch_body(box: dict, fn: Any) -> Iterator[None]:
    """While the captured function's body runs (inside the trace, outside Dynamo):
    set ``box["sets_grad_off"] = True`` where the function's own code turns grad off
    (``torch.no_grad()``, ``torch.set_grad_enabled(False)``, ``torch.inference_mode()``,
    as a context in its body or a decorator on it). Grad-mode changes of the code it
    calls (torch's helpers, a library layer's decorator) are not counted.

    Args:
        box: a dict the capture reads after the trace.
        fn: the captured function (a function, a method, a module).
    Yields:
        nothing; torch's grad-mode entry points are watched until the block ends.
    """
    torch_dir, own = _torch_dir(), _own_code(fn)
    set_grad, inference = torch._C._set_grad_enabled, torch._C._InferenceMode

    def watched_set_grad(mode):
        if not mode and own is not None and _turned_off_by(own, torch_dir):
            box["sets_grad_off"] = True
        return set_grad(mode)

    def watched_inference(mode=True):
        if mode and own is not None and _turned_off_by(own, torch_dir):
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
    grad_off = not torch.is_grad_enabled() and not box.get("sets_grad_off")
    return grad_off, torch.are_deterministic_algorithms_enabled()
