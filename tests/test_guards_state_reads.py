"""Guards: state a trace reads that moves no version or epoch by itself.

Each case is served fresh and after a served call (the fast path between full checks):
a parameter set to None, a class attribute shadowed on its instance, a module kept in a
plain dict and replaced, and tensors that no call passes (a global tensor, a plain tensor
attribute, a global module's parameters), which the capture refuses.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn.functional as F
from _pairs import load_pair

import precompile_build
from precompile_build.errors import CaptureError
from precompile_runtime.errors import CallError

GLOBAL_SCALE = torch.tensor(2.0)  # a module-level tensor the function reads
GLOBAL_LIN = torch.nn.Linear(4, 4)  # a module-level module with parameters


def _serve(tmp_path, fn, *args):
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with precompile_build.capture(fn, engine="eager", target="t", **paths) as f:
        f(*args)
    return load_pair(paths["artifact_path"], paths["cache_path"])


def call(m, x):
    return m(x)


class Scaled(torch.nn.Module):
    K = 2.0  # a class attribute read through the instance

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.acts = {"act": torch.nn.LeakyReLU(0.1)}  # a module in a plain dict
        self.cfg = {"inner": {"act": torch.nn.GELU()}}  # one two dicts deep

    def scale(self, y):
        return y * self.K

    def forward(self, x):
        y = self.scale(self.lin(x))
        return self.cfg["inner"]["act"](self.acts["act"](y))


def _changes():
    return [
        ("a parameter set to None", lambda m: setattr(m.lin, "bias", None)),
        ("register_parameter(name, None)", lambda m: m.lin.register_parameter("bias", None)),
        ("a class attribute shadowed through __dict__", lambda m: m.__dict__.__setitem__("K", 5.0)),
        (
            "a class attribute shadowed through object.__setattr__",
            lambda m: object.__setattr__(m, "K", 5.0),
        ),
        (
            "a method shadowed on the instance through __dict__",
            lambda m: m.__dict__.__setitem__("scale", lambda y: y * 7.0),
        ),
        ("a module in a plain dict replaced", lambda m: m.acts.__setitem__("act", torch.nn.Tanh())),
        (
            "a module in a plain dict replaced by one of its class, other settings",
            lambda m: m.acts.__setitem__("act", torch.nn.LeakyReLU(0.7)),
        ),
        (
            "a module two dicts deep replaced",
            lambda m: m.cfg["inner"].__setitem__("act", torch.nn.ReLU()),
        ),
    ]


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize("what,change", _changes(), ids=[c[0] for c in _changes()])
def test_a_change_that_moves_no_epoch_is_still_noticed(tmp_path, what, change, after_a_call):
    torch.manual_seed(0)
    m, x = Scaled().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), m(x))
    change(m)
    with pytest.raises(CallError):
        got = f(m, x)
        pytest.fail(f"{what}: served {got} where eager gives {m(x)}")


class PlainTensorAttribute(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.s = torch.tensor(2.0)  # no buffer: not passed per call

    def forward(self, x):
        return self.lin(x) * self.s.item()


def _global_item(m, x):
    return m(x) * GLOBAL_SCALE.item()


def _global_float(m, x):
    return m(x) * float(GLOBAL_SCALE)


def _global_module(m, x):
    return GLOBAL_LIN(m(x))


@pytest.mark.parametrize(
    "fn,model,named",
    [
        (call, PlainTensorAttribute, r"PlainTensorAttribute\.s\b"),
        (_global_item, lambda: torch.nn.Linear(4, 4), "GLOBAL_SCALE"),
        (_global_float, lambda: torch.nn.Linear(4, 4), "GLOBAL_SCALE"),
        (_global_module, lambda: torch.nn.Linear(4, 4), "GLOBAL_LIN"),
    ],
    ids=["item of a plain attribute", "item of a global", "float of a global", "global module"],
)
def test_a_tensor_no_call_passes_is_refused_at_capture(tmp_path, fn, model, named):
    """Its values at capture would be built into the pair: a later in-place change or a
    rebinding would be served stale, so the capture names it instead."""
    m, x = model(), torch.randn(2, 4)
    with pytest.raises(CaptureError, match=rf"(?s)not an input \([^)]*{named}.*register_buffer"):
        _serve(tmp_path, fn, m, x)
    assert not (tmp_path / "t.py").exists()  # nothing half-written


def test_a_buffer_read_by_item_still_serves_each_value(tmp_path):
    """The sibling that must keep working: a registered buffer is an input, so its value
    is read per call, never refused."""

    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("s", torch.tensor(2.0))

        def forward(self, x):
            return self.lin(x) * self.s

    m, x = WithBuffer(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    m.s.fill_(5.0)
    torch.testing.assert_close(f(m, x), m(x))


class ReadsAbsent(torch.nn.Module):
    """Reads two attributes absent at capture, with a default (transformers' way)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x) * getattr(self, "mult", 1.0)
        return y * 3 if hasattr(self.lin, "boost") else y


# a registry written directly is named either way: as the attribute now present, or (the
# structure check) as a parameter or buffer the capture did not lift
_MORE_STATE = "|has 3 parameters/buffers, the capture lifted 2"
_ABSENT_CHANGES = [
    # (what, (a class (None: the model's own) or the registry's owner, attribute, value), message)
    ("set on torch's nn.Module", (torch.nn.Module, "mult", 5.0), r"m\.mult was absent"),
    (
        "set on a submodule's torch class",
        (torch.nn.Linear, "boost", 1),
        r"m\.lin\.boost was absent",
    ),
    ("set on the model's own class", (None, "mult", 5.0), r"m\.mult was absent"),
    (
        "a buffer written into _buffers",
        ("m", "_buffers", "mult"),
        r"m\.mult was absent" + _MORE_STATE,
    ),
    (
        "a parameter written into a submodule's _parameters",
        ("m.lin", "_parameters", "boost"),
        r"m\.lin\.boost was absent" + _MORE_STATE,
    ),
]


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize(
    "change,named", [c[1:] for c in _ABSENT_CHANGES], ids=[c[0] for c in _ABSENT_CHANGES]
)
def test_an_absent_attribute_made_present_anywhere_is_noticed(
    tmp_path, monkeypatch, change, named, after_a_call
):
    """``hasattr`` and ``getattr(x, name, default)`` of an attribute absent at capture
    depend on every class of the instance's MRO (torch's own too) and, for a module, on
    its parameter, buffer and submodule dicts: each made present raises, fresh and after
    a served call (whose fast path checks only what moved)."""
    torch.manual_seed(0)
    m, x = ReadsAbsent().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), m(x))
    owner, attr, value = change
    if isinstance(owner, str):  # a registry written directly: no registration hook runs
        holder = m if owner == "m" else m.lin
        getattr(holder, attr)[value] = torch.nn.Parameter(torch.tensor(5.0))
    else:
        monkeypatch.setattr(owner or ReadsAbsent, attr, value, raising=False)
    assert not torch.equal(m(x), m.lin(x))  # eager follows the change
    with pytest.raises(CallError, match=named):
        got = f(m, x)
        pytest.fail(f"served {got} where eager gives {m(x)}")


