"""Fixture capture script: a frozen-engine capture whose compiler fails.

Inductor is made to raise (as an upstream compiler bug would, e.g. torch 2.13's
`InductorError: KeyError: 'buf1'` on `full` + `index_put_` + `softmax`), so the
target's `fallback` setting decides what happens. Nothing is compiled.
"""

import torch
import torch._inductor

import precompile_build


def _broken_compile(*args, **kwargs):
    raise torch._inductor.exc.InductorError(KeyError("buf1"), None)


torch._inductor.standalone_compile = _broken_compile
with precompile_build.capture(lambda x: (x * 2).softmax(-1), engine="frozen") as f:
    f(torch.randn(2, 3))
