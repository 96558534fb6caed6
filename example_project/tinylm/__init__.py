"""tinylm: a tiny byte-level GPT-style decoder, the precompile-build example library.

``build_model(seed=0)`` gives deterministic weights, ``example_batch()`` a batch cut
from ``DEMO_TEXT``; ``python -m tinylm.demo`` loads the precompiled targets shipped in
the wheel and compares them with eager.
"""

from .data import DEMO_TEXT, decode, encode, example_batch
from .model import TinyLM, TinyLMConfig, build_model
from .steps import forward, train_step

__version__ = "0.1.0"

__all__ = [
    "DEMO_TEXT",
    "TinyLM",
    "TinyLMConfig",
    "build_model",
    "decode",
    "encode",
    "example_batch",
    "forward",
    "train_step",
]
