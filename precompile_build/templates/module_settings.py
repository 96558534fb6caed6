# ---- model settings and walks: what a capture froze in besides the parameters -----
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py) and imported by tracing.py at capture: one definition makes both
# the recorded lines and the ones a call is checked against (and one walk of a model's
# tensors and submodules, module_tensors and submodules). Needs only the stdlib.
import types as _types

_SETTING_TYPES = (bool, int, float, str, type(None))
# Public attributes that name where a model came from, not what it computes
# (transformers' PreTrainedModel keeps its checkpoint path and hub tags).
_NOT_SETTINGS = frozenset({"training", "name_or_path", "model_tags"})


def _setting_text(v):
    """``repr`` of a plain value, with an integral float written as the int (a
    config's ``0`` and ``0.0`` are the same setting); None for anything else."""
    if isinstance(v, float) and v.is_integer():
        return repr(int(v))
    if isinstance(v, _SETTING_TYPES):
        return repr(v)
    if (
        isinstance(v, (tuple, list))
        and len(v) <= 16
        and all(isinstance(x, _SETTING_TYPES) for x in v)
    ):
        return "(" + ", ".join(_setting_text(x) for x in v) + ")"
    if isinstance(v, (_types.FunctionType, _types.BuiltinFunctionType)):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return None


def module_setting_items(module):
    """``[(path, class name, {attribute: text})]`` per submodule, pre-order (as the
    driver walks them), the module itself first with path ``.``: each public attribute
    of a plain type (bool/int/float/str/None, a short tuple/list of them) or a function,
    as :func:`_setting_text` writes it."""
    out, stack = [], [("", module)]
    while stack:
        path, m = stack.pop()
        attrs = {}
        for k, v in sorted(vars(m).items()):
            if not k.startswith("_") and k not in _NOT_SETTINGS:
                text = _setting_text(v)
                if text is not None:
                    attrs[k] = text
        out.append((path or ".", f"{type(m).__module__}.{type(m).__qualname__}", attrs))
        stack.extend(
            (f"{path}.{k}" if path else k, c)
            for k, c in reversed(list(m._modules.items()))
            if c is not None
        )
    return out


def module_settings(module, state=()):
    """What the trace froze in of ``module``'s Python settings, one line per submodule:
    ``"path: module.Class a=1 b='gelu'"`` (see :func:`module_setting_items`). Two models
    with equal parameters but another config (heads, eps, activation) differ here.

    Args:
        module: an ``nn.Module``.
        state: ``"path:attribute"`` strings left out: attributes the captured function
            itself changes (a call counter is state, not a setting).
    Returns:
        a list of str, one per submodule.
    """
    return [
        " ".join(
            [f"{path}: {cls}"]
            + [f"{k}={t}" for k, t in attrs.items() if f"{path}:{k}" not in state]
        )
        for path, cls, attrs in module_setting_items(module)
    ]


def module_tensors(modules):
    """Parameters then buffers of each module, tied tensors collapsed by identity, in
    the order the capture lifts them (and the driver re-derives at each call): returns
    ``(names, tensors)``, names ``m<i>.<name>`` for module ``i``."""
    seen, names, tensors = set(), [], []
    for i, mod in enumerate(modules):
        for kind in (mod.named_parameters, mod.named_buffers):
            for name, t in kind(remove_duplicate=False):
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                names.append(f"m{i}.{name}")
                tensors.append(t)
    return names, tensors


def submodules(module):
    """``module`` and every submodule, pre-order (as ``named_modules()`` walks, but
    with duplicates): whose ``.training`` the capture records and a call checks."""
    subs, stack = [], [module]
    while stack:
        m = stack.pop()
        subs.append(m)
        stack.extend(c for c in reversed(list(m._modules.values())) if c is not None)
    return subs
