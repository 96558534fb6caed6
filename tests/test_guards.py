"""The guards TorchDynamo builds for a captured call, checked by every served call
(capturing/dynamo_guards.py records, templates/guards.py checks): every Python value
the trace read is checked, served fresh and after a served call, or the capture refuses.
Each kind of read has a case and a sibling; each served call is compared with eager."""

from __future__ import annotations

import collections
import enum
import functools
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _pairs import load_pair

import precompile_build
from precompile_build.errors import CaptureError
from precompile_runtime import packaged
from precompile_runtime.errors import CallError

GAIN = 2.0
OFFSET = {"x": 1.0}
SLOPE_MODULE = torch.nn.LeakyReLU(0.1)
helpers = types.ModuleType("guard_helpers")  # an imported module's attribute (H.FACTOR)
helpers.FACTOR = 1.25
sys.modules["guard_helpers"] = helpers


class Consts:
    K = 3.0


class Mode(enum.Enum):
    PLAIN = 1
    SHIFTED = 2


def shift_by(y, amount=0.5):  # a module-level function whose default the trace reads
    return y + amount


def make_post(scale):
    def post(y):
        return y * scale

    return post


class Net(torch.nn.Module):
    SCALE = 1.5

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.cfg = types.SimpleNamespace(
            temp=0.5, inner=types.SimpleNamespace(mult=2.0), gains=[1.0, 1.5]
        )
        self.post = make_post(2.0)
        self.mode = Mode.PLAIN
        self.dtype = torch.float32
        self.acts = [torch.nn.LeakyReLU(0.2)]  # a module in a plain list
        self.act = torch.nn.GELU()
        self.np_scale = np.float64(1.0)
        self.steps = collections.OrderedDict(a=1.0, b=2.0)  # iterated: its order is read

    def helper(self, y):
        return y * GAIN + OFFSET["x"]

    @property
    def factor(self):
        return helpers.FACTOR

    def forward(self, x):
        y = self.helper(self.lin(x)) * self.cfg.temp * self.cfg.inner.mult
        y = y * type(self).SCALE * Consts.K * self.factor * self.np_scale
        y = shift_by(self.post(y))
        for g in self.cfg.gains:  # a list in a config: its length and items have no dict version
            y = y * g
        for _k, v in self.steps.items():
            y = (y + v) * 0.5
        if self.mode is Mode.SHIFTED:
            y = y + 1
        if getattr(self, "_override", None) is not None:
            y = y * self._override
        if hasattr(self, "shift"):
            y = y + self.shift
        y = self.acts[0](self.act(y)).to(self.dtype)
        return SLOPE_MODULE(y)


def call(m, x):
    return m(x)


def _serve(tmp_path, fn, *args, name="t", **kw):
    paths = {"artifact_path": tmp_path / f"{name}.py", "cache_path": tmp_path / f"{name}.cache"}
    with precompile_build.capture(
        fn, engine=kw.pop("engine", "eager"), target=name, **paths, **kw
    ) as f:
        f(*args)
    return load_pair(paths["artifact_path"], paths["cache_path"])


