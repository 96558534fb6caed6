"""Byte-level tokenizer and the fixed demo text used by captures, demo and tests."""

from __future__ import annotations

import torch

DEMO_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness, it was "
    "the spring of hope, it was the winter of despair, we had everything before us, "
    "we had nothing before us."
)
"""A fixed English text (ASCII, 341 bytes) that every example batch is cut from."""


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a 1-D int64 tensor (token ids in ``[0, 256)``)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 is replaced, never raised)."""
    return bytes(int(i) for i in ids.reshape(-1).tolist()).decode("utf-8", errors="replace")


def example_batch(
    device: str | torch.device = "cpu", batch: int = 2, seq: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, targets)``, each ``(batch, seq)`` int64 on ``device``.

    Row ``i`` is the window of :data:`DEMO_TEXT` starting at byte ``i * seq``;
    ``targets`` is ``ids`` shifted left by one byte (next-token prediction).
    Deterministic: the same arguments always give the same tensors.
    """
    tokens = encode(DEMO_TEXT)
    need = batch * seq + 1
    if need > tokens.numel():
        raise ValueError(
            f"example_batch(batch={batch}, seq={seq}) needs {need} bytes of DEMO_TEXT, "
            f"it has {tokens.numel()}"
        )
    starts = torch.arange(batch) * seq
    idx = starts[:, None] + torch.arange(seq)[None, :]
    return tokens[idx].to(device), tokens[idx + 1].to(device)
