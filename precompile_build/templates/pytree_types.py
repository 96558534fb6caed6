# ---- pytree registration of transformers' static caches ----------------------------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py) and imported by pytree_io.py/tracing.py at capture: the capture
# and the serving process register the same flatten/unflatten. Needs torch and the stdlib.
#
# transformers 5.x registers its ModelOutput classes with torch.utils._pytree (with a
# serialized_type_name) and DynamicCache only on request
# (transformers.integrations.executorch.register_dynamic_cache_export_support), but not
# StaticCache, the cache a fixed-shape decode step takes. Registered here by attributes:
# tensor and container attributes (keys, values, cumulative_length; the cache's list of
# layers) are children, the rest (max_cache_len, dtype, device, is_initialized, ...) is
# the context, compared on every call. A class already registered (by transformers or
# the user) is left as it is.
import importlib as _pt_importlib
import json as _pt_json

# (StaticSlidingWindowLayer is not: it keeps a Python int position that each call
# changes, which a served call cannot; a cache with one is refused as unregistered)
CACHE_TYPES = (
    "transformers.cache_utils:StaticCache",
    "transformers.cache_utils:StaticLayer",
)
_PT_REGISTERED: set = set()  # the classes registered by this block, in this process


class NotReady(ValueError):
    """A registered object that cannot be an argument as it is (raised by its flatten)."""


def _pt_flatten(obj):
    d = obj.__dict__
    if d.get("is_initialized") is False:
        # its tensors would be made inside the call, and a served call makes none
        raise NotReady(
            f"a {type(obj).__name__} that is not initialized (its tensors are made at the first "
            "update); allocate them first: cache.early_initialization(batch_size, num_kv_heads, "
            "head_dim, dtype, device), or run one eager call with it"
        )
    import torch

    children, values, other = [], [], []
    for k in sorted(d):  # one pass: this runs on every served call
        v = d[k]
        if isinstance(v, (torch.Tensor, list, tuple, dict)):
            children.append(k)
            values.append(v)
        else:
            other.append((k, v))
    return values, (tuple(children), tuple(other))


# What call_args.py's fast walk recognises (a flatten of this block, in whichever copy
# registered the class: this source's, or precompile_build's at capture): the children
# are the __dict__ values at the context's first keys, the context's others the rest
_pt_flatten.precompile_flatten = "attrs-1"  # type: ignore[attr-defined]


def _pt_flatten_with_keys(obj):
    from torch.utils._pytree import GetAttrKey

    values, context = _pt_flatten(obj)
    return [(GetAttrKey(k), v) for k, v in zip(context[0], values)], context


def _pt_unflattener(cls):
    def unflatten(values, context):
        obj = cls.__new__(cls)
        obj.__dict__.update(context[1])
        obj.__dict__.update(zip(context[0], values))
        return obj

    return unflatten


def _pt_encode(key, v):
    import torch

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"torch.dtype": str(v).rpartition(".")[2]}
    if isinstance(v, torch.device):
        return {"torch.device": str(v)}
    raise TypeError(f"attribute {key!r} is a {type(v).__name__}")


def _pt_decode(v):
    import torch

    if isinstance(v, dict):
        return (
            getattr(torch, v["torch.dtype"])
            if "torch.dtype" in v
            else torch.device(v["torch.device"])
        )
    return v


def _pt_dumps(context):
    return _pt_json.dumps([list(context[0]), [[k, _pt_encode(k, v)] for k, v in context[1]]])


def _pt_loads(text):
    children, other = _pt_json.loads(text)
    return tuple(children), tuple((k, _pt_decode(v)) for k, v in other)


def register_cache_types(names=CACHE_TYPES):
    """Register the classes ``names`` (``module:qualname``) with torch.utils._pytree by
    attributes, those not registered yet; a module that cannot be imported is skipped."""
    from torch.utils import _pytree as pytree

    for name in names:
        module, _, qual = name.partition(":")
        try:
            cls = getattr(_pt_importlib.import_module(module), qual)
        except (ImportError, AttributeError):
            continue
        if cls in pytree.SUPPORTED_NODES:
            continue
        pytree.register_pytree_node(
            cls,
            _pt_flatten,
            _pt_unflattener(cls),
            serialized_type_name=name.replace(":", "."),
            to_dumpable_context=_pt_dumps,
            from_dumpable_context=_pt_loads,
            flatten_with_keys_fn=_pt_flatten_with_keys,
        )
        _PT_REGISTERED.add(cls)


def registered_here(cls):
    """Whether this block registered ``cls`` (the driver must register it too)."""
    return cls in _PT_REGISTERED
