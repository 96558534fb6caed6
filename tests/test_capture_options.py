"""capture()'s choices and options are one validated value (capture_options.py): what
parse refuses before anything runs, and what a first call on a device resolves to."""

from __future__ import annotations

import pytest

from precompile_build.config.capture_options import CaptureOptions
from precompile_build.errors import CaptureError


def test_parse_gives_typed_validated_options():
    o = CaptureOptions.parse(target="t", engine="frozen", options={"eager_check": "warn"})
    assert (o.target, o.engine, o.backend, o.tracer, o.fallback) == (
        "t",
        "frozen",
        "inductor",
        "auto",
        "none",
    )
    assert dict(o.options) == {"eager_check": "warn"}


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"backend": "tvm"}, ValueError, "backend='tvm': use 'inductor' or 'eager'"),
        (
            {"fallback": "maybe"},
            ValueError,
            "fallback='maybe' (or PRECOMPILE_FALLBACK): use 'none' or 'eager'",
        ),
        (
            {"options": {"eager_chek": "warn"}},
            ValueError,
            "unknown key 'eager_chek' in options; did you mean 'eager_check'?",
        ),
        (
            {"options": {"validation_multiple": 0}},
            ValueError,
            "options['validation_multiple'] = 0: use a positive",
        ),
        ({"options": ["inductor"]}, TypeError, "options must be a dict"),
        ({"options": {"tracer": "make_fx"}, "tracer": "export"}, ValueError, "disagree"),
        (
            {"options": {"cuda_graphs": "false"}},
            ValueError,
            "options['cuda_graphs'] = 'false': use True or False",
        ),
        (
            {"options": {"cuda_archs": "bogus"}},
            ValueError,
            "options['cuda_archs']: it has 'bogus', which is not a compute capability",
        ),
    ],
)
def test_parse_refuses_what_no_engine_can_take(kwargs, error, text):
    with pytest.raises(error) as e:
        CaptureOptions.parse(target="t", **kwargs)
    assert text in str(e.value)


def test_a_first_call_resolves_the_engine_and_its_options(monkeypatch):
    monkeypatch.delenv("PRECOMPILE_ENGINE", raising=False)
    monkeypatch.setenv("PRECOMPILE_CUDA_GRAPHS", "1")  # the target's cuda-graphs: CUDA only
    with pytest.raises(
        CaptureError, match=r"^target 't': cuda-graphs = true needs a CUDA inference target"
    ):
        CaptureOptions.parse(target="t").for_call("cpu")
    monkeypatch.delenv("PRECOMPILE_CUDA_GRAPHS")
    with pytest.raises(
        CaptureError,
        match=r"^target 't': options\['cuda_archs'\] compiles CUDA kernels for "
        r"other GPUs; this call's arguments are on cpu",
    ):
        CaptureOptions.parse(target="t", options={"cuda_archs": "8.0"}).for_call("cpu")
    engine, options = CaptureOptions.parse(target="t", tracer="make_fx").for_call("cpu")
    assert engine == "frozen" and options == {"tracer": "make_fx"}
    with pytest.raises(
        CaptureError,
        match=r"options 'inductor' apply to the frozen engine's kernels, "
        r"but this capture uses engine 'eager' \(backend='eager'\)",
    ):
        CaptureOptions.parse(target="t", backend="eager", options={"inductor": {}}).for_call("cpu")