def _changes():
    """(what the change is, a function that makes it on (model, module globals))."""

    def setg(name, v):
        return lambda m: globals().__setitem__(name, v)

    return [
        ("a global read in a helper method", setg("GAIN", 3.0)),
        ("a global dict read in a helper method", lambda m: OFFSET.__setitem__("x", 2.0)),
        (
            "an imported module's attribute read in a property",
            lambda m: setattr(helpers, "FACTOR", 2.0),
        ),
        ("another class's constant", lambda m: setattr(Consts, "K", 4.0)),
        ("a SimpleNamespace config's field", lambda m: setattr(m.cfg, "temp", 0.7)),
        ("a config two attributes deep", lambda m: setattr(m.cfg.inner, "mult", 3.0)),
        ("a list in a config grown in place", lambda m: m.cfg.gains.append(2.0)),
        ("an item of a list in a config replaced", lambda m: m.cfg.gains.__setitem__(1, 3.0)),
        (
            "an OrderedDict the trace iterates reordered in place",
            lambda m: m.steps.move_to_end("a"),
        ),
        ("a class attribute read as type(self).SCALE", lambda m: setattr(Net, "SCALE", 2.5)),
        ("a closure's cell", lambda m: setattr(m, "post", make_post(3.0))),
        (
            "a closure's cell rebound in place",
            lambda m: setattr(m.post.__closure__[0], "cell_contents", 3.0),
        ),
        (
            "a module-level function's default rebound in place",
            lambda m: setattr(shift_by, "__defaults__", (1.5,)),
        ),
        (
            "a helper method replaced on the class",
            lambda m: setattr(Net, "helper", lambda self, y: y * 5.0),
        ),
        (
            "a property replaced on the class",
            lambda m: setattr(Net, "factor", property(lambda self: 3.0)),
        ),
        ("an Enum", lambda m: setattr(m, "mode", Mode.SHIFTED)),
        ("a torch.dtype", lambda m: setattr(m, "dtype", torch.float64)),
        ("a numpy scalar", lambda m: setattr(m, "np_scale", np.float64(3.0))),
        (
            "an attribute absent at capture, read with getattr's default",
            lambda m: setattr(m, "_override", 2.0),
        ),
        ("an attribute absent at capture, read with hasattr", lambda m: setattr(m, "shift", 1.0)),
        ("a module kept in a plain list", lambda m: setattr(m.acts[0], "negative_slope", 0.5)),
        (
            "a module in a plain list replaced by one of the same class",
            lambda m: m.acts.__setitem__(0, torch.nn.LeakyReLU(0.6)),
        ),
        (
            "a config replaced by another of the same type",
            lambda m: setattr(
                m,
                "cfg",
                types.SimpleNamespace(
                    temp=0.9, inner=types.SimpleNamespace(mult=2.0), gains=[1.0, 1.5]
                ),
            ),
        ),
        (
            "a config replaced through __dict__",
            lambda m: m.__dict__.__setitem__(
                "cfg",
                types.SimpleNamespace(
                    temp=0.5, inner=types.SimpleNamespace(mult=4.0), gains=[1.0, 1.5]
                ),
            ),
        ),
        ("a module-level module's setting", lambda m: setattr(SLOPE_MODULE, "negative_slope", 0.3)),
        (
            "an attribute written through __dict__",
            lambda m: m.cfg.__dict__.__setitem__("temp", 0.9),
        ),
        (
            "a module's attribute written through object.__setattr__",
            lambda m: object.__setattr__(m, "np_scale", np.float64(5.0)),
        ),
        ("a submodule of another class", lambda m: setattr(m, "act", torch.nn.ReLU())),
        ("the instance's forward replaced", lambda m: setattr(m, "forward", lambda x: x)),
    ]


@pytest.fixture
def restored():
    """Put the module-level state these tests change back."""
    saved = (GAIN, dict(OFFSET), helpers.FACTOR, Consts.K, Net.SCALE, SLOPE_MODULE.negative_slope)
    methods = {name: vars(Net)[name] for name in ("helper", "factor")}
    defaults = shift_by.__defaults__
    yield
    for name, value in methods.items():
        setattr(Net, name, value)
    shift_by.__defaults__ = defaults
    g = globals()
    g["GAIN"] = saved[0]
    OFFSET.clear()
    OFFSET.update(saved[1])
    helpers.FACTOR, Consts.K, Net.SCALE, SLOPE_MODULE.negative_slope = saved[2:]


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize("what,change", _changes(), ids=[c[0] for c in _changes()])
def test_every_value_the_trace_read_is_checked(tmp_path, restored, what, change, after_a_call):
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), m(x))
    else:
        m = Net().eval()  # a model the pair has not seen
        m.load_state_dict(dict(Net().state_dict()))
    change(m)
    try:
        got = f(m, x)
    except CallError as e:
        assert "at capture" in str(e) or "captured" in str(e), str(e)
        return
    torch.testing.assert_close(got, m(x), msg=f"{what}: served for the captured state")


def test_a_lambda_hook_replaced_by_another_lambda_is_noticed(tmp_path):
    m, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    h = m.register_forward_hook(lambda mod, i, o: o * 2)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    h.remove()
    m.register_forward_hook(lambda mod, i, o: o * 3)
    with pytest.raises(CallError, match="another function than at capture|hooks"):
        f(m, x)
    m._forward_hooks.clear()  # a hook dict emptied in place, between full checks
    with pytest.raises(CallError):
        f(m, x)


def test_a_hook_dict_emptied_in_place_after_a_served_call_is_noticed(tmp_path):
    m, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    m._forward_pre_hooks.clear()
    with pytest.raises(CallError):
        f(m, x)


def test_a_module_replaced_by_another_class_says_so(tmp_path):
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    f(m, x)
    m.act = torch.nn.ReLU()
    with pytest.raises(
        CallError,
        match=r"m\.act was a torch\.nn\.modules\.activation\.GELU at capture, "
        r"now a torch\.nn\.modules\.activation\.ReLU",
    ):
        f(m, x)


