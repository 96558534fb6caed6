"""Capture script of the fixture: the package's TinyMLP.forward as written (in a capture
script `packaged` leaves it undecorated), called as forward(model, x) on a (2, 8) input."""

import torch
from skbpkg.model import TinyMLP

import precompile_build

model = TinyMLP().eval()
with torch.no_grad(), precompile_build.capture(TinyMLP.forward) as fn:
    fn(model, torch.randn(2, 8))
