"""Capture script of the fixture: the package's forward(TinyMLP, x) on a (2, 8) input."""

import torch
from flitpkg.model import TinyMLP, forward

import precompile_build

model = TinyMLP().eval()
with torch.no_grad(), precompile_build.capture(forward) as fn:
    fn(model, torch.randn(2, 8))
