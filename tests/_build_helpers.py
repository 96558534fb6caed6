"""Shared helpers of the build-side tests: fixture projects, in-process builds,
wheel checks. Imported by test_build_*.py; their fixtures are in conftest.py."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import sys
import zipfile
from pathlib import Path

PACKAGES = Path(__file__).parent / "packages"
PYC = f".{sys.implementation.cache_tag}.pyc"  # a source half's shipped bytecode: NAME + PYC (wheels/bytecode.py)
MARK = "# --- precompile ---"


def make_project(tmp_path: Path, precompile_toml: str | None = None, name: str = "simple") -> Path:
    """Copy tests/packages/NAME to tmp_path/proj; replace its [tool.precompile]
    part (after the MARK line) with ``precompile_toml`` when given."""
    root = tmp_path / "proj"
    shutil.copytree(PACKAGES / name, root)
    if precompile_toml is not None:
        py = root / "pyproject.toml"
        head = py.read_text().split(MARK)[0]
        py.write_text(head + MARK + "\n" + precompile_toml)
    return root


def target_toml(
    name: str = "double", *, mode: str = "ok", extra: str = "", script: str = "capture/pair.py"
) -> str:
    """A [tool.precompile.targets.NAME] table running the fixture script in ``mode``."""
    return (
        f'[tool.precompile.targets.{name}]\nscript = "{script}"\n'
        f'args = ["--mode", "{mode}"]\ntimeout = 60\n{extra}\n'
    )


def build(
    root: Path,
    monkeypatch,
    out: Path | None = None,
    config_settings=None,
    hook: str = "build_wheel",
) -> Path:
    """Run a PEP 517 hook of precompile_build.backend in-process; return the file."""
    from precompile_build import backend

    out = out or root.parent / "dist"
    out.mkdir(exist_ok=True)
    monkeypatch.chdir(root)
    for name, mod in list(sys.modules.items()):  # distutils' mkpath cache outlives a
        if not name.endswith("distutils.dir_util"):  # build: a 2nd in-process one needs
            continue  # it empty
        cache = getattr(getattr(mod, "SkipRepeatAbsolutePaths", None), "instance", None)
        if isinstance(cache, set):
            cache.clear()
    name = getattr(backend, hook)(str(out), config_settings)
    return out / name


def wheel_names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return sorted(zf.namelist())


def read_member(path: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
        return zf.read(name)


def manifest_of(path: Path) -> dict:
    return json.loads(read_member(path, "_precompiled/manifest.json"))


def check_record(path: Path) -> None:
    """Every file is in RECORD with the right sha256 and size, and vice versa."""
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(zf.read(record).decode())))
        listed = {r[0]: r for r in rows}
        assert sorted(listed) == sorted(names)
        for n in names:
            if n == record:
                assert listed[n][1:] == ["", ""]
                continue
            data = zf.read(n)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert listed[n][1] == "sha256=" + digest.decode(), n
            assert int(listed[n][2]) == len(data), n
        assert names[-1] == record  # .dist-info last, RECORD at the very end


def as_another_host(whl: Path, out_dir: Path) -> Path:
    """A copy of ``whl`` as a build on a GPU host would have made it: each variant's
    fingerprint a CUDA device's (another variant id), RECORD rewritten; what ``merge``
    meets when wheels of two hosts are combined. Its pairs serve no host (the caches'
    own fingerprints stay this host's), so a loader here picks the original variant."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / whl.name
    with zipfile.ZipFile(whl) as zf:
        members = [(i, zf.read(i)) for i in zf.infolist()]
    record = next(i.filename for i, _ in members if i.filename.endswith(".dist-info/RECORD"))
    rows = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            if info.filename.endswith("_precompiled/manifest.json"):
                doc = json.loads(data)
                for target in doc["targets"].values():
                    for v in target["variants"]:
                        v["fingerprint"].update(
                            device_type="cuda", compute_capability="9.0", gpu_name="Fixture GPU"
                        )
                        v["id"] = hashlib.sha256(v["id"].encode()).hexdigest()[: len(v["id"])]
                data = json.dumps(doc, indent=1, sort_keys=True).encode()
            if info.filename == record:
                continue
            zf.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        zf.writestr(record, "\n".join(rows + [f"{record},,"]) + "\n")
    return out


def metadata_lines(path: Path, key: str) -> list[str]:
    text = read_member(path, ".dist-info/METADATA").decode()
    return [
        ln.split(":", 1)[1].strip()
        for ln in text.split("\n\n")[0].splitlines()
        if ln.startswith(key + ":")
    ]


def generic_tag() -> str:
    """``cpXY-cpXY-<platform>`` of this interpreter, e.g. ``cp311-cp311-linux_x86_64``:
    interpreter and ABI as ``platform_tags.wheel_tags`` takes them (the first of
    ``packaging.tags.sys_tags()``), the platform as ``platform_tags.decide_platform``
    falls back to (``sysconfig.get_platform()``, as setuptools' bdist_wheel)."""
    import sysconfig

    from packaging.tags import sys_tags

    first = next(iter(sys_tags()))
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{first.interpreter}-{first.abi}-{plat}"


def manylinux_tag() -> str:
    """What a fixture frozen wheel gets: the fixture's kernel is no readable ELF, so
    the tag is this host's glibc (platform_tags.decide_platform)."""
    import os

    interp_abi, plat = generic_tag().rsplit("-", 1)
    major, minor = os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2]
    return f"{interp_abi}-{plat.replace('linux', f'manylinux_{major}_{minor}')}"


