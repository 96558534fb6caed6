"""What a trace assumed of Python state, checked by every served call:
attributes the trace read (flags, dicts, a config's fields), the module hooks that ran,
module-level values, and data-dependent decisions a tracer would freeze (refused).
capturing/assumed_state.py records; templates/assumed_state.py checks."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from _pairs import load_pair

import precompile_build
from precompile_build.errors import CaptureError, PythonStateWarning
from precompile_runtime.errors import CallError


def _serve(tmp_path, fn, *args, engine="eager", name="t", **kw):
    """``fn(*args)`` captured (eager engine unless told: the driver's checks are the
    same code for both engines), then loaded in this process."""
    paths = {"artifact_path": tmp_path / f"{name}.py", "cache_path": tmp_path / f"{name}.cache"}
    with precompile_build.capture(fn, engine=engine, target=name, **paths, **kw) as f:
        f(*args)
    return load_pair(paths["artifact_path"], paths["cache_path"])


class Config:
    """A plain object a model holds (as transformers' models hold their config)."""

    def __init__(self):
        self.double = False


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scaling = {"default": 2.0}
        self._disabled = False
        self.config = Config()

    def forward(self, x):
        y = self.lin(x)
        if self._disabled:
            return y
        y = y * self.scaling["default"]
        return y * 2 if self.config.double else y


def call(m, x):
    return m(x)


def test_a_dict_a_private_flag_and_a_configs_field_read_by_the_trace_are_checked(tmp_path):
    torch.manual_seed(0)
    m, x = Scaled().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    for _ in range(3):  # the fast path between full checks
        torch.testing.assert_close(f(m, x), m(x))

    m.scaling["default"] = 0.5  # changed in place: no assignment the epoch sees
    with pytest.raises(CallError, match=r"m: scaling\['default'\] was 2.0 at capture, now 0.5"):
        f(m, x)
    m.scaling["default"] = 2.0
    torch.testing.assert_close(f(m, x), m(x))

    m._disabled = True  # a private flag on a model already checked
    with pytest.raises(CallError, match=r"m: _disabled was False at capture, now True"):
        f(m, x)
    m._disabled = False
    torch.testing.assert_close(f(m, x), m(x))

    m.config.double = True  # a field of a plain object the model holds
    with pytest.raises(CallError, match=r"m\.config: double was False at capture, now True"):
        f(m, x)
    m.config.double = False
    torch.testing.assert_close(f(m, x), m(x))

    other = Scaled().eval()  # another model of the structure, another state: its own check
    other.scaling = {"default": 3.0}
    with pytest.raises(CallError, match=r"scaling\['default'\] was 2.0 at capture, now 3.0"):
        f(other, x)
    other.scaling = {"default": 2.0}
    torch.testing.assert_close(f(other, x), other(x))


def test_the_message_names_the_parameter_the_model_was_passed_as(tmp_path):
    m, x = Scaled().eval(), torch.randn(2, 4)

    def swapped(x, net):  # the model second
        return net(x)

    f = _serve(tmp_path, swapped, x, m)
    m.scaling["default"] = 0.5
    with pytest.raises(CallError, match=r"target 't': net: scaling\['default'\] was 2.0"):
        f(x, m)


def test_the_frozen_engine_checks_the_same_state(tmp_path):
    torch.manual_seed(0)
    m, x = Scaled().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x, engine="frozen")
    torch.testing.assert_close(f(m, x), m(x))
    m.scaling["default"] = 1.0
    with pytest.raises(CallError, match=r"scaling\['default'\] was 2.0 at capture, now 1.0"):
        f(m, x)


def test_between_full_checks_a_call_walks_nothing(tmp_path):
    """Nothing is re-read while nothing changed: the full check runs once for many
    calls, and again only after a watched assignment."""
    m, x = Scaled().eval(), torch.randn(2, 4)
    src = tmp_path / "t.py"
    _serve(tmp_path, call, m, x)
    from precompile_runtime.envelope import loads

    loads((tmp_path / "t.cache").read_bytes())
    ns: dict = {"__name__": "pair"}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    f = ns["load"](None)
    full, runs = ns["_assumed_full"], []
    ns["_assumed_full"] = lambda modules: runs.append(1) or full(modules)
    for _ in range(5):
        f(m, x)
    assert len(runs) == 1
    m._note = 1  # an attribute the trace never read: no new full check
    f(m, x)
    assert len(runs) == 1
    m._disabled = False  # a read attribute assigned (even to the same value): checked again
    f(m, x)
    assert len(runs) == 2