@pytest.mark.parametrize(
    "new",
    [
        lambda w: w.t(),
        lambda w: torch.randn(4, 8)[:, ::2],
        lambda w: w.double(),
        lambda w: torch.randn(4, 5),
    ],
    ids=["transposed", "strided", "float64", "another-shape"],
)
def test_a_parameter_replaced_through_data_after_a_served_call_is_served_or_named(tmp_path, new):
    """``p.data = ...`` moves no state epoch: the kernels may meet another stride, dtype
    or shape. The call serves eager's result or raises CallError naming the parameter,
    never a kernel's assertion."""
    m, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x, engine="frozen")
    torch.testing.assert_close(f(m, x), m(x))
    m.weight.data = new(m.weight.data)
    try:
        got = f(m, x)
    except CallError as e:
        assert "weight" in str(e)
        return
    torch.testing.assert_close(got, m(x))


@pytest.mark.parametrize(
    "read",
    [
        lambda x: x / float(abs(x.numpy()).max()),
        lambda x: x * torch.tensor(x.tolist()).abs().max(),
        lambda x: x / float(np.asarray(x).std()),
        lambda x: x / float(x.abs().max()),
        lambda x: x * x.sum().item(),
    ],
    ids=["numpy", "tolist", "asarray", "float", "item"],
)
@pytest.mark.parametrize("tracer", ["make_fx", "auto"])
def test_no_tracer_freezes_a_value_read_from_a_tensor(tmp_path, read, tracer):
    x = torch.randn(3, 4)
    try:
        f = _serve(tmp_path, read, x, tracer=tracer, options={"guards": "recorded"})
    except CaptureError as e:
        assert "tensor's values" in str(e) or "data" in str(e), str(e)
        return
    big = x * 10
    torch.testing.assert_close(f(big), read(big))


def test_a_graph_break_refuses_the_capture_and_names_the_way_out(tmp_path):
    def chatty(m, x):
        print("hello")
        return m(x)

    m, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    with pytest.raises(
        CaptureError, match=r"cannot trace this function in one graph.*guards.*recorded"
    ):
        _serve(tmp_path, chatty, m, x)
    f = _serve(tmp_path, chatty, m, x, name="u", options={"guards": "recorded"})
    torch.testing.assert_close(f(m, x), m(x))
    assert "guards" not in f.metadata


def test_a_training_step_whose_forward_breaks_the_graph_is_checked_by_the_recorder(tmp_path):
    """A training step (a backward inside) whose forward Dynamo breaks first (a library's
    logging call, as GPT-2's loss path on transformers 5) is captured with the recorder's
    checks and says so; the same break in a forward-only function still refuses."""
    import logging

    log = logging.getLogger("precompile-test")

    def train_step(m, x):
        log.debug("step")
        loss = m(x).square().sum()
        loss.backward()
        return loss.detach()

    def forward(m, x):
        log.debug("step")
        return m(x)

    torch.manual_seed(0)
    m, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    ref = torch.nn.Linear(3, 3)
    ref.load_state_dict(m.state_dict())
    with pytest.warns(UserWarning, match=r"runs a backward.*checked by the recorder only"):
        f = _serve(tmp_path, train_step, m, x)
    for p in m.parameters():
        p.grad = None
    torch.testing.assert_close(f(m, x), train_step(ref, x))
    torch.testing.assert_close(m.weight.grad, ref.weight.grad)
    with pytest.raises(
        CaptureError, match=r"cannot trace this function in one graph.*guards.*recorded"
    ):
        _serve(tmp_path, forward, m, x, name="fwd")


def test_a_function_that_reads_nothing_has_no_per_call_check(tmp_path):
    def plain(x):
        return x.sin() * 2

    x = torch.randn(3)
    f = _serve(tmp_path, plain, x)
    checks = f.metadata["guards"]["checks"]
    assert [c for c in checks if c[4]] == []
    torch.testing.assert_close(f(x), plain(x))


def test_a_counter_the_function_changes_is_state_not_an_assumption(tmp_path):
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * 2

    m, x = Counting(), torch.randn(3)
    with pytest.warns(Warning):
        f = _serve(tmp_path, call, m, x)
    for _ in range(3):
        torch.testing.assert_close(f(m, x), x * 2)


