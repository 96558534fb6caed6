"""[tool.precompile] validation and overrides (precompile_build.config.settings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _build_helpers import build, make_project, target_toml
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from precompile_build.config.settings import load_settings, settings_from_table
from precompile_build.errors import ConfigError

pytestmark = pytest.mark.usefixtures("build_env")


def _load(root, cs=None, env=None):
    return load_settings(root, cs, env or {})


def test_valid_minimal(tmp_path):
    root = make_project(tmp_path)
    s = _load(root)
    assert s.package == "simplepkg" and s.package_dir == root / "simplepkg"
    t = s.targets["double"]
    assert (t.script, t.args, t.device, t.timeout, t.env, t.required) == (
        root / "capture/pair.py",
        (),
        "auto",
        60.0,
        {},
        True,
    )
    assert s.selected == ("double",) and not s.skip and s.torch_pin == "exact"
    assert s.project["name"] == "simplepkg"  # parsed once, for the backend's checks


def test_config_parsing_imports_no_engine_module():
    """settings.py validates `tracer` without importing precompile_build.capturing.tracers
    (nor torch): config parsing stays apart from the engines."""
    import subprocess
    import sys

    code = (
        "import sys, precompile_build.config.settings; "
        "print(sorted(m for m in sys.modules if m.startswith('precompile_build.engines.') "
        "or m in ('precompile_build.capturing.tracers', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "toml, key, suggestion",
    [
        ("[tool.precompile]\ntargts = {}\n", "tool.precompile.targts", "tool.precompile.targets"),
        (
            '[tool.precompile.targets.forward]\nscirpt = "capture/pair.py"\n',
            "tool.precompile.targets.forward.scirpt",
            "tool.precompile.targets.forward.script",
        ),
        (
            '[tool.precompile]\ntorch_pin = "exact"\n[tool.precompile.targets.a]\n'
            'script = "capture/pair.py"\n',
            "tool.precompile.torch_pin",
            "tool.precompile.torch-pin",
        ),
    ],
)
def test_unknown_key_names_dotted_key_and_suggests(tmp_path, toml, key, suggestion):
    root = make_project(tmp_path, toml)
    with pytest.raises(ConfigError, match="unknown key") as e:
        _load(root)
    assert f"`{key}`" in str(e.value) and f"did you mean `{suggestion}`" in str(e.value)
    assert str(e.value).startswith("Failed to validate `tool.precompile`")


@pytest.mark.parametrize(
    "extra, field",
    [
        ('args = "--fast"', "tool.precompile.targets.double.args"),
        ("args = [1, 2]", "tool.precompile.targets.double.args"),
        ('device = "gpu"', "tool.precompile.targets.double.device"),
        ("timeout = -1", "tool.precompile.targets.double.timeout"),
        ('timeout = "10"', "tool.precompile.targets.double.timeout"),
        ("timeout = true", "tool.precompile.targets.double.timeout"),
        ("env = { A = 1 }", "tool.precompile.targets.double.env"),
        ('required = "yes"', "tool.precompile.targets.double.required"),
        ('cuda-graphs = "yes"', "tool.precompile.targets.double.cuda-graphs"),
    ],
)
def test_wrong_types_name_the_field(tmp_path, extra, field):
    root = make_project(
        tmp_path, f'[tool.precompile.targets.double]\nscript = "capture/pair.py"\n{extra}\n'
    )
    with pytest.raises(ConfigError, match=f"`{field}`"):
        _load(root)


@pytest.mark.parametrize(
    "toml, match",
    [
        ("", "the table is missing"),
        ('[tool.precompile]\npackage = "simplepkg"\n', "`tool.precompile.targets` is missing"),
        ("[tool.precompile.targets]\n", "`tool.precompile.targets` is empty"),
        ('[tool.precompile]\ntargets = ["a"]\n', "`tool.precompile.targets` must be a table"),
        (
            "[tool.precompile.targets.a]\nargs = []\n",
            "`tool.precompile.targets.a.script` is required",
        ),
        (
            '[tool.precompile.targets.my-target]\nscript = "capture/pair.py"\n',
            "must be a Python identifier",
        ),
        (
            '[tool.precompile.targets.1st]\nscript = "capture/pair.py"\n',
            "must be a Python identifier",
        ),
        ('[tool.precompile.targets.a]\nscript = "capture/nope.py"\n', "no such file"),
        (
            '[tool.precompile.targets.a]\nscript = "capture/pair.py"\n'
            '[tool.precompile.targets.a]\nscript = "capture/pair.py"\n',
            "Failed to parse",
        ),
        (
            '[tool.precompile]\ntorch-pin = "loose"\n[tool.precompile.targets.a]\n'
            'script = "capture/pair.py"\n',
            "`tool.precompile.torch-pin` must be one of",
        ),
        (
            '[tool.precompile.targets.a]\nscript = "capture/pair.py"\ndevice = "cpu"\ncuda-graphs = true\n',
            r"`tool.precompile.targets.a.cuda-graphs` = true replays CUDA graphs of CUDA kernels, but "
            r"`tool.precompile.targets.a.device` is \"cpu\": set `device` to \"auto\"",
        ),
    ],
)
def test_table_errors(tmp_path, toml, match):
    root = make_project(tmp_path, toml)
    with pytest.raises(ConfigError, match=match):
        _load(root)


def test_script_outside_root_via_dotdot(tmp_path):
    root = make_project(tmp_path, '[tool.precompile.targets.a]\nscript = "../outside.py"\n')
    (tmp_path / "outside.py").write_text("")
    with pytest.raises(ConfigError, match="outside the project root"):
        _load(root)


def test_script_outside_root_via_symlink(tmp_path):
    root = make_project(tmp_path, '[tool.precompile.targets.a]\nscript = "capture/link.py"\n')
    (tmp_path / "outside.py").write_text("")
    os.symlink(tmp_path / "outside.py", root / "capture" / "link.py")
    with pytest.raises(ConfigError, match="outside the project root"):
        _load(root)


def test_symlink_inside_root_is_fine(tmp_path):
    root = make_project(tmp_path, '[tool.precompile.targets.a]\nscript = "link.py"\n')
    os.symlink(root / "capture" / "pair.py", root / "link.py")
    assert _load(root).targets["a"].script == root / "capture" / "pair.py"


def test_package_not_in_distribution(tmp_path):
    root = make_project(tmp_path, '[tool.precompile]\npackage = "other"\n' + target_toml())
    with pytest.raises(ConfigError, match="`tool.precompile.package` = 'other' is not in"):
        _load(root)


def test_package_ambiguous_and_missing(tmp_path):
    root = make_project(tmp_path)
    (root / "second").mkdir()
    (root / "second" / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match=r"several import packages \(second, simplepkg\)"):
        _load(root)
    (root / "second" / "__init__.py").unlink()
    (root / "simplepkg" / "__init__.py").unlink()
    with pytest.raises(ConfigError, match="found no import package"):
        _load(root)


def test_package_inferred_from_src_layout(tmp_path):
    root = make_project(tmp_path)
    (root / "src").mkdir()
    os.replace(root / "simplepkg", root / "src" / "simplepkg")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")  # not a candidate
    s = _load(root)
    assert (s.package, s.package_dir) == ("simplepkg", root / "src" / "simplepkg")


TWO = target_toml("a") + target_toml("b")


def test_override_precedence_env_over_config_over_pyproject(tmp_path):
    root = make_project(tmp_path, TWO)
    assert _load(root).selected == ("a", "b")
    assert _load(root, {"precompile.targets": "b"}).selected == ("b",)
    assert _load(root, {"precompile.targets": "b"}, {"PRECOMPILE_TARGETS": "a"}).selected == ("a",)
    assert _load(root, {"precompile.skip": "false"}, {"PRECOMPILE_SKIP": "1"}).skip
    assert not _load(root, {"precompile.skip": "true"}, {"PRECOMPILE_SKIP": "0"}).skip
    assert _load(root, {"precompile.skip": ["true", "true"]}).skip  # repeated, one value
    assert _load(root, {"precompile.torch-pin": "none"}).torch_pin == "none"
    assert _load(root, {"precompile.strict": "yes"}).strict
    assert _load(root, {"--build-option": "x"}).selected == ("a", "b")  # setuptools' key


def test_repeated_config_setting_list_key_is_a_union_scalar_key_is_refused(tmp_path):
    """`-C precompile.targets=a -C precompile.targets=b` reaches the backend as a list
    (pip and build): the union is selected, not the last one; a scalar key given two
    different values is refused rather than one of them silently winning."""
    root = make_project(tmp_path, TWO)
    assert _load(root, {"precompile.targets": ["b", "a"]}).selected == ("a", "b")
    assert _load(root, {"precompile.targets": ["a", "a,b"]}).selected == ("a", "b")
    assert _load(root, {"precompile.targets": ["b"]}).selected == ("b",)
    with pytest.raises(ConfigError, match="no target 'c'"):
        _load(root, {"precompile.targets": ["a", "c"]})
    with pytest.raises(
        ConfigError,
        match=r"`precompile.skip` was given 2 times \('false', "
        r"'true'\) but takes one value; pass it once",
    ):
        _load(root, {"precompile.skip": ["false", "true"]})
    with pytest.raises(ConfigError, match=r"`precompile.jobs` was given 2 times"):
        _load(root, {"precompile.jobs": ["2", "4"]})


@pytest.mark.parametrize(
    "cs, env, match",
    [
        (
            {"precompile.skipp": "1"},
            {},
            "unknown key `precompile.skipp`; did you mean `precompile.skip`",
        ),
        ({"precompile.targets": "c"}, {}, "no target 'c'"),
        (
            {},
            {"PRECOMPILE_TARGETS": "aa"},
            "environment variable PRECOMPILE_TARGETS: no target 'aa'.*did you mean 'a'",
        ),
        ({}, {"PRECOMPILE_TARGETS": " , "}, "selects no target"),
        ({}, {"PRECOMPILE_SKIP": "maybe"}, "PRECOMPILE_SKIP: 'maybe' is not a boolean"),
        ({"precompile.skip": "true", "precompile.targets": "a"}, {}, "conflicting config settings"),
        ({}, {"PRECOMPILE_SKIP": "1", "PRECOMPILE_TARGETS": "a"}, "conflicting environment"),
        (
            {"precompile.torch-pin": "major"},
            {},
            "config setting `precompile.torch-pin` must be one of",
        ),
    ],
)
def test_override_errors(tmp_path, cs, env, match):
    root = make_project(tmp_path, TWO)
    with pytest.raises(ConfigError, match=match):
        _load(root, cs, env)


def test_config_error_comes_before_any_capture(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    root = make_project(
        tmp_path,
        target_toml("a")
        + f'env = {{ FIXTURE_MARK = "{marker}" }}\n'
        + '[tool.precompile.targets.b]\nscript = "capture/pair.py"\nrequred = true\n',
    )
    with pytest.raises(ConfigError, match="did you mean `tool.precompile.targets.b.required`"):
        build(root, monkeypatch)
    assert not marker.exists()
    assert list((tmp_path / "dist").iterdir()) == []
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml").read_text().replace("requred", "required")
    )
    build(root, monkeypatch)  # the same project, fixed: the capture does run
    assert marker.exists()


_keys = st.sampled_from(
    [
        "package",
        "targets",
        "torch-pin",
        "script",
        "args",
        "device",
        "timeout",
        "env",
        "required",
        "a",
        "forward",
        "x-y",
        "",
    ]
)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["capture/pair.py", "cpu", "auto", "../x", "simplepkg"]),
)
_tree = st.recursive(
    _leaf,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_keys, c, max_size=4)),
    max_leaves=12,
)


@hsettings(max_examples=200, deadline=None)
@given(
    table=_tree,
    cs=st.dictionaries(
        st.sampled_from(["precompile.skip", "precompile.targets", "precompile.x", "other"]),
        st.one_of(st.text(max_size=5), st.lists(st.text(max_size=3), max_size=2)),
        max_size=3,
    ),
)
def test_fuzz_only_config_errors(tmp_path_factory, table, cs):
    root = tmp_path_factory.getbasetemp() / "fuzzproj"
    if not root.exists():
        root = make_project(tmp_path_factory.mktemp("fuzz")).rename(root)
    try:
        settings_from_table(root.resolve(), table, cs, {})
    except ConfigError:
        pass


def test_the_settings_reference_is_generated_from_the_field_table():
    """docs/settings.md is what config/reference.py writes from the one table of keys and
    overrides (and the settings' docstrings); settings.py reads the same table."""
    from precompile_build.config import fields, reference, settings

    docs = Path(__file__).resolve().parents[1] / "docs" / "settings.md"
    assert docs.read_text(encoding="utf-8") == reference.reference(), (
        "regenerate: python -m precompile_build.config.reference > docs/settings.md"
    )
    attrs = set(reference.field_docs(settings.TargetSettings))
    assert {k.attr for k in fields.TARGET_KEYS} <= attrs


def test_engine_device_and_tracer_names_are_spelled_once():
    """The Literal types of precompile_runtime/pair_format.py are the one spelling: the
    settings, the capture options, the manifest reader and the pair check use them."""
    from typing import get_args

    from precompile_build.builder import pairs
    from precompile_build.config import choices, settings
    from precompile_runtime import manifest, pair_format

    assert choices.ENGINES is pair_format.ENGINES and manifest.ENGINES is pair_format.ENGINES
    assert pairs.OUR_ENGINES == pair_format.SOURCE_ENGINES == ("frozen", "eager")
    assert set(pair_format.SOURCE_ENGINES) < set(pair_format.ENGINES)
    assert choices.TRACERS == ("auto", *pair_format.TRACERS)
    assert (
        set(settings.DEVICES)
        == set(get_args(choices.DeviceChoice))
        == {"auto", *pair_format.DEVICES}
    )
