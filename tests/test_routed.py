"""``precompile_runtime.packaged``: a library's own function served by
its packaged pair where one serves this host and call, and by its own Python otherwise
(quietly, or raising in strict mode). The real model, built and served through
``model(x)``: test_build_backends_slow.py."""

from __future__ import annotations

import warnings

import pytest

from precompile_runtime import CallError, RoutedFallbackWarning, TargetNotFoundError, packaged

pytestmark = pytest.mark.usefixtures("runtime_env")


def test_a_call_goes_through_the_pair_loaded_once(pkg):
    @packaged("fwd", package=pkg.name)
    def fwd():
        return "own"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fwd()[0] == "kernels" and fwd()[0] == "kernels"
    assert (fwd.route.served, fwd.route.fallback) == (2, 0)
    assert pkg.marker.read_text().count("exec") == 1  # loaded once
    assert fwd.__wrapped__() == "own" and fwd.__name__ == "fwd"


def test_no_target_for_this_host_runs_the_own_python_with_one_warning(pkg, monkeypatch):
    @packaged("nosuch", package=pkg.name)
    def fwd(x):
        return x + 1

    with pytest.warns(
        RoutedFallbackWarning,
        match=r"fwd \(packaged target 'nosuch' of 'pcbfake_.*'\) runs its own "
        r"Python on this host: .*nosuch",
    ):
        assert fwd(1) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert fwd(2) == 3
    assert (fwd.route.served, fwd.route.fallback) == (0, 2) and "nosuch" in fwd.route.reason

    strict = packaged("nosuch", package=pkg.name, strict=True)(lambda x: x)
    with pytest.raises(TargetNotFoundError):
        strict(1)
    monkeypatch.setenv("PRECOMPILE_STRICT", "1")
    with pytest.raises(TargetNotFoundError):
        packaged("nosuch", package=pkg.name)(lambda x: x)(1)


def test_a_call_the_pair_does_not_cover_runs_the_own_python_quietly(pkg, monkeypatch):
    def pair(x):
        if x != 1:
            raise CallError("target 'fwd': shape [3] (captured [2])")
        return "pair"

    @packaged("fwd", package=pkg.name)
    def fwd(x):
        return "own"

    fwd.route._pair = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [fwd(1), fwd(2)] == ["pair", "own"]
    assert (fwd.route.served, fwd.route.fallback) == (1, 1) and "captured [2]" in fwd.route.reason
    monkeypatch.setenv("PRECOMPILE_STRICT", "1")
    with pytest.raises(CallError):
        fwd(2)


def test_inside_a_capture_the_own_python_runs(pkg, monkeypatch):
    """The build's capture script (PRECOMPILE_TARGET set) captures the library's code."""
    monkeypatch.setenv("PRECOMPILE_TARGET", "fwd")

    def fwd():
        return "own"

    assert packaged("fwd", package=pkg.name)(fwd) is fwd  # not wrapped: the trace reads none of it
    assert fwd() == "own"
    assert not pkg.marker.exists() or "exec" not in pkg.marker.read_text()


def test_a_method_is_routed_with_its_instance_as_the_first_argument(pkg):
    seen = []

    class Model:
        @packaged("fwd", package=pkg.name)
        def forward(self, x):
            return ("own", x)

    Model.forward.route._pair = lambda model, x: seen.append(model) or ("pair", x)
    m = Model()
    assert m.forward(3) == ("pair", 3) and seen == [m]
