"""The kept alias verdict (engines/_call_args.py): a call whose inputs are those of the
last passing call skips the full check, and anything that can make an input written
to share memory with another input or a parameter ends the verdict."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402
from precompile_runtime import CallError  # noqa: E402


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 2.0), requires_grad=False)

    def forward(self, y):
        y.add_(1)  # the captured function writes its input
        return y * self.w


def step(m, y):
    return m(y)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    with torch.no_grad(), precompile_build.capture(step, engine="frozen", artifact_path=d / "t.py",
                                                   cache_path=d / "t.cache") as f:
        f(Scale(), torch.zeros(4))
    return load_pair(d / "t.py", d / "t.cache")


@pytest.mark.parametrize("how", ["data", "set_"])
def test_a_parameter_moved_onto_the_written_input_between_calls_is_refused(served, how):
    m, y = Scale(), torch.zeros(4)
    for _ in range(2):  # passing calls: the verdict is kept
        with torch.no_grad():
            served(m, y)
    with torch.no_grad():
        if how == "data":
            m.w.data = y  # the same Parameter object, now y's memory
        else:
            m.w.set_(y)
    with pytest.raises(CallError, match=r"argument 'y' shares memory with parameter/buffer \S*w\b"):
        with torch.no_grad():
            served(m, y)


def test_the_same_inputs_again_are_served(served):
    m, y = Scale(), torch.zeros(4)
    with torch.no_grad():
        for _ in range(3):
            out = served(m, y)
    torch.testing.assert_close(y, torch.full((4,), 3.0))
    torch.testing.assert_close(out, torch.full((4,), 6.0))