def torch_only_path(dest: Path) -> Path:
    """A folder of links to torch and the modules importing it needs, wherever this
    environment installed each (a venv that sees its parent's site-packages keeps
    some there): PYTHONPATH for a fresh venv that must find torch and nothing else
    of this environment."""
    import importlib.util

    dest.mkdir(parents=True, exist_ok=True)
    for name in (
        "torch",
        "torchgen",
        "typing_extensions",
        "sympy",
        "mpmath",
        "filelock",
        "networkx",
        "jinja2",
        "markupsafe",
        "fsspec",
    ):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        where = Path(spec.origin)
        where = where.parent if spec.submodule_search_locations else where
        (dest / where.name).symlink_to(where)
    return dest


def dist_links(dest: Path, names: list[str]) -> Path:
    """A folder of links to the installed distributions ``names`` and everything they
    require (unconditional requirements, followed), each with its metadata folder:
    what an environment sees of them when ``dest`` is on its path."""
    from importlib import metadata

    from packaging.requirements import Requirement

    dest.mkdir(parents=True, exist_ok=True)
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name.lower().replace("_", "-") in seen:
            continue
        seen.add(name.lower().replace("_", "-"))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        site = Path(str(dist.locate_file("")))
        for top in sorted(
            {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        ):
            if (
                top not in ("bin", "__pycache__")
                and (site / top).exists()
                and not (dest / top).exists()
            ):
                (dest / top).symlink_to(site / top)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dest


def build_and_install(
    source: Path, tmp: Path, env_overrides: dict | None = None
) -> tuple[Path, Path, str]:
    """Copy the project at ``source`` into ``tmp``, build its wheel with a real frontend
    (``python -m build --no-isolation``, this repository's backend and runtime on the
    path, empty Inductor and capture caches; ``PRECOMPILE_ENGINE/TRACER/TARGETS``
    unset unless ``env_overrides`` sets them) and install it with ``pip --target``.
    Returns ``(wheel, site folder, the build's stderr)``; fails the test when the
    build fails, showing its output."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    project = tmp / source.name
    shutil.copytree(
        source,
        project,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "_precompiled", "__pycache__"),
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER", "PRECOMPILE_TARGETS")
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(repo), str(repo / "runtime")]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor-build"),
        PRECOMPILE_BUILD_CACHE_DIR=str(tmp / "capture-cache"),
        **(env_overrides or {}),
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--wheel",
            "--outdir",
            str(tmp / "dist"),
            str(project),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-6000:]
    wheel = next((tmp / "dist").glob("*.whl"))
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return wheel, site, build.stderr
