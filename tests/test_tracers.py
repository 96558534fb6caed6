"""The tracers (precompile_build/capturing/tracers.py): torch.export by default, so that
library code takes its trace-friendly paths; make_fx for training steps and where
export fails; clear errors naming the tracer and the line that broke it."""

from __future__ import annotations

import linecache
import re

import pytest

torch = pytest.importorskip("torch")

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402


class LibraryStyleMask(torch.nn.Module):
    """What transformers' mask preparation does: a data-dependent shortcut, skipped
    under torch.compile / torch.export (``torch.compiler.is_compiling()``)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        if not torch.compiler.is_compiling() and mask.all():  # a library's eager-only shortcut
            return self.proj(x)
        return self.proj(x) * mask[..., None]


def mask_forward(model, x, mask):
    return model(x, mask)


def branchy(x):
    if x.sum() > 0:  # data-dependent Python branch, unguarded
        return x * 2
    return x - 1


def _capture(tmp_path, fn, *args, name="t", **kw):
    src, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with precompile_build.capture(fn, artifact_path=src, cache_path=cache, target=name, **kw) as f:
        f(*args)
    return src, cache


def _tracer_of(src) -> str:
    import ast

    text = src.read_text()
    start = text.index("PRECOMPILE_METADATA = ") + len("PRECOMPILE_METADATA = ")
    meta = ast.literal_eval(text[start : text.index("\n# ----", start)])
    return meta["tracer"]


@pytest.mark.parametrize("tracer", ["auto", "export", "export-strict", "make_fx"])
def test_library_sees_a_trace_and_takes_its_traceable_path(tmp_path, tracer):
    torch.manual_seed(0)
    model = LibraryStyleMask().eval()
    x = torch.randn(2, 4, 8)
    mask = torch.ones(2, 4)
    mask[1, 2:] = 0
    src, cache = _capture(tmp_path, mask_forward, model, x, mask, tracer=tracer, engine="eager")
    assert _tracer_of(src) == ("export" if tracer == "auto" else tracer)
    loaded = load_pair(src, cache)
    ones = torch.ones(2, 4)  # eager takes the shortcut here; the graph must still be right
    for m in (mask, ones):
        torch.testing.assert_close(loaded(model, x, m), mask_forward(model, x, m))


def test_export_failure_names_tracer_line_and_advice(tmp_path):
    x = torch.randn(3, 4).abs()
    with pytest.raises(CaptureError) as info:
        _capture(tmp_path, branchy, x, tracer="export", engine="eager")
    msg = str(info.value)
    assert msg.startswith("target 't': tracing failed on a data-dependent branch (at "), msg
    assert "test_tracers.py:" in msg and "if x.sum() > 0" in msg, msg  # the line that broke it
    assert "torch.compiler.is_compiling()" in msg and "torch.where or torch.cond" in msg, (
        msg
    )  # what to try
    assert "a tracer that ran on the example's values would freeze its path" in msg, msg
    assert "make_fx" not in msg.split("The tracers said")[0], (
        msg
    )  # it would freeze the path: not advised
    # our advice before torch's errors (a message cut short still has it); torch's hint
    # for make_fx callers ("set tracing_mode='symbolic' in your make_fx call") is dropped
    assert msg.index("torch.where") < msg.index("The tracers said: export: "), msg
    assert "tracing_mode" not in msg and "Size-like symbols" not in msg, msg
    assert not (tmp_path / "t.py").exists() and not (tmp_path / "t.cache").exists()


def pointer_check(x):
    assert x.data_ptr() != 0  # an eager-only check export's fake tensors cannot run
    return x * 2


def test_auto_falls_back_to_make_fx_with_a_warning(tmp_path):
    """Where export fails on something else than a data-dependent decision (which it
    refuses: tests/test_assumed_state.py), make_fx traces the real tensors."""
    x = torch.randn(3, 4).abs()
    with pytest.warns(
        UserWarning, match=r"torch.export failed .*traced with make_fx, which specialises"
    ) as rec:
        src, cache = _capture(
            tmp_path, pointer_check, x, engine="eager", options={"guards": "recorded"}
        )  # (Dynamo cannot trace it either)
    assert _tracer_of(src) == "make_fx"
    assert {
        (w.filename, linecache.getline(w.filename, w.lineno).strip())  # the user's line
        for w in rec
        if "traced with make_fx" in str(w.message)
    } == {(__file__, "f(*args)")}
    torch.testing.assert_close(load_pair(src, cache)(x), pointer_check(x))


@pytest.mark.parametrize(
    "engine,tracer", [("frozen", "auto"), ("frozen", "make_fx"), ("eager", "export")]
)
def test_an_error_filter_is_for_the_users_code_not_torchs(tmp_path, engine, tracer):
    """Under `-W error` (pytest's `filterwarnings = error`) torch's own warnings inside
    export and Inductor are shown, not raised: raised, they failed the trace ("torch.export
    failed (FutureWarning ...)") or the compile ("Inductor failed: DeprecationWarning ...
    an upstream torch bug"). The capture's own warnings still obey the filter and leave
    nothing behind."""
    import warnings

    x = torch.randn(3, 4).abs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src, cache = _capture(tmp_path, lambda x: x * 2, x, engine=engine, tracer=tracer)
        assert _tracer_of(src) == ("export" if tracer == "auto" else tracer)
        torch.testing.assert_close(load_pair(src, cache)(x), x * 2)
        with pytest.raises(UserWarning, match="traced with make_fx"):  # the fallback's warning
            _capture(tmp_path, pointer_check, x, name="fb", engine=engine)
    assert not (tmp_path / "fb.py").exists() and not (tmp_path / "fb.cache").exists()


def refuses_traces(x):
    if torch.compiler.is_compiling():
        raise RuntimeError("this code path cannot be traced (simulated)")
    return x * 2


def test_both_tracers_failing_are_both_named(tmp_path):
    with pytest.raises(CaptureError) as info:
        _capture(tmp_path, refuses_traces, torch.randn(3, 4).abs(), engine="eager")
    msg = str(info.value)
    assert "export: RuntimeError: this code path" in msg and "; make_fx: RuntimeError" in msg, msg
    assert msg.count("raise RuntimeError(") == 1, msg  # one line broke both: named once
    assert "tracing_mode" not in msg and len(msg.split("The tracers said")[0]) < 700, msg


# expected: the case runs a backward, which Dynamo does not trace
@pytest.mark.filterwarnings("ignore:.*the function runs a backward:UserWarning")
def test_training_step_is_traced_with_make_fx(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)

    def step(model, x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    x = torch.randn(3, 4)
    src, cache = _capture(tmp_path, step, model, x, engine="eager")
    assert _tracer_of(src) == "make_fx"
    with pytest.raises(CaptureError, match=r"runs a backward .*tracer='make_fx' or 'auto'"):
        _capture(tmp_path, step, model, x, name="u", tracer="export", engine="eager")
    model.zero_grad()
    load_pair(src, cache)(model, x)
    got = model.weight.grad.clone()
    model.zero_grad()
    step(model, x)
    torch.testing.assert_close(got, model.weight.grad)


def test_unknown_tracer_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"tracer='dynamo' is not one of 'auto', 'export'"):
        precompile_build.capture(
            branchy,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            tracer="dynamo",
        )


def test_env_selects_the_tracer(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECOMPILE_TRACER", "make_fx")
    src, _ = _capture(tmp_path, lambda x: x * 3, torch.randn(2), engine="eager")
    assert _tracer_of(src) == "make_fx"


def test_target_tracer_key_is_validated_and_reaches_the_script(tmp_path):
    from precompile_build.config.settings import settings_from_table
    from precompile_build.errors import ConfigError

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    with pytest.raises(
        ConfigError, match=r"`tool.precompile.targets.a.tracer` must be one of 'auto'"
    ):
        settings_from_table(
            tmp_path, {"package": "pkg", "targets": {"a": {"script": "cap.py", "tracer": "fx"}}}
        )
    s = settings_from_table(
        tmp_path, {"package": "pkg", "targets": {"a": {"script": "cap.py", "tracer": "make_fx"}}}
    )
    from precompile_build.builder.script import script_env

    env = script_env(s, s.targets["a"], "cpu", tmp_path / "a.py", tmp_path / "a.cache", None)
    assert env["PRECOMPILE_TRACER"] == "make_fx"


def test_dynamic_dims_through_export(tmp_path):
    """Marked dims map onto export's dynamic shapes; the frozen pair serves other sizes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(6, 8)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    src, cache = _capture(tmp_path, lambda m, x: m(x).softmax(-1), model, x, engine="frozen")
    assert _tracer_of(src) == "export"
    loaded = load_pair(src, cache)
    for n in (2, 7, 64):
        y = torch.randn(n, 8)
        torch.testing.assert_close(loaded(model, y), model(y).softmax(-1))


def test_a_size_one_cap_on_the_range_keeps_the_declared_upper_bound(tmp_path):
    """A Conv2d batch marked [1, 64]: the compiler's size-1 guards also cap the range
    (found by a new user: "only holds for [2, 15]"); the advice raises the lower bound
    and keeps 64, and marked that way the pair serves the whole range."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, 2, 1).eval()
    x = torch.randn(2, 3, 16, 16)
    torch._dynamo.mark_dynamic(x, 0, min=1, max=64)
    try:
        src, cache = _capture(tmp_path, lambda m, x: m(x), conv, x, engine="frozen")
    except CaptureError as e:  # torch's compiler capped the range for size 1
        assert "min=2, max=64" in str(e), str(e)
        y = torch.randn(2, 3, 16, 16)
        torch._dynamo.mark_dynamic(y, 0, min=2, max=64)
        src, cache = _capture(tmp_path, lambda m, x: m(x), conv, y, name="u", engine="frozen")
    loaded = load_pair(src, cache)
    with torch.no_grad():
        for n in (2, 16, 64):
            z = torch.randn(n, 3, 16, 16)
            torch.testing.assert_close(loaded(conv, z), conv(z))


def guarded_branch(x):
    # a real choice on values hidden from the trace: eager and the graph differ
    if not torch.compiler.is_compiling() and x.sum() > 0:
        return x * 2
    return x - 1


@pytest.mark.parametrize("engine", ["eager", "frozen"])
def test_a_branch_hidden_from_the_trace_is_refused_by_the_eager_call(tmp_path, engine):
    x = torch.randn(3, 4).abs()
    with pytest.raises(CaptureError, match=r"differs from what the eager call returned at capture"):
        _capture(tmp_path, guarded_branch, x, engine=engine)
    assert not (tmp_path / "t.py").exists()
    # where eager and the trace agree, the pair is written
    src, cache = _capture(tmp_path, guarded_branch, -x, name="u", engine=engine)
    torch.testing.assert_close(load_pair(src, cache)(-x), guarded_branch(-x))
    # 'warn' writes it and says so (not "pass options={'eager_check': 'warn'}")
    with pytest.warns(
        UserWarning, match=r"written anyway \(options=\{'eager_check': 'refuse'\} refuses\)"
    ) as rec:
        _capture(
            tmp_path, guarded_branch, x, name="w", engine=engine, options={"eager_check": "warn"}
        )
    assert (tmp_path / "w.py").exists()
    # attributed to the user's line (the f(*args) in _capture), not to the engine's code
    assert {
        (w.filename, linecache.getline(w.filename, w.lineno).strip())
        for w in rec
        if "written anyway" in str(w.message)
    } == {(__file__, "f(*args)")}


def structure_by_path(x):
    # eager returns more than the trace sees
    if torch.compiler.is_compiling():
        return x * 2
    return x * 2, x.sum()


class CountingDoubler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2, self.calls  # a Python number that differs between trace and call


# expected: the case changes Python state while it is captured
@pytest.mark.filterwarnings("ignore::precompile_build.errors.PythonStateWarning")
@pytest.mark.parametrize("engine", ["eager", "frozen"])
def test_another_structure_from_the_eager_call_is_refused(tmp_path, engine):
    """The eager call returning another structure than the trace (here a tuple where the
    trace returns a tensor) is eager taking another path: both engines refuse it, saying
    both structures (before, the frozen engine skipped the check and the eager engine
    compared values); 'warn' writes it with a warning. A returned Python number whose
    value differs between trace and call (a counter) is the same structure."""
    x = torch.randn(3, 4)
    with pytest.raises(
        CaptureError,
        match=r"target 't': the eager call returned \(Tensor, Tensor\) where "
        r"the traced graph returns Tensor: eager took another code path than the trace",
    ):
        _capture(tmp_path, structure_by_path, x, engine=engine)
    assert not (tmp_path / "t.py").exists()
    with pytest.warns(
        UserWarning, match=r"returned \(Tensor, Tensor\) where the traced graph returns Tensor"
    ):
        src, cache = _capture(
            tmp_path, structure_by_path, x, name="w", engine=engine, options={"eager_check": "warn"}
        )
    torch.testing.assert_close(load_pair(src, cache)(x), x * 2)
    m = CountingDoubler()
    src, cache = _capture(tmp_path, lambda m, x: m(x), m, x, name="c", engine=engine)
    torch.testing.assert_close(load_pair(src, cache)(m, x)[0], x * 2)


def one_more_at_the_end(x):
    # 30 outputs under the trace, 31 in eager: the difference is past any short outline
    return tuple(x * i for i in range(30 if torch.compiler.is_compiling() else 31))


def one_tuple_or_list(x):
    return (x * 2,) if torch.compiler.is_compiling() else [x * 2]


@pytest.mark.parametrize("engine", ["eager", "frozen"])
@pytest.mark.parametrize(
    "fn, match",
    [
        (
            one_more_at_the_end,
            r"returned \(Tensor, Tensor, .*\.\.\. where the traced graph returns \(Tensor, .*\.\.\.",
        ),
        (one_tuple_or_list, r"returned \[Tensor\] where the traced graph returns \(Tensor,\)"),
    ],
)
def test_structures_are_compared_whole(tmp_path, engine, fn, match):
    """Structures are compared in full (a long result differing at its end was accepted
    when the comparison used the shortened text); a one-element tuple reads (Tensor,)."""
    with pytest.raises(CaptureError, match=match):
        _capture(tmp_path, fn, torch.ones(2), engine=engine)


@pytest.mark.parametrize(
    "kw, env, match",
    [
        (
            {"engine": "torch", "tracer": "make_fx"},
            {},
            r"tracer='make_fx' applies to the frozen and eager engines only, but this capture uses engine "
            r"'torch', which would ignore it. Pass engine='frozen'",
        ),
        (
            {"engine": "torch", "fallback": "eager"},
            {},
            r"fallback='eager' applies to the frozen engine only, but this capture uses engine 'torch', ",
        ),
        (
            {},
            {
                "PRECOMPILE_ENGINE": "torch",
                "PRECOMPILE_FALLBACK": "eager",
                "PRECOMPILE_TRACER": "export",
            },
            r"tracer='export' applies to the frozen and eager engines only; fallback='eager' applies to "
            r"the frozen engine only, but this capture uses engine 'torch' \(from PRECOMPILE_ENGINE\)",
        ),
    ],
)
def test_tracer_and_fallback_are_refused_with_the_torch_engine(
    tmp_path, monkeypatch, kw, env, match
):
    """The torch engine traces with torch's own tracers and has no fallback: a `tracer`
    or `fallback` given for it is refused before the function runs, not ignored."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ran = []
    with pytest.raises(CaptureError, match=r"target 't': " + match):
        with precompile_build.capture(
            lambda x: ran.append(x) or x * 2,
            artifact_path=tmp_path / "t.py",
            cache_path=tmp_path / "t.cache",
            **kw,
        ) as f:
            f(torch.ones(2))
    assert ran == [] and not (tmp_path / "t.py").exists()


def test_options_tracer_and_tracer_must_agree(tmp_path, monkeypatch):
    """options['tracer'] (the torch engine's tracer) and tracer= (the other engines')
    given with different values are refused before the function runs, whether tracer=
    comes from the call or from the target's key (PRECOMPILE_TRACER): before, the
    option silently won. Alone, or equal, options['tracer'] is used as tracer=."""
    ran = []
    fn = lambda x: ran.append(x) or x * 2  # noqa: E731
    for kw, env in (({"tracer": "export"}, {}), ({}, {"PRECOMPILE_TRACER": "export"})):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(
            ValueError,
            match=r"target 't': options\['tracer'\] = 'make_fx' and "
            r"tracer='export' \(from the call, the target's `tracer` key or "
            r"PRECOMPILE_TRACER\) disagree",
        ):
            precompile_build.capture(
                fn,
                artifact_path=tmp_path / "t.py",
                cache_path=tmp_path / "t.cache",
                options={"tracer": "make_fx"},
                **kw,
            )
        monkeypatch.delenv("PRECOMPILE_TRACER", raising=False)
    assert ran == []
    src, _ = _capture(
        tmp_path, lambda x: x * 2, torch.ones(2), engine="frozen", options={"tracer": "make_fx"}
    )
    assert _tracer_of(src) == "make_fx"  # auto would have exported
    with pytest.raises(
        ValueError,
        match=r"target 'v': options\['tracer'\] = 'dynamo' is not a tracer of "
        r"the eager engine: use one of 'auto', .*'dynamo' are the torch "
        r"engine's, with engine='torch'",
    ):
        _capture(
            tmp_path, fn, torch.ones(2), name="v", engine="eager", options={"tracer": "dynamo"}
        )
    assert ran == []
    # an empty option is no choice: tracer= decides
    src, _ = _capture(
        tmp_path,
        lambda x: x * 2,
        torch.ones(2),
        name="e",
        engine="eager",
        tracer="make_fx",
        options={"tracer": ""},
    )
    assert _tracer_of(src) == "make_fx"
    src, _ = _capture(
        tmp_path,
        lambda x: x * 2,
        torch.ones(2),
        name="u",
        engine="frozen",
        tracer="make_fx",
        options={"tracer": "make_fx"},
    )
    assert _tracer_of(src) == "make_fx"


# expected: the case changes Python state while it is captured
@pytest.mark.filterwarnings("ignore::precompile_build.errors.PythonStateWarning")
@pytest.mark.parametrize(
    "kw, env, why",
    [
        ({"engine": "eager"}, {}, ""),
        ({"backend": "eager"}, {}, " (backend='eager')"),
        ({}, {"PRECOMPILE_ENGINE": "eager"}, " (from PRECOMPILE_ENGINE)"),
    ],
)
def test_kernel_options_are_refused_with_the_eager_engine(tmp_path, monkeypatch, kw, env, why):
    """The eager engine has no kernels: options about them (inductor, validation_multiple)
    are refused before the function runs, as the torch engine refuses what it would
    ignore (they were ignored). eager_check, which the eager engine reads, is kept."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ran = []
    fn = lambda x: ran.append(x) or x * 2  # noqa: E731
    with pytest.raises(
        CaptureError,
        match=r"target 't': options 'inductor', 'validation_multiple' apply to "
        r"the frozen engine's kernels, but this capture uses engine "
        rf"'eager'{re.escape(why)}, which has none",
    ):
        _capture(
            tmp_path, fn, torch.ones(2), options={"inductor": {}, "validation_multiple": 10}, **kw
        )
    assert ran == [] and not (tmp_path / "t.py").exists()
    src, _ = _capture(tmp_path, fn, torch.ones(2), name="k", options={"eager_check": "warn"}, **kw)
    assert src.exists()


@pytest.mark.parametrize(
    "kw",
    [
        {"tracer": "make_fx"},
        {"fallback": "eager"},
        {"options": {"validation_multiple": 10}},
        {"options": {"eager_check": "warn"}},
        {"options": {"inductor": {}}},
    ],
)
def test_tracer_or_fallback_make_auto_pick_the_frozen_engine(tmp_path, monkeypatch, kw):
    """engine="auto" would pick torch for a CUDA capture where torch has
    torch.compiler.precompile; a target that sets the frozen engine's settings gets
    the frozen engine there instead of an error on GPU hosts only."""
    from precompile_build.config import capture_options

    asked, real = [], capture_options.resolve_engine
    monkeypatch.setattr(
        capture_options, "resolve_engine", lambda e, d: asked.append(e) or real(e, d)
    )
    src, cache = _capture(tmp_path, lambda x: x * 2, torch.ones(2), **kw)
    assert asked == ["frozen"]
    torch.testing.assert_close(load_pair(src, cache)(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize(
    "change", [{"num_attention_heads": 4}, {"hidden_act": "relu"}, {"layer_norm_eps": 1e-3}]
)
def test_a_library_model_of_another_config_is_refused(tmp_path, change):
    """A transformers BertModel with the captured parameters but another config (heads,
    activation, eps: a new user's trial found these served silently wrong) is refused
    at the call; one of the captured config is served."""
    transformers = pytest.importorskip("transformers")
    from precompile_runtime import CallError

    def bert(**kw):
        cfg = dict(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
        )
        torch.manual_seed(0)
        return transformers.BertModel(
            transformers.BertConfig(**{**cfg, **kw}), add_pooling_layer=False
        ).eval()

    def embed(model, ids):
        return model(input_ids=ids).last_hidden_state.mean(1)

    model, ids = bert(), torch.randint(0, 64, (2, 8))
    src, cache = _capture(tmp_path, embed, model, ids, engine="eager")
    loaded = load_pair(src, cache)
    torch.testing.assert_close(loaded(bert(), ids), embed(model, ids))
    moved = bert()
    moved.name_or_path = "/checkpoints/elsewhere"  # where it was loaded from: not a setting
    torch.testing.assert_close(loaded(moved, ids), embed(model, ids))
    other = bert(**change)
    assert not torch.allclose(embed(other, ids), embed(model, ids), atol=1e-6)
    # heads and eps are read by the trace: the assumed-state check names the attribute
    # (model.encoder.layer.0.attention.self: num_attention_heads was 2 ..., now 4); the
    # activation is a function, which the settings check names
    with pytest.raises(
        CallError,
        match=r"model has other settings than the captured model|"
        r"was (a )?\S+ at capture, now (a )?\S+",
    ):
        loaded(other, ids)


@pytest.mark.parametrize(
    "options, keys",
    [
        ({"validation_multiple": 10}, "'validation_multiple'"),
        ({"eager_check": "warn", "inductor": {}}, "'eager_check', 'inductor'"),
    ],
)
def test_frozen_engine_options_are_refused_with_the_torch_engine(tmp_path, options, keys):
    """The frozen engine's options (docs/capture-contract.md's validation_multiple / eager_check for
    deep bf16 models) are refused for engine='torch' before the function runs, instead
    of torch's "unknown torch engine option(s)" after it; auto picks frozen for them."""
    ran = []
    with pytest.raises(
        CaptureError,
        match=rf"target 't': options {keys} apply to the frozen engine "
        r"only, but this capture uses engine 'torch', which would ignore it. Pass "
        r"engine='frozen' .*drop the setting \(the keys of the capture's options=\)",
    ):
        with precompile_build.capture(
            lambda x: ran.append(x) or x * 2,
            artifact_path=tmp_path / "t.py",
            cache_path=tmp_path / "t.cache",
            engine="torch",
            options=options,
        ) as f:
            f(torch.ones(2))
    assert ran == [] and not (tmp_path / "t.py").exists()


def test_backend_option_points_to_the_backend_argument(tmp_path):
    """options={'backend': ...} is not an option (the torch engine's own message no
    longer lists it as one): the message names capture()'s backend= argument."""
    with pytest.raises(
        ValueError,
        match=r"options\['backend'\] = 'eager': the backend is capture\(\)'s "
        r"own argument, not an option; pass backend='inductor' \(default\) or 'eager'",
    ):
        precompile_build.capture(
            lambda x: x,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            options={"backend": "eager"},
        )