def test_a_guard_a_pair_cannot_check_refuses_the_capture(tmp_path):
    """A numpy array the model holds: Dynamo passes it to its graph as an input; a pair
    has the example's values built in and cannot check them cheaply: refused."""

    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = np.arange(3.0)

        def forward(self, x):
            return x * torch.from_numpy(self.table).float()

    m, x = Table(), torch.randn(3)
    with pytest.raises(
        CaptureError,
        match=r"the trace relies on m\.table .*numpy ndarray whose values the graph "
        r"holds; pass it as a tensor argument",
    ):
        _serve(tmp_path, call, m, x)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_dataclass_config_and_a_partial_are_checked(tmp_path):
    import dataclasses
    import functools

    @dataclasses.dataclass
    class Cfg:
        scale: float = 2.0

    def scaled(y, by):
        return y * by

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = Cfg()
            self.fn = functools.partial(scaled, by=3.0)

        def forward(self, x):
            return self.fn(x) * self.cfg.scale

    m, x = Holder(), torch.randn(3)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    m.cfg.scale = 4.0
    with pytest.raises(CallError, match=r"scale was 2.0 at capture, now 4.0"):
        f(m, x)
    m.cfg.scale = 2.0
    m.fn = functools.partial(scaled, by=5.0)
    try:
        got = f(m, x)
    except CallError:
        return
    torch.testing.assert_close(got, m(x))


def test_a_module_captured_as_the_function_keeps_its_own_state_as_constants(tmp_path):
    """``capture(model)``: the model is the pair's (as a closure's values are); its
    state is not an argument, so a call checks nothing of it and serves the capture's."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.cfg = types.SimpleNamespace(t=2.0)

        def forward(self, x):
            return self.lin(x) * self.cfg.t

    m, x = Scaled(), torch.randn(2, 3)
    want = m(x)
    f = _serve(tmp_path, m, x)
    torch.testing.assert_close(f(x), want)
    assert all("self" not in c[2] for c in f.metadata["guards"]["checks"])


def test_a_decorated_function_is_checked_through_its_arguments(tmp_path):
    """A decorated function (``@torch.no_grad()``): Dynamo's frame is the decorator's
    wrapper, its guards start from ``args``/``kwargs``: served equal, a change named."""

    class Cfgd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.cfg = types.SimpleNamespace(temp=0.5)

        def forward(self, x):
            return self.lin(x) * self.cfg.temp

    @torch.no_grad()
    def scaled(m, x):
        return m(x) * 2

    m, x = Cfgd(), torch.randn(2, 3)
    f = _serve(tmp_path, scaled, m, x)
    torch.testing.assert_close(f(m, x), scaled(m, x))
    m.cfg.temp = 0.25
    with pytest.raises(CallError, match=r"cfg\.temp was 0\.5 at capture, now 0\.25"):
        f(m, x)


def test_a_length_checked_value_that_became_none_is_a_call_error(tmp_path):
    class Sized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = (1.0, 2.0)

        def forward(self, x):
            return x * len(self.scales)

    m, x = Sized(), torch.randn(3)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    m.scales = None
    with pytest.raises(CallError, match=r"m(\.|: )scales"):
        f(m, x)


class _Base(torch.nn.Module):
    OFFSET = 0.5


class _Derived(_Base):
    SCALE = 1.5

    def forward(self, x):
        return x * type(self).SCALE + type(self).OFFSET


@pytest.mark.parametrize(
    "dynamo_guards_them", [True, False], ids=["this torch", "a torch that does not"]
)
def test_a_class_attribute_own_or_inherited_is_checked_after_a_served_call(
    tmp_path, monkeypatch, dynamo_guards_them
):
    """A class attribute read as ``type(self).X``, defined on the class or a base, is
    checked; the dict versions of the classes of the MRO up to the one defining it stand
    for it between full checks (a base's value changed, or the class shadowing it). torch
    2.11's Dynamo reads class attributes without a guard (torch.compile then serves the
    stale value): where the probe finds that, every plain attribute of the classes the
    guards reached is checked."""
    from precompile_build.capturing import class_attributes, dynamo_collect

    if not dynamo_guards_them:
        monkeypatch.setattr(class_attributes, "dynamo_guards_them", lambda collect: False)
    elif not class_attributes.dynamo_guards_them(dynamo_collect.collect):
        pytest.skip("this torch's Dynamo does not guard class attributes")
    m, x = _Derived(), torch.randn(3)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    for cls, name, value in ((_Derived, "SCALE", 2.5), (_Base, "OFFSET", 1.0)):
        old = getattr(cls, name)
        setattr(cls, name, value)
        try:
            with pytest.raises(
                CallError, match=rf"type\(m\)\.{name} was {old} at capture, now {value}"
            ):
                f(m, x)
        finally:
            setattr(cls, name, old)
        torch.testing.assert_close(f(m, x), m(x))
    _Derived.OFFSET = 2.0  # shadowing the base's, after served calls
    try:
        with pytest.raises(
            CallError,
            match=r"type\(m\)\.OFFSET \(inherited from _Base\): _Derived's own OFFSET "
            r"was False at capture, now True",
        ):
            f(m, x)
    finally:
        del _Derived.OFFSET
    torch.testing.assert_close(f(m, x), m(x))
    assert not [
        c for c in f.__call__.__globals__["_GUARDS"]["checks"] if c[4] and "OFFSET" in c[2]
    ]  # none per call


def test_this_torch_guards_class_attributes_or_the_probe_says_it_does_not():
    """The probe agrees with what Dynamo does: on a torch that guards them (2.13 and
    later) the supplement adds nothing."""
    from precompile_build.capturing import class_attributes, dynamo_collect

    version = tuple(int(p) for p in torch.__version__.split(".")[:2])
    if version == (2, 12):
        pytest.skip("not measured on torch 2.12")
    assert class_attributes.dynamo_guards_them(dynamo_collect.collect) == (version >= (2, 13))
    # a called function's defaults: guarded from 2.13 (2.11 reads them as constants)
    assert class_attributes.dynamo_guards_defaults(dynamo_collect.collect) == (version >= (2, 13))


class _Layer:
    """A request's state passed as an argument (as transformers' StaticCache layers are)."""

    def __init__(self, scale):
        self.scale = scale


class _OtherLayer(_Layer):
    pass


class _State:
    def __init__(self, scales=(2.0, 3.0), shift=0.5, bias=None):
        self.layers = [_Layer(s) for s in scales]
        self.shift = shift
        self.bias = torch.ones(4) if bias is None else bias


# (the capture takes an argument apart through torch's pytree: its tensors are the leaves)
torch.utils._pytree.register_pytree_node(
    _State,
    lambda st: ([st.bias], None),
    lambda v, _: _State(bias=v[0]),
    serialized_type_name="test_guards._State",
)


def step(m, x, state):
    y = m(x) + state.bias
    for layer in state.layers:
        y = y * layer.scale
    return y + state.shift


def _state_changes():
    """(what changes, a function that takes the served state and gives the next call's)."""

    def put(obj, name, value):
        obj.__dict__[name] = value
        return None

    return [
        ("another state object", lambda st: _State(shift=1.5)),
        ("a field set on the same object", lambda st: setattr(st, "shift", 2.5)),
        ("a field written through __dict__", lambda st: put(st, "shift", 3.5)),
        (
            "a list item replaced by another object",
            lambda st: st.layers.__setitem__(0, _Layer(5.0)),
        ),
        ("a list item's field written", lambda st: setattr(st.layers[1], "scale", 7.0)),
        ("a list item's class changed", lambda st: setattr(st.layers[1], "__class__", _OtherLayer)),
        ("the list grown", lambda st: st.layers.append(_Layer(4.0))),
        ("the list replaced", lambda st: setattr(st, "layers", [_Layer(2.0), _Layer(9.0)])),
    ]


@pytest.mark.parametrize("what,change", _state_changes(), ids=[c[0] for c in _state_changes()])
def test_a_non_module_argument_changed_after_a_served_call_is_checked(tmp_path, what, change):
    """A request object's fields and the items of its lists have no per-call check of
    their own: the dicts that hold them are met again by each call and compared by
    identity, version and class (capturing/dict_covers.py). Each change serves eager's
    answer or raises CallError, never the captured state's."""
    torch.manual_seed(0)
    m, x, state = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4), _State()
    f = _serve(tmp_path, step, m, x, state)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x, state), step(m, x, state))
        torch.testing.assert_close(f(m, x, state), step(m, x, state))  # between full checks
        new = change(state) or state
        try:
            got = f(m, x, new)
        except CallError as e:
            assert "at capture" in str(e), str(e)
            return
        torch.testing.assert_close(
            got, step(m, x, new), msg=f"{what}: served for the captured state"
        )


