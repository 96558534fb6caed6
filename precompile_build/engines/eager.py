"""The `eager` engine: the captured ATen graph, no kernels.

The pair holds the calling convention and the graph; the cache is an envelope with
no blobs. Useful where no compiler works, to inspect what was traced, and as the
reference the other engines are tested against.
"""

from __future__ import annotations

import hashlib

from precompile_runtime.envelope import Envelope, dumps

from . import codegen
from .tracing import trace_call


def capture_pair(fn, args, kwargs, *, target: str, device: str, options: dict) -> tuple[bytes, bytes]:
    """Capture one call of ``fn`` as an eager pair.

    Returns:
        ``(source_bytes, cache_bytes)``.
    Raises:
        CaptureError: the call cannot be traced (see tracing.trace_call).
    """
    from precompile_runtime.fingerprint import host_fingerprint

    traced = trace_call(fn, args, kwargs, target=target, tracer=options.get("tracer"))
    traced.finish_dynamic(target)
    metadata = dict(traced.metadata, engine="eager", kernels=[])
    if options.get("fallback_reason"):  # the frozen engine's compiler failed (capture_api)
        metadata["fallback"] = {"from": "frozen", "reason": options["fallback_reason"]}
    source = codegen.render(metadata, codegen.graph_source(traced.graph_module), None).encode()
    env = Envelope(
        engine="eager",
        code_hash=hashlib.sha256(source).hexdigest(),
        fingerprint=host_fingerprint(traced.metadata["device"]),
        meta={"target": target},
    )
    return source, dumps(env)