class Stack(torch.nn.Module):
    """Slices its ModuleList in forward, as transformers' Llama does
    (``self.layers[: config.num_hidden_layers]``): a new ModuleList each call, its
    submodules registered on it (torch's global registration hooks run)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers[:2]:
            x = layer(x)
        return x


def _counting_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def test_a_loaded_pair_does_not_make_torch_compile_compile_again(tmp_path):
    """The epoch a loaded pair keeps (moved by torch's registration hooks, module
    assignments, train()) is not moved inside a trace: a compiled model that builds a
    module as it runs compiles once, not at every call (the H200 bench hit torch.compile's
    recompile limit beside a loaded pair); a capture in the same process traces one
    graph; the sibling: a Sequential made in the compiled function of the model's
    layers."""
    torch.manual_seed(0)
    m, x = Scaled().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    f(m, x)  # the epoch's hooks are installed
    torch._dynamo.reset()
    graphs: list = []
    s = Stack().eval()
    compiled = torch.compile(s, backend=_counting_backend(graphs))
    for _ in range(4):
        torch.testing.assert_close(compiled(x), s(x))
    assert len(graphs) == 1
    g = _serve(tmp_path, call, s, x, engine="frozen", name="stack")  # a second capture here
    torch.testing.assert_close(g(s, x), s(x))

    def chained(model, x):  # a Sequential made of the model's layers: registered on it
        return torch.nn.Sequential(*model.layers)(x)

    graphs.clear()
    compiled = torch.compile(chained, backend=_counting_backend(graphs))
    for _ in range(4):
        torch.testing.assert_close(compiled(s, x), chained(s, x))
    assert len(graphs) == 1
    torch.testing.assert_close(f(m, x), m(x))


def test_a_watched_assignment_made_by_compiled_code_still_ends_the_verdict(tmp_path):
    """What compiled code changes on a real module reaches the pair: dynamo replays the
    attribute store after its graph (without the class's ``__setattr__``), and the
    epoch's move, traced, is replayed with it."""
    torch.manual_seed(0)
    m, x = Scaled().eval(), torch.randn(2, 4)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    torch._dynamo.reset()

    def disable(model, x):
        model._disabled = True
        return x + 1

    torch.compile(disable, backend="eager")(m, x)
    assert m._disabled is True
    with pytest.raises(CallError, match=r"m: _disabled was False at capture, now True"):
        f(m, x)


def test_what_the_function_itself_changes_is_state_not_an_assumption(tmp_path):
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.eps = 1e-3

        def forward(self, x):
            self.calls += 1
            return x + self.eps

    m, x = Counting(), torch.randn(3)
    with pytest.warns(PythonStateWarning, match="calls"):
        f = _serve(tmp_path, call, m, x)
    m.calls = 7
    torch.testing.assert_close(f(m, x), x + 1e-3)  # `calls` is not checked; `eps` is
    m.eps = 1e-2
    with pytest.raises(CallError, match=r"m: eps was 0.001 at capture, now 0.01"):
        f(m, x)


def test_hooks_that_ran_at_capture_and_hooks_added_later_are_checked(tmp_path):
    torch.manual_seed(0)
    m, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(), torch.randn(2, 4)

    def double(mod, inputs, out):
        return out * 2

    handle = m[0].register_forward_hook(double)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    handle.remove()
    with pytest.raises(
        CallError, match=r"the forward hooks of m\.0 were \[.*double'?\] at capture, now none"
    ):
        f(m, x)
    handle = m[0].register_forward_hook(double)  # the same hook again: served
    torch.testing.assert_close(f(m, x), m(x))

    pre = m[1].register_forward_pre_hook(lambda mod, args: (args[0] - 1,))
    with pytest.raises(
        CallError, match=r"the forward_pre hooks of m\.1 were none at capture, now \["
    ):
        f(m, x)
    pre.remove()
    torch.testing.assert_close(f(m, x), m(x))

    glob = torch.nn.modules.module.register_module_forward_hook(lambda mod, i, o: o)
    try:
        with pytest.raises(
            CallError, match=r"torch's global forward hooks were none at capture, now \["
        ):
            f(m, x)
    finally:
        glob.remove()
    torch.testing.assert_close(f(m, x), m(x))


class Scale:
    """A forward hook with state of its own (a callable object)."""

    def __init__(self, factor):
        self.factor = factor

    def __call__(self, mod, inputs, out):
        return out * self.factor


class Offset:
    """A plain object whose bound method is a forward-pre hook."""

    def __init__(self, shift):
        self.shift = shift

    def shifted(self, mod, args):
        return (args[0] + self.shift,)


def test_a_hooks_own_state_is_checked(tmp_path):
    """A callable object's attributes and a bound method's ``self``'s, read by the trace
    when the hook ran, are checked like a module's: changed, the call is refused naming
    the hook; set back, served equal to eager."""
    torch.manual_seed(0)
    m, x = (
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).eval(),
        torch.randn(2, 4),
    )
    scale, offset = Scale(2.0), Offset(0.5)
    m[0].register_forward_hook(scale)
    m[1].register_forward_pre_hook(offset.shifted)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    scale.factor = 3.0
    with pytest.raises(
        CallError, match=r"m\.0\._forward_hooks\[0\]: factor was 2\.0 at capture, now 3\.0"
    ):
        f(m, x)
    scale.factor = 2.0
    torch.testing.assert_close(f(m, x), m(x))
    offset.shift = -1.0
    with pytest.raises(
        CallError, match=r"m\.1\._forward_pre_hooks\[0\]: shift was 0\.5 at capture, now -1\.0"
    ):
        f(m, x)
    offset.shift = 0.5
    torch.testing.assert_close(f(m, x), m(x))