def test_a_non_module_arguments_fields_run_no_per_call_check(tmp_path):
    """Only the list's length runs on every call; the fields and the items' classes are
    stood for by their dicts (the per-call cost of a decode step's cache: bench/results)."""
    m, x, state = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4), _State()
    f = _serve(tmp_path, step, m, x, state)
    ns = f.__call__.__globals__
    per_call = [c[2] for c in ns["_G_CHECKS"] if c[4]]
    assert per_call == ["state.layers"], per_call
    assert ns["_GUARDS"]["by_identity"] == [
        "(state).__dict__",
        "(state.layers[0]).__dict__",
        "(state.layers[1]).__dict__",
    ]
    calls = []
    full, call = ns["_guards_full"], ns["_guards_call"]
    ns["_guards_full"] = lambda *a, **k: calls.append("full") or full(*a, **k)
    ns["_guards_call"] = lambda *a, **k: calls.append("call") or call(*a, **k)
    with torch.no_grad():
        for _ in range(3):
            f(m, x, state)
        assert calls[-2:] == ["call", "call"], calls
        state.shift = 0.25
        with pytest.raises(CallError, match="state.shift was 0.5 at capture, now 0.25"):
            f(m, x, state)
    assert calls[-1] == "full", calls


def test_a_user_triton_kernel_read_by_identity_is_checked_by_its_code():
    """Dynamo guards a user Triton kernel (a global ``triton.jit`` function) by identity:
    the pair checks its Python function's code and the kernel's classes (the H100 run's
    test_gpu_frozen worker-pool case refused it); another object with an ``fn`` stays
    refused."""
    pytest.importorskip("triton")
    import _triton_kernels as k

    from precompile_build.capturing.dynamo_guards import _check_for
    from precompile_build.templates.guard_values import _g_code_is

    guard = types.SimpleNamespace(create_fn=None)
    kind, want = _check_for("ID_MATCH", k.add_kernel, guard)
    assert kind == "code"
    assert _g_code_is(k.add_kernel, want)
    assert not _g_code_is(k.mul_kernel, want)  # another kernel
    assert not _g_code_is(k.tuned, want)  # the same function autotuned: another kernel class
    assert _check_for("ID_MATCH", k.tuned, guard)[0] == "code"
    with pytest.raises(ValueError, match="identity of a SimpleNamespace"):
        _check_for("ID_MATCH", types.SimpleNamespace(fn=make_post(1.0)), guard)