class Config:
    def __init__(self):
        self.k = 2.0


class UsesTorchFunctions(torch.nn.Module):
    """Reads torch functions off torch's modules, as model code does."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.Hardtanh()
        self.cfg = Config()

    def forward(self, x):
        return self.act(F.silu(torch.sigmoid(self.lin(x))) * self.cfg.k - 1)


class Hardtanh2(torch.nn.Hardtanh):
    def forward(self, x):
        return super().forward(x) * 2


class WithK5(Config):
    k = property(lambda self: 5.0)  # (the instance's own k is then ignored)


class UsesTorchFunctions2(UsesTorchFunctions):
    def forward(self, x):
        return super().forward(x) + 1


def _wrapped_sigmoid():
    original = torch.sigmoid

    @functools.wraps(original)
    def sigmoid(t):
        return original(t) * 2

    return sigmoid


_REPLACED = [
    ("F.silu replaced", lambda m, mp: mp.setattr(F, "silu", F.relu), "silu"),
    ("torch.sigmoid replaced", lambda m, mp: mp.setattr(torch, "sigmoid", torch.tanh), "sigmoid"),
    (
        "torch.sigmoid wrapped with functools.wraps",
        lambda m, mp: mp.setattr(torch, "sigmoid", _wrapped_sigmoid()),
        "sigmoid",
    ),
    (
        "the model's class swapped through object.__setattr__",
        lambda m, mp: object.__setattr__(m, "__class__", UsesTorchFunctions2),
        "m was a",
    ),
    (
        "a submodule's class swapped through object.__setattr__",
        lambda m, mp: object.__setattr__(m.act, "__class__", Hardtanh2),
        "m.act was a",
    ),
    (
        "a config's class swapped",
        lambda m, mp: setattr(m.cfg, "__class__", WithK5),
        "m.cfg was a",
    ),
]


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize("change,named", [c[1:] for c in _REPLACED], ids=[c[0] for c in _REPLACED])
def test_a_torch_function_or_a_class_replaced_is_noticed(
    tmp_path, monkeypatch, change, named, after_a_call
):
    """A torch function the trace called, replaced on its module (the graph holds the
    original's ops), and a class swapped on an object the checks reach (``__class__``
    assignment moves no dict's version: the audit hook moves the epoch) raise, fresh and
    after a served call, naming what changed."""
    torch.manual_seed(0)
    m, x = UsesTorchFunctions().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), m(x))
    before = m(x)
    change(m, monkeypatch)
    assert not torch.allclose(m(x), before)  # eager follows the change
    with pytest.raises(CallError, match=named):
        got = f(m, x)
        pytest.fail(f"served {got} where eager gives {m(x)}")


class Stacked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Tanh()])
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Sigmoid()})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        for head in self.heads.values():
            x = head(x)
        return x


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.layers.insert(0, torch.nn.Tanh()),
        lambda m: m.heads.pop("b"),
    ],
    ids=["a ModuleList grown", "a ModuleDict popped"],
)
def test_a_submodule_added_or_removed_is_named_as_such(tmp_path, change, after_a_call):
    """Not as a train/eval mode change (the per-submodule flags no longer line up)."""
    m, x = Stacked().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), m(x))
    change(m)
    with pytest.raises(CallError) as raised:
        f(m, x)
    assert "train/eval" not in str(raised.value)
    assert re.search(r"submodules|layers|heads", str(raised.value)), raised.value


def test_triton_s_own_functions_are_the_compiler_stack_s_not_checked(tmp_path, monkeypatch):
    """Dynamo guards ``triton.cdiv`` (a global of the function's module) down to its code;
    like torch's own internals, the pair assumes the Triton it was validated on, so no
    root of its checks names a Triton module (resolving one would import Triton in the
    serving process)."""
    pytest.importorskip("triton")
    (tmp_path / "uses_triton.py").write_text(
        "import triton\n\n\ndef f(x):\n    return x * triton.cdiv(7, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import uses_triton

    x = torch.randn(3)
    f = _serve(tmp_path, uses_triton.f, x)
    roots = f.__call__.__globals__["_GUARDS"].get("roots") or []
    assert not [r for r in roots if "triton" in str(r)], roots
    torch.testing.assert_close(f(x), uses_triton.f(x))


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
def test_a_torch_function_read_through_torch_nn_is_checked_too(tmp_path, monkeypatch, after_a_call):
    """Code that names ``torch.nn.functional.softsign`` in full (no ``F`` alias in its
    module: Dynamo's guard is on ``G['torch'].nn.functional.softsign``) is checked on the
    module that holds the function."""
    (tmp_path / "full_path.py").write_text(
        "import torch\n\n\ndef f(x):\n    return torch.nn.functional.softsign(x) * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import full_path

    x = torch.randn(3)
    f = _serve(tmp_path, full_path.f, x)
    if after_a_call:
        torch.testing.assert_close(f(x), full_path.f(x))
    monkeypatch.setattr(F, "softsign", F.tanhshrink)
    with pytest.raises(CallError, match=r"torch\.nn\.functional\.softsign was"):
        got = f(x)
        pytest.fail(f"served {got} where eager gives {full_path.f(x)}")
