"""Serve tinylm's precompiled ``forward`` over HTTP: FastAPI on uvicorn.

Usage (``pip install tinylm[serve]``)::

    python -m tinylm.serve [--host 127.0.0.1] [--port 8000] [--device cpu]

- ``POST /forward`` ``{"ids": [[...], ...], "dtype": "int64"}``: the logits of
  ``forward(model, ids)`` as ``{"version": N, "shape": [B, T, 256], "dtype":
  "float32", "logits": base64 of the bytes}`` (the weights' version they were computed
  with); an input the target was not captured for (another shape or dtype) is answered
  422 with the loaded function's ``CallError`` message, a call that runs out of GPU
  memory 503 (retry later), and the server goes on.
- ``POST /reload`` ``{"path": "weights.pt", "assign": false}``: load a state dict
  (``torch.load(path, weights_only=True)``) into a new model and make it the one
  requests get; answers the new version. One that fails (no such file, keys or
  shapes that do not fit) is answered 422 and changes nothing. Bind to loopback (the
  default): it reads a path the client names.
- ``GET /health``: the current version.

Reloading cannot mix weights: a request takes the current :class:`Snapshot` (version
and model) once, when it starts, and computes with that model only; a reload builds a
new model (``load_state_dict`` into a fresh one, or ``assign=True``: the fresh module
takes the state dict's tensors as its parameters, no copy) and swaps the reference.
No model a request may hold is ever written to; the old one is freed when its last
request ends. Reloads run one at a time; requests never wait for one.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch
from pydantic import BaseModel

DTYPES = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32}
"""Request dtypes a client may name (anything else: 422 before the call)."""


@dataclass(frozen=True)
class Snapshot:
    """What one request computes with: a model that is never written to."""

    version: int
    model: torch.nn.Module


class Models:
    """The model requests are served with, reloaded by swapping the reference.

    Args:
        model: the first model (version 0).
        build: makes an empty model of the same structure for a reload (default: a
            deep copy of the current one; for a large model pass a factory, with
            ``assign=True`` one that builds on the meta device).
    """

    def __init__(
        self, model: torch.nn.Module, build: Optional[Callable[[], torch.nn.Module]] = None
    ):
        self._snapshot = Snapshot(0, model)
        self._build = build
        self._reloading = threading.Lock()

    def current(self) -> Snapshot:
        """The snapshot to serve a request with (one attribute read: atomic)."""
        return self._snapshot

    def reload(self, state_dict: dict[str, torch.Tensor], *, assign: bool = False) -> Snapshot:
        """Make a new model from ``state_dict`` the one new requests get.

        ``assign=False``: the state dict is copied into a new model on the current
        model's device and dtype; ``assign=True``: the new model's parameters and
        buffers are the state dict's tensors (their device and dtype: load the
        checkpoint with ``map_location``). The training flag is the current model's.
        Returns the new snapshot (version + 1). Raises what ``load_state_dict``
        raises (missing or unexpected keys, a shape mismatch: RuntimeError), before
        anything is swapped.
        """
        with self._reloading:
            old = self._snapshot.model
            fresh = self._build() if self._build is not None else copy.deepcopy(old)
            if not assign:
                ref = next(iter(old.parameters()), None)
                if ref is not None:
                    fresh = fresh.to(device=ref.device, dtype=ref.dtype)
            fresh.load_state_dict(state_dict, assign=assign)
            fresh.train(old.training)
            snapshot = Snapshot(self._snapshot.version + 1, fresh)
            self._snapshot = snapshot  # requests started before keep the old model
            return snapshot


def _tensor_reply(t: torch.Tensor) -> dict[str, Any]:
    """A result as JSON: shape, dtype and the base64 of its bytes (C order)."""
    import ctypes

    t = t.detach().to("cpu").contiguous()
    raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "logits": base64.b64encode(raw).decode(),
    }


class ForwardRequest(BaseModel):
    """``POST /forward``'s body: token ids, one list per row, and their dtype."""

    ids: list[list[int]]
    dtype: str = "int64"


class ReloadRequest(BaseModel):
    """``POST /reload``'s body: a state dict file and how to load it."""

    path: str
    assign: bool = False


def create_app(forward: Callable[..., torch.Tensor], models: Models, *, device: str = "cpu") -> Any:
    """The FastAPI app serving ``forward(model, ids)`` (see the module docstring).

    Args:
        forward: the loaded function (``load_packaged("forward")``) or any callable
            with its convention (eager ``tinylm.forward`` for comparison).
        models: the :class:`Models` requests are served with.
        device: where the request's ids are put.
    """
    from fastapi import FastAPI, HTTPException

    from precompile_runtime import CallError

    app = FastAPI(title="tinylm")

    @app.post("/forward")
    def run_forward(req: ForwardRequest) -> dict[str, Any]:  # a sync endpoint: FastAPI's threads
        if req.dtype not in DTYPES:
            raise HTTPException(
                422,
                {
                    "error": "ValueError",
                    "message": f"dtype {req.dtype!r}: one of {', '.join(DTYPES)}",
                },
            )
        try:
            ids = torch.tensor(req.ids, dtype=DTYPES[req.dtype], device=device)
        except (ValueError, TypeError, RuntimeError) as e:  # ragged rows
            raise HTTPException(422, {"error": type(e).__name__, "message": str(e)}) from None
        snapshot = models.current()  # once: the whole call uses this model
        try:
            logits = forward(snapshot.model, ids)
        except CallError as e:  # not what the target was captured for: the client's to fix
            raise HTTPException(422, {"error": "CallError", "message": str(e)}) from None
        except torch.cuda.OutOfMemoryError as e:  # this call only: the function stays usable
            raise HTTPException(503, {"error": "OutOfMemoryError", "message": str(e)}) from None
        return {"version": snapshot.version, **_tensor_reply(logits)}

    @app.post("/reload")
    def run_reload(req: ReloadRequest) -> dict[str, Any]:
        try:
            state = torch.load(req.path, map_location=device, weights_only=True)
            return {"version": models.reload(state, assign=req.assign).version}
        except Exception as e:  # noqa: BLE001 - no file, not a state dict, keys or shapes that do not fit
            raise HTTPException(
                422,
                {
                    "error": type(e).__name__,
                    "message": f"reload from {req.path} failed: "
                    f"{e}; still serving version {models.current().version}",
                },
            ) from None

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"version": models.current().version}

    return app


@contextlib.contextmanager
def running(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0
) -> Iterator[str]:
    """Run ``app`` on uvicorn in a background thread; yields its base URL
    (``http://127.0.0.1:PORT``; port 0: a free one) and stops it on exit. Raises
    RuntimeError when it has not started within ``timeout`` seconds."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout)


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m tinylm.serve``: the precompiled ``forward`` on uvicorn."""
    import uvicorn

    from precompile_runtime import load_packaged

    from .model import build_model

    p = argparse.ArgumentParser(description="Serve tinylm's precompiled forward over HTTP.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    models = Models(build_model(seed=0, device=a.device))
    uvicorn.run(
        create_app(load_packaged("forward", package="tinylm"), models, device=a.device),
        host=a.host,
        port=a.port,
    )


if __name__ == "__main__":
    main()