def test_requests_with_their_own_state_interleaved_run_no_full_check(tmp_path):
    """A server interleaves requests, each with its own state object, on one model: each
    state's dicts are remembered once checked (not only the last one's), so calls after
    the first of each run only the per-call checks; a write to one of them is still seen."""
    m, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
    states = [_State(shift=0.5) for _ in range(3)]
    f = _serve(tmp_path, step, m, x, states[0])
    ns = f.__call__.__globals__
    calls = []
    full = ns["_guards_full"]
    ns["_guards_full"] = lambda *a, **k: calls.append("full") or full(*a, **k)
    with torch.no_grad():
        for _ in range(4):
            for st in states:
                torch.testing.assert_close(f(m, x, st), step(m, x, st))
        assert calls.count("full") <= len(states), calls
        states[1].__dict__["shift"] = 0.75
        with pytest.raises(CallError, match="state.shift was 0.5 at capture, now 0.75"):
            f(m, x, states[1])
        torch.testing.assert_close(f(m, x, states[2]), step(m, x, states[2]))


class _BaseRequest:
    OFF = 1.0


class _Request(_BaseRequest):
    def __init__(self, bias=None):
        self.bias = torch.ones(4) if bias is None else bias


torch.utils._pytree.register_pytree_node(
    _Request,
    lambda r: ([r.bias], None),
    lambda v, _: _Request(v[0]),
    serialized_type_name="test_guards._Request",
)


def offset_step(m, x, request):
    return m(x) + request.bias * request.OFF


@pytest.mark.parametrize(
    "shadow",
    [lambda: setattr(_Request, "OFF", 2.0), lambda: setattr(_BaseRequest, "OFF", 3.0)],
    ids=["the subclass shadows it", "the base changes it"],
)
def test_an_argument_classs_inherited_attribute_shadowed_after_a_served_call_is_seen(
    tmp_path, shadow
):
    """A class attribute a base of an argument's class defines (Dynamo reads it through
    ``type(r).__mro__[1].__dict__``): the subclass that starts to define its own is
    seen, as the base's value changing is (each by a class dict's version)."""
    m, x, r = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4), _Request()
    f = _serve(tmp_path, offset_step, m, x, r)
    try:
        with torch.no_grad():
            torch.testing.assert_close(f(m, x, r), offset_step(m, x, r))
            shadow()
            try:
                got = f(m, x, r)
            except CallError as e:
                assert "at capture" in str(e), str(e)
                return
            torch.testing.assert_close(got, offset_step(m, x, r))
    finally:
        _BaseRequest.OFF = 1.0
        if "OFF" in vars(_Request):
            del _Request.OFF


def test_a_list_grown_after_a_served_call_is_named_with_its_length(tmp_path):
    """The length check's message reads as a sentence (was "... has length was 2 ...")."""
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    with torch.no_grad():
        f(m, x)
        m.cfg.gains.append(2.0)
        with pytest.raises(CallError, match=r"the length of m\.cfg\.gains was 2 at capture, now 3"):
            f(m, x)


