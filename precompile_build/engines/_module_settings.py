# ---- model settings: what a capture froze in besides the parameters ----------------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py) and imported by tracing.py at capture: one definition makes both
# the recorded lines and the ones a call is checked against. Needs only the stdlib.
import types as _types

_SETTING_TYPES = (bool, int, float, str, type(None))


def module_settings(module):
    """What the trace froze in of ``module``'s Python settings, one line per submodule
    (pre-order, as the driver walks them): ``"path: module.Class a=1 b='gelu'"``, with
    each public attribute of a plain type (bool/int/float/str/None, or a short
    tuple/list of them) and the name of a function stored as an attribute. Two models
    with equal parameters but another config (heads, eps, activation) differ here.

    Args:
        module: an ``nn.Module``.
    Returns:
        a list of str, one per submodule (the module itself first, path ``.``).
    """
    lines, stack = [], [("", module)]
    while stack:
        path, m = stack.pop()
        words = [f"{path or '.'}: {type(m).__module__}.{type(m).__qualname__}"]
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, _SETTING_TYPES) or (
                    isinstance(v, (tuple, list)) and len(v) <= 16 and all(isinstance(x, _SETTING_TYPES) for x in v)):
                words.append(f"{k}={v!r}")
            elif isinstance(v, (_types.FunctionType, _types.BuiltinFunctionType)):
                words.append(f"{k}={getattr(v, '__module__', '')}.{v.__qualname__}")
        lines.append(" ".join(words))
        stack.extend((f"{path}.{k}" if path else k, c) for k, c in reversed(list(m._modules.items())) if c is not None)
    return lines
