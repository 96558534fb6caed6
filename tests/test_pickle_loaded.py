"""A loaded function pickles as a reference to its package and target:
a multiprocessing or DataLoader argument is loaded again in the worker, where it was
`AttributeError: Can't pickle local object '_make_call.<locals>.Runner'`."""

from __future__ import annotations

import multiprocessing
import pickle
import uuid

import pytest
from _fake_packages import file_entry
from _pairs import pair_paths

from precompile_runtime import envelope, fingerprint, load_packaged, manifest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("runtime_env")


def scale(m, x):
    return m(x) * 2


def _installed(tmp_path, monkeypatch):
    """An installed package whose target `scale` is a real (eager engine) pair."""
    import precompile_build

    tmp = tmp_path / "pair"
    tmp.mkdir()
    m, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.no_grad(), precompile_build.capture(scale, engine="eager", **pair_paths(tmp)) as f:
        f(m, x)
    name = f"pcbpickle_{uuid.uuid4().hex[:8]}"
    data = tmp_path / "site" / name / "_precompiled"
    data.mkdir(parents=True)
    (data.parent / "__init__.py").write_text("")
    source, cache = (tmp / "t.py").read_bytes(), (tmp / "t.cache").read_bytes()
    (data / "scale.py").write_bytes(source)
    (data / "scale.cache").write_bytes(cache)
    fp = envelope.loads(cache).fingerprint
    variant = {
        "id": fingerprint.variant_id(fp),
        "engine": "eager",
        "device": "cpu",
        "fingerprint": fp,
        "code_hash": envelope.sha256_hex(source),
        "captured_at": "2026-12-05T12:00:00Z",
        "files": {
            "source": file_entry("scale.py", source),
            "cache": file_entry("scale.cache", cache),
        },
    }
    doc = {
        "format": manifest.FORMAT,
        "version": manifest.VERSION,
        "package": name,
        "targets": {
            "scale": {"required": True, "status": "ok", "reason": None, "variants": [variant]}
        },
    }
    (data / "manifest.json").write_bytes(manifest.dumps(doc))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return name, m, x


def _call(fn, m, x):
    with torch.no_grad():
        return fn(m, x)


def test_a_loaded_function_pickles_as_its_package_and_target(tmp_path, monkeypatch):
    name, m, x = _installed(tmp_path, monkeypatch)
    fn = load_packaged("scale", package=name)
    data = pickle.dumps(fn)
    assert len(data) < 500 and name.encode() in data  # a reference, no kernels, no graph
    assert pickle.loads(data) is fn  # in this process: the one loaded function
    import copy

    assert copy.deepcopy(fn) is fn
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a worker: loaded there
        got = pool.apply(_call, (fn, m, x))
    torch.testing.assert_close(got, scale(m, x).detach())
