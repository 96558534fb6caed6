# ---- the caller's grad mode and deterministic algorithms, checked per call --------
# Appended after the driver (driver.py) in every frozen or eager source half
# (codegen.py); the capture side, capturing/grad_modes.py, records
# PRECOMPILE_METADATA["ambient"]["grad_off"] and ["deterministic"].
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import _META, CallError, _param_label
# end stand-ins

_MODES = _META.get("ambient") or {}
_GRAD_OFF = bool(_MODES.get("grad_off"))  # traced under the caller's no_grad / inference_mode
# frozen CUDA kernels may accumulate with atomics: not what deterministic algorithms promise
_NOT_DETERMINISTIC = _META["device"] == "cuda" and not _MODES.get("deterministic")
_MODES_CHECKED = _GRAD_OFF or _NOT_DETERMINISTIC


def _check_modes(params, tensors):
    """Raise CallError where the caller's global modes would make eager return something
    the pair does not: grad enabled with an input or parameter that requires grad, for
    a trace that ran under the caller's no_grad (eager's result would carry autograd
    history, the served one none); deterministic algorithms on for a CUDA capture made
    without them."""
    if _GRAD_OFF and torch.is_grad_enabled():
        names = _META["param_names"]
        for i, t in enumerate(params + tensors):
            if t.requires_grad:
                what = (
                    f"parameter/buffer {_param_label(names[i])}"
                    if i < len(params)
                    else f"tensor input #{i - len(params)}"
                )
                raise CallError(
                    f"target {_META['target']!r}: called with grad enabled and {what} requiring grad, "
                    "but captured under torch.no_grad() (or torch.inference_mode()): the pair returns "
                    "results without autograd history, so a backward through them would silently "
                    "leave gradients out. Call it under torch.no_grad() or torch.inference_mode(), "
                    "or turn grad off inside the captured function (with torch.no_grad(): in its "
                    "body) and capture again"
                )
    if _NOT_DETERMINISTIC and torch.are_deterministic_algorithms_enabled():
        raise CallError(
            f"target {_META['target']!r}: called with torch.use_deterministic_algorithms(True), but "
            "captured without it: the frozen kernels were chosen without that constraint and "
            "may not be deterministic. Call it with deterministic algorithms off, or capture "
            "again under torch.use_deterministic_algorithms(True)"
        )