class _Rule:
    """A request's helper whose methods the trace calls (Dynamo inlines them and guards
    what they read, not which function each was)."""

    def apply(self, y):
        return y * 2.0

    @staticmethod
    def clip(y):
        return y.clamp(-5.0, 5.0)

    @classmethod
    def offset(cls, y):
        return y + 0.5


class _MyRule(_Rule):
    pass


for _cls in (_Rule, _MyRule):  # arguments with no tensors: no pytree children
    torch.utils._pytree.register_pytree_node(
        _cls,
        lambda obj: ([], None),
        lambda _values, _context, cls=_cls: cls(),
        serialized_type_name=f"test_guards.{_cls.__name__}",
    )


def ruled(x, rule):
    return rule.offset(rule.clip(rule.apply(x)))


def _method_changes():
    return [
        ("a base class's method replaced", _Rule, "apply", lambda self, y: y * 3.0),
        ("a subclass defining the method", _MyRule, "apply", lambda self, y: y * 4.0),
        ("a staticmethod replaced", _Rule, "clip", staticmethod(lambda y: y.clamp(-1.0, 1.0))),
        ("a classmethod replaced", _Rule, "offset", classmethod(lambda cls, y: y - 0.5)),
    ]


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
@pytest.mark.parametrize(
    "what,cls,name,new", _method_changes(), ids=[c[0] for c in _method_changes()]
)
def test_a_method_replaced_on_a_class_is_noticed(tmp_path, after_a_call, what, cls, name, new):
    """A method the trace called, replaced on its class or shadowed by a subclass after
    the capture, is a CallError naming it, never the captured method's answer (Dynamo
    2.11 to 2.14 installs no guard on it: torch.compile serves the old one)."""
    x, rule = torch.randn(2, 4) * 4, _MyRule()
    f = _serve(tmp_path, ruled, x, rule)
    if after_a_call:
        torch.testing.assert_close(f(x, rule), ruled(x, rule))
    had = name in vars(cls)
    old = vars(cls).get(name)
    setattr(cls, name, new)
    try:
        with pytest.raises(CallError, match=rf"type\(rule\)\S*{name}"):
            f(x, rule)
    finally:
        if had:
            setattr(cls, name, old)
        else:
            delattr(cls, name)
    torch.testing.assert_close(f(x, rule), ruled(x, rule))  # set back: served again


def test_a_closure_cell_of_a_function_in_a_list_rebound_in_place_is_checked(tmp_path):
    """A function reached through a list item (met again by identity each call) whose
    closure cell is rebound in place: its checks run per call, as nothing's version moves."""
    m, x = torch.nn.Module(), torch.randn(2, 4)
    m.posts = [make_post(2.0)]

    def fn(m, x):
        return m.posts[0](x)

    f = _serve(tmp_path, fn, m, x)
    torch.testing.assert_close(f(m, x), fn(m, x))
    m.posts[0].__closure__[0].cell_contents = 5.0
    with pytest.raises(CallError, match="was 2.0 at capture, now 5.0"):
        f(m, x)


def test_a_functions_code_assigned_after_a_served_call_is_noticed(tmp_path, restored):
    """``f.__code__ = ...`` on a function the trace called moves no dict's version: the
    pair compares the code object it met at the full check on every call."""
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    ns = f.__call__.__globals__
    assert any(s[1] == "__code__" and "shift_by" in s[0] for s in ns["_GUARDS"]["slots"])
    code = shift_by.__code__
    shift_by.__code__ = (lambda y, amount=0.5: y - amount).__code__
    try:
        with pytest.raises(CallError, match="shift_by is another function"):
            f(m, x)
    finally:
        shift_by.__code__ = code
    torch.testing.assert_close(f(m, x), m(x))


def _kw_shift(y, *, amount=0.5):  # a keyword-only default the trace reads
    return y + amount


@pytest.mark.parametrize(
    "rebind",
    [
        ("__kwdefaults__", lambda: setattr(_kw_shift, "__kwdefaults__", {"amount": 2.0})),
        ("deleted", lambda: setattr(_kw_shift, "__kwdefaults__", None)),
    ],
    ids=["assigned", "deleted"],
)
def test_code_and_defaults_are_watched_by_the_audit_hook_and_cells_per_call(tmp_path, rebind):
    """A function's ``__code__``/``__defaults__``/``__kwdefaults__`` writes raise CPython's
    audit event, which moves the state epoch: the fast path compares only the closure
    cells, and a keyword-only default assigned (or deleted) after a served call is still
    noticed."""
    m, x = torch.nn.Module(), torch.randn(2, 4)
    m.post = make_post(2.0)

    def fn(m, x):
        return m.post(_kw_shift(x))

    saved = _kw_shift.__kwdefaults__
    f = _serve(tmp_path, fn, m, x)
    torch.testing.assert_close(f(m, x), fn(m, x))
    ns = f.__call__.__globals__
    kinds = {attr for _expr, attr in ns["_GUARDS"]["slots"]}
    assert {"__kwdefaults__", "cell_contents"} <= kinds
    assert ns["_G_AUDITED"] == [True]
    (seen,) = [s for k, s in ns["_G_SEEN"].items() if k == id(m)]
    assert {attr for _o, attr, _v in seen[4]} == {"cell_contents"}  # compared per call
    try:
        rebind[1]()
        with pytest.raises(CallError, match="amount"):
            f(m, x)
    finally:
        _kw_shift.__kwdefaults__ = saved
    torch.testing.assert_close(f(m, x), fn(m, x))