STATS: dict = {}


def test_a_hook_that_writes_python_state_is_warned_about(tmp_path):
    m, x = torch.nn.Linear(3, 3), torch.randn(2, 3)

    def record(mod, inputs, out):
        STATS[type(mod).__name__] = out.shape[0]
        return None

    h = m.register_forward_hook(record)
    try:
        with pytest.warns(PythonStateWarning, match="STATS"):
            _serve(tmp_path, call, m, x)
    finally:
        h.remove()
        STATS.clear()


def test_a_module_level_value_the_code_reads_is_checked(tmp_path, monkeypatch):
    (tmp_path / "scales_mod.py").write_text(
        textwrap.dedent("""
        SCALES = {"x": 2.0}
        OFFSET = 1

        def scaled(x):
            return x * SCALES["x"] + OFFSET
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("scales_mod")
    try:
        x = torch.randn(3)
        f = _serve(tmp_path, mod.scaled, x)
        torch.testing.assert_close(f(x), mod.scaled(x))
        mod.SCALES["x"] = 3.0
        with pytest.raises(
            CallError, match=r"the global scales_mod\.SCALES\['x'\] was 2.0 at capture, now 3.0"
        ):
            f(x)
        mod.SCALES["x"] = 2.0
        monkeypatch.setattr(mod, "OFFSET", 2)
        with pytest.raises(
            CallError, match=r"the global scales_mod\.OFFSET was 1 at capture, now 2"
        ):
            f(x)
    finally:
        sys.modules.pop("scales_mod", None)


class ClassScaled(torch.nn.Module):
    SCALES = {"a": 2.0}  # class-level: no instance attribute, no assignment to see
    offset = 1.0

    def forward(self, x):
        return x * self.SCALES["a"] + self.offset


def test_class_level_values_the_trace_read_are_compared_on_every_call(tmp_path):
    m, x = ClassScaled(), torch.randn(3)
    f = _serve(tmp_path, call, m, x)
    torch.testing.assert_close(f(m, x), m(x))
    ClassScaled.SCALES["a"] = 3.0
    try:
        with pytest.raises(CallError, match=r"m: SCALES\['a'\] was 2.0 at capture, now 3.0"):
            f(m, x)
    finally:
        ClassScaled.SCALES["a"] = 2.0
    ClassScaled.offset = 0.0  # rebound on the class: no __setattr__ of an instance runs
    try:
        with pytest.raises(CallError, match=r"m: offset was 1.0 at capture, now 0.0"):
            f(m, x)
    finally:
        ClassScaled.offset = 1.0
    torch.testing.assert_close(f(m, x), m(x))


def test_a_graph_that_relies_on_the_default_dtype_checks_it(tmp_path):
    def ramp(x):
        return x + torch.arange(3) * 0.5  # no dtype: eager follows torch.set_default_dtype

    x = torch.ones(3)
    f = _serve(tmp_path, ramp, x)
    g = _serve(tmp_path, lambda x: x * 2, x, name="plain")
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(
            CallError,
            match=r"called with the default dtype torch.float64, but captured "
            r"with torch.float32",
        ):
            f(x)
        torch.testing.assert_close(g(x), x * 2)  # creates no tensor: no default dtype to check
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(f(x), ramp(x))


def test_a_pair_with_nothing_assumed_records_nothing(tmp_path):
    f = _serve(tmp_path, lambda x: x + 1, torch.ones(2))
    src = (tmp_path / "t.py").read_text()
    assert "'assumed': {'globals': [], 'hooks': {'global': [], 'modules': []}, 'reads': []}" in src
    torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 2.0))


# -- data-dependent decisions: refused, never frozen -------------------------------------


def count_branch(x):
    n = torch.nonzero(x > 0).shape[0]
    return x * 2 if n > 2 else x - 1


def passes_a_count_on(x):
    n = torch.nonzero(x > 0).shape[0]
    return torch.zeros(n) + x.sum()


def masked(x):
    return x[x > 0] * 2


@pytest.mark.parametrize("tracer", ["auto", "export", "make_fx"])
def test_a_branch_on_a_data_dependent_size_is_refused_by_every_tracer(tmp_path, tracer):
    with pytest.raises(CaptureError, match=r"data-dependent (branch|decision) \(at ") as info:
        _serve(tmp_path, count_branch, torch.randn(8).abs(), tracer=tracer)
    msg = str(info.value)
    assert (
        "return x * 2 if n > 2 else x - 1" in msg and "torch.where" in msg and "torch.cond" in msg
    ), msg
    assert not (tmp_path / "t.py").exists() and not (tmp_path / "t.cache").exists()


def test_make_fx_refuses_a_data_dependent_size_passed_on(tmp_path):
    with pytest.raises(
        CaptureError, match=r"tracer 'make_fx' would freeze a size computed from the data"
    ):
        _serve(tmp_path, passes_a_count_on, torch.randn(8), tracer="make_fx")


def test_make_fx_keeps_a_data_dependent_size_that_stays_in_tensors(tmp_path):
    x = torch.randn(8)
    f = _serve(tmp_path, masked, x, tracer="make_fx")
    for y in (x, -x.abs(), torch.randn(8)):  # other counts, zero included
        torch.testing.assert_close(f(y), masked(y))


def test_auto_still_falls_back_to_make_fx_where_export_fails_otherwise(tmp_path):
    def pointer_check(x):
        assert x.data_ptr() != 0  # an eager-only check: fake tensors have no storage
        return x * 2

    with pytest.warns(
        precompile_build.TracerFallbackWarning, match="traced with make_fx"
    ):  # (Dynamo neither)
        f = _serve(tmp_path, pointer_check, torch.ones(3), options={"guards": "recorded"})
    torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))


# -- peft (torch 2.14.1's test list: transformers and peft are installed there) ----------


def test_peft_adapter_state_is_checked(tmp_path):
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = get_peft_model(
        transformers.LlamaForCausalLM(cfg).eval(),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    ids = torch.randint(0, 64, (1, 8))

    def logits(m, ids):
        return m(input_ids=ids, use_cache=False).logits

    f = _serve(tmp_path, logits, model, ids)
    torch.testing.assert_close(f(model, ids), logits(model, ids))
    with model.disable_adapter():
        with pytest.raises(CallError, match=r"was False at capture, now True"):
            f(model, ids)
    torch.testing.assert_close(f(model, ids), logits(model, ids))  # adapters back on: served

    q = model.base_model.model.model.layers[0].self_attn.q_proj
    q.set_scale("default", 0.5)
    with pytest.raises(
        CallError,
        match=r"m\.base_model\.model\.model\.layers\.0\.self_attn\.q_proj: "
        r"scaling\['default'\] was 2.0 at capture, now 1.0",
    ):
        f(model, ids)
    q.unscale_layer()  # back to lora_alpha / r
    torch.testing.assert_close(f(model, ids), logits(model, ids))
