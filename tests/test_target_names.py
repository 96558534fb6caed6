"""Target names are checked when the configuration is read: a name
that cannot name its files on every platform, or names a file Python gives a meaning,
is a ConfigError before any capture runs (was: every capture ran, then "path traversal
refused" for `tä`, "a capture bug: please report it" for 241 characters, and
`__init__` made `_precompiled/` an importable package)."""

from __future__ import annotations

import pytest
from _build_helpers import build, make_project, target_toml

from precompile_build.config import target_names
from precompile_build.config.settings import settings_from_table
from precompile_build.errors import ConfigError


def _settings(tmp_path, *names):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    return settings_from_table(
        tmp_path, {"package": "pkg", "targets": {n: {"script": "cap.py"} for n in names}}
    )


@pytest.mark.parametrize(
    "name, says",
    [
        (
            "tä",
            "must be ASCII (letters a-z and A-Z, digits, underscores): its files are named after it",
        ),
        ("ünïcode_ok_in_python", "must be ASCII"),
        ("a" * 241, f"is 241 characters long; use at most {target_names.MAX_LENGTH}"),
        (
            "__init__",
            "is a dunder name, which Python gives a meaning (`__init__.py` would make `_precompiled/` "
            "an importable package); use a plain name",
        ),
        ("__main__", "is a dunder name"),
        ("con", "is a Windows device name"),
        ("NUL", "is a Windows device name"),
        ("com1", "is a Windows device name"),
        (
            "my-target",
            "must be a Python identifier (letters, digits, underscores; not starting with a digit)",
        ),
        ("1st", "must be a Python identifier"),
        ("", "must be a Python identifier"),
    ],
)
def test_a_name_no_file_system_takes_is_refused_naming_the_rule(tmp_path, name, says):
    with pytest.raises(ConfigError) as e:
        _settings(tmp_path, "fine", name)
    assert str(e.value).startswith(
        f"Failed to validate `tool.precompile` in pyproject.toml: target name "
        f"{name!r} in `tool.precompile.targets.{name}` {says}"
    ), str(e.value)


def test_names_that_differ_only_in_case_are_refused(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"target names 'Forward' and 'forward' in `tool.precompile.targets` "
        r"differ only in case: their files would be one on a file system that ignores case",
    ):
        _settings(tmp_path, "Forward", "forward")


def test_valid_names(tmp_path):
    names = (
        "forward",
        "a" * target_names.MAX_LENGTH,
        "_private",
        "train_step2",
        "console",
        "con_1",
        "Com10",
    )
    assert list(_settings(tmp_path, *names).targets) == list(names)


def test_the_name_is_refused_before_any_capture_runs(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    root = make_project(
        tmp_path,
        target_toml("a")
        + f'env = {{ FIXTURE_MARK = "{marker}" }}\n'
        + '[tool.precompile.targets."tä"]\nscript = "capture/pair.py"\n',
    )
    with pytest.raises(ConfigError, match="target name 'tä' .* must be ASCII"):
        build(root, monkeypatch)
    assert not marker.exists()
    assert list((tmp_path / "dist").iterdir()) == []


def test_the_rule_is_in_the_settings_reference():
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert target_names.RULE in page