def test_where_the_audit_hook_is_refused_every_slot_is_compared_per_call(tmp_path):
    """A process whose own audit hook refuses new ones (RuntimeError on
    ``sys.addaudithook``): the pair compares code and defaults per call instead."""
    script = f"""
import subprocess
import sys
def refuse(event, args):
    if event == "sys.addaudithook":
        raise RuntimeError("no more hooks")
sys.addaudithook(refuse)
sys.path.insert(0, {str(Path(__file__).parent)!r})
import pathlib, torch
import test_guards as T
m, x = T.Net().eval(), torch.randn(2, 4)
f = T._serve(pathlib.Path({str(tmp_path)!r}), T.call, m, x)
torch.testing.assert_close(f(m, x), m(x))
ns = f.__call__.__globals__
assert ns["_G_AUDITED"] == [], ns["_G_AUDITED"]
(seen,) = ns["_G_SEEN"].values()
assert "__code__" in {{attr for _o, attr, _v in seen[4]}}
T.shift_by.__code__ = (lambda y, amount=0.5: y - amount).__code__
try:
    f(m, x)
except T.CallError as e:
    assert "shift_by is another function" in str(e), e
    print("NOTICED")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "NOTICED" in out.stdout, out.stdout + out.stderr


class _Routed(torch.nn.Module):
    """A library's model whose forward its package routes through a packaged target."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


@pytest.mark.parametrize("after_a_call", [False, True], ids=["fresh", "after-a-served-call"])
def test_a_forward_routed_through_packaged_is_the_function_as_written(
    tmp_path, monkeypatch, after_a_call
):
    """``@packaged`` leaves a method as written in the capture process (PRECOMPILE_TARGET
    set) and routes it when served: the pair checks the code the routing wrapper stands
    for, so an installed wheel serves. Any other wrapper of that method (functools.wraps,
    a changed result; or one wrapping the routing wrapper) is still a CallError."""
    torch.manual_seed(0)
    m, x = _Routed().eval(), torch.randn(2, 4)
    written = _Routed.forward
    f = _serve(tmp_path, call, m, x)
    want = written(m, x)
    if after_a_call:
        torch.testing.assert_close(f(m, x), want)
    monkeypatch.delenv("PRECOMPILE_TARGET", raising=False)
    routed = packaged("routed_mlp", package="no_such_package")(written)
    monkeypatch.setattr(_Routed, "forward", routed)
    torch.testing.assert_close(f(m, x), want)

    @functools.wraps(written)
    def doubled(self, x):
        return written(self, x) * 2

    @functools.wraps(routed)
    def around(self, x):
        return routed(self, x) * 2

    for other in (doubled, around):
        monkeypatch.setattr(_Routed, "forward", other)
        with pytest.raises(CallError, match=r"forward is another function"):
            f(m, x)
    monkeypatch.setattr(_Routed, "forward", routed)
    torch.testing.assert_close(f(m, x), want)


def test_threads_serving_several_models_each_answer_for_their_own_state(tmp_path, restored):
    """As a server calls a pair: several threads, several models of one class with their
    own weights, interleaved. Each call equals eager for the model it is given; once one
    model's config changes, its calls raise while the others still serve."""
    import threading

    torch.manual_seed(0)
    models = [Net().eval() for _ in range(3)]
    x = torch.randn(2, 4)
    f = _serve(tmp_path, call, models[0], x)
    want = [m(x) for m in models]
    errors: list = []

    def serve(k):
        try:
            for i in range(30):
                j = (i + k) % len(models)
                torch.testing.assert_close(f(models[j], x), want[j])
        except Exception as e:  # reported to the assert below
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    models[1].cfg.temp = 0.9
    with pytest.raises(CallError, match="temp"):
        f(models[1], x)
    torch.testing.assert_close(f(models[0], x), want[0])
    torch.testing.assert_close(f(models[2], x), want[2])
