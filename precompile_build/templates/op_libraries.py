# ---- the libraries whose custom ops the graph calls, imported at load -------------
# Copied verbatim into every source half of the `frozen` and `eager` engines, before
# the driver (driver.py's load() calls _import_op_libraries), by codegen.py.
# PRECOMPILE_METADATA["op_libraries"] (capturing/custom_ops.py): per op namespace the
# ops the graph calls (``torchvision::nms``) and the modules whose import registers
# them (``torchvision``); ``__main__`` where the capture script defined them.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import PRECOMPILE_METADATA, CallError
# end stand-ins

import importlib as _importlib

_OP_LIBRARIES = PRECOMPILE_METADATA.get("op_libraries") or {}


def _has_op(qualname):
    ns, _, name = qualname.partition("::")
    return hasattr(
        getattr(torch.ops, ns), name
    )  # (torch.ops.NS.NAME: an AttributeError when unknown)


def _import_op_libraries():
    """Import the modules that register the custom ops the graph calls (at load: the
    graph and the wrapper look ``torch.ops.NS.NAME`` up when they run). Raises
    CallError naming the library where one cannot be imported or does not define an
    op the graph calls."""
    target = PRECOMPILE_METADATA["target"]
    for entry in _OP_LIBRARIES.values():
        ops = ", ".join(entry["ops"])
        for module in entry["modules"]:
            if module == "__main__":
                continue  # the capture script's ops: checked below, the process may define them
            try:
                _importlib.import_module(module)
            except Exception as e:
                raise CallError(
                    f"target {target!r}: the captured graph calls {ops}, registered by the "
                    f"module {module!r}, which this process cannot import ({type(e).__name__}: "
                    f"{e}); install the library that provides {module.partition('.')[0]!r}"
                ) from None
        missing = [q for q in entry["ops"] if not _has_op(q)]
        if missing:
            where = (
                "the capture script defined them: define them in a module of your package, "
                "captured from there, or register them before loading"
                if "__main__" in entry["modules"]
                else f"import what registers them before loading (at capture: {', '.join(entry['modules'])})"
            )
            raise CallError(
                f"target {target!r}: the captured graph calls {', '.join(missing)}, which this "
                f"process has not registered; {where}"
            )
