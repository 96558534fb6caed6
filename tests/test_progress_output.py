"""The build's output as a maintainer reads it in a log file."""

from __future__ import annotations

import io
import time

import pytest
from _build_helpers import build, make_project

from precompile_build.builder import progress


def test_without_a_terminal_a_status_line_comes_less_and_less_often(tmp_path, monkeypatch):
    """A non-terminal log got `running N s` every 5 s (12 lines for a one-minute
    capture); now at 2 x INTERVAL, then each time the running time doubles."""
    monkeypatch.setattr(progress, "INTERVAL", 0.05)
    log = tmp_path / "t.log"
    log.write_text("compiling\n")
    out = io.StringIO()
    with progress.Progress(out, live=False) as p:
        p.started("t", "cpu", log)
        time.sleep(1.6)  # 32 intervals: 32 lines at a fixed interval
        p.finished("t")
    lines = [ln for ln in out.getvalue().splitlines() if "running" in ln]
    assert 1 <= len(lines) <= 6, lines  # due at 0.1, 0.2, 0.4, 0.8, 1.6 s
    assert all(
        ln.startswith("precompile: t on cpu: running ") and ln.endswith("| compiling")
        for ln in lines
    )


@pytest.mark.usefixtures("build_env")
def test_the_wheels_files_are_listed_once_then_what_the_build_added(tmp_path, monkeypatch, capfd):
    """main_job's log listed every `adding 'FILE'` twice: setuptools' wheel, then the
    rewritten one. Now setuptools' list, then one line of what the build added."""
    whl = build(make_project(tmp_path), monkeypatch)
    out, err = capfd.readouterr()
    assert (out + err).count("adding 'simplepkg/__init__.py'") <= 1
    assert "adding 'simplepkg/_precompiled/" not in out + err
    assert (
        f"precompile: wrote {whl.name}: the wheel setuptools.build_meta built, plus "
        "simplepkg/_precompiled/ (4 files), Requires-Dist precompile-runtime"
    ) in err


@pytest.mark.usefixtures("build_env")
def test_the_wrote_line_gives_the_requirements_as_the_metadata_has_them(
    tmp_path, monkeypatch, capfd
):
    """The line said `Requires-Dist precompile-runtime>=0.3, torch==X` where the library's
    own bare `precompile-runtime` was kept and its `torch>=1.13` merged with the pin."""
    from _build_helpers import metadata_lines

    root = make_project(tmp_path)
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            'requires-python = ">=3.9"\n',
            'requires-python = ">=3.9"\ndependencies = ["precompile-runtime", "torch>=1.13"]\n',
            1,
        )
    )
    whl = build(root, monkeypatch)
    err = capfd.readouterr().err
    written = metadata_lines(whl, "Requires-Dist")
    assert (
        written[0] == "precompile-runtime"
        and written[1].startswith("torch")
        and ">=1.13" in written[1]
    )
    assert f"(4 files), Requires-Dist {', '.join(written)}\n" in err, err[-1500:]


def test_the_summary_says_what_its_seconds_count():
    """The table's seconds (0.5) differed from the target line's (`in 0.3 s`) without
    saying why."""
    text = progress.summary([("double", "cpu", "captured", 0.5, 666, None)])
    assert text.splitlines()[-1] == (
        "precompile: seconds: each target's whole time in this build (its wait for a device slot, the "
        "capture cache and the pair's checks included); a target's `ok ... in N s` line gives its "
        "capture script's run alone"
    )


@pytest.mark.usefixtures("build_env")
def test_capture_targets_names_the_flag_not_a_config_setting(tmp_path, capsys):
    """`capture --targets flaged` said `Failed to read config setting `precompile.targets``."""
    from precompile_build.cli import main

    root = make_project(tmp_path)
    assert (
        main(
            ["capture", "--project", str(root), "--targets", "doubel", "--out", str(tmp_path / "o")]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "error: Failed to read --targets: no target 'doubel' in `tool.precompile.targets`; did you mean 'double'?"
    )
    assert (
        main(
            ["capture", "--project", str(root), "--targets", "double", "--out", str(tmp_path / "o")]
        )
        == 0
    )
    assert (tmp_path / "o" / "manifest.json").is_file()


@pytest.mark.usefixtures("build_env")
def test_a_config_error_reaches_the_frontend_with_one_frame_of_ours(tmp_path, monkeypatch):
    """A frontend prints a failed hook's whole traceback: a misspelt key printed 30
    lines of this package's frames before its message; now the hook's own frame."""
    import traceback

    from precompile_build.errors import ConfigError

    root = make_project(tmp_path, '[tool.precompile.targets.double]\nscirpt = "capture/pair.py"\n')
    with pytest.raises(
        ConfigError, match="did you mean `tool.precompile.targets.double.script`"
    ) as e:
        build(root, monkeypatch)
    ours = [
        f for f in traceback.extract_tb(e.value.__traceback__) if "precompile_build" in f.filename
    ]
    assert [(f.filename.rsplit("/", 1)[-1], f.name) for f in ours] == [("backend.py", "run")]
