"""Fake installed packages for the precompile_runtime.load_packaged tests
(test_runtime_loader.py, test_runtime_integrity.py).

Each package has a unique name in tmp_path: ``__init__.py`` plus ``_precompiled/``
written with ``envelope.dumps`` and ``manifest.dumps``. The fake source half appends a
line to a marker file when it is executed (so tests can count loads and prove that no
code of a tampered artifact ran) and its ``load(kernel_dir)`` returns a callable that
reads a blob unpacked into ``kernel_dir`` (or says ``"fallback"`` when ``kernel_dir``
is None).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from precompile_runtime import envelope, fingerprint, manifest

RUNTIME = str(Path(__file__).resolve().parents[1] / "runtime")
BLOB = b"\x7fELF pretend kernel \x00\x01\x02" * 10
HOST = fingerprint.host_fingerprint("cpu")

SOURCE_TEMPLATE = """\
PRECOMPILE_METADATA = {{
    "format": "precompile-build.source",
    "version": 1,
    "engine": {engine!r},
    "target": {target!r},
    "device": "cpu",
    "calling_convention": {{"args": [], "kwargs": []}},
}}
import os

with open({marker!r}, "a") as _f:
    _f.write("exec\\n")


def load(kernel_dir):
    if kernel_dir is None:
        return lambda: ("fallback", None)
    with open(os.path.join(kernel_dir, "sub", "k.bin"), "rb") as f:
        data = f.read()
    return lambda: ("kernels", data)
"""


class FakePkg:
    def __init__(self, root: Path, name: str, marker: Path) -> None:
        self.root = root  # directory on sys.path
        self.name = name
        self.marker = marker

    @property
    def dir(self) -> Path:
        return self.root / self.name

    @property
    def data(self) -> Path:
        return self.dir / "_precompiled"

    def manifest(self) -> dict:
        return json.loads((self.data / "manifest.json").read_text())

    def write_manifest(self, doc: dict) -> None:
        (self.data / "manifest.json").write_bytes(manifest.dumps(doc))

    def execs(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0


def make_source(pkg_marker: Path, target: str, engine: str = "frozen") -> bytes:
    return SOURCE_TEMPLATE.format(engine=engine, target=target, marker=str(pkg_marker)).encode()


def make_pair(
    source: bytes, engine: str = "frozen", blobs: dict | None = None, fp: dict | None = None
) -> bytes:
    if blobs is None:
        blobs = {"sub/k.bin": BLOB} if engine == "frozen" else {}
    env = envelope.Envelope(
        engine=engine, code_hash=envelope.sha256_hex(source), fingerprint=fp or HOST, blobs=blobs
    )
    return envelope.dumps(env)


def file_entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": envelope.sha256_hex(data)}


def make_package(
    tmp_path: Path,
    targets: dict | None = None,
    *,
    engine: str = "frozen",
    extra_files: dict | None = None,
) -> FakePkg:
    """``targets``: name -> list of fingerprint overrides, one per variant
    (default: one target ``fwd`` with one variant matching this host)."""
    name = f"pcbfake_{uuid.uuid4().hex[:10]}"
    root = tmp_path / f"site-{name}"
    pkg = FakePkg(root, name, tmp_path / f"{name}.marker")
    pkg.data.mkdir(parents=True)
    (pkg.dir / "__init__.py").write_text("")
    for rel, text in (extra_files or {}).items():
        (pkg.dir / rel).write_text(text)
    doc = {"format": manifest.FORMAT, "version": manifest.VERSION, "package": name, "targets": {}}
    for target, overrides in (targets or {"fwd": [{}]}).items():
        variants = []
        for i, over in enumerate(overrides):
            fp = dict(HOST, **over)
            source = make_source(pkg.marker, target, engine)
            cache = make_pair(source, engine, fp=fp)
            stem = target if len(overrides) == 1 else f"{target}-{i}"
            (pkg.data / f"{stem}.py").write_bytes(source)
            (pkg.data / f"{stem}.cache").write_bytes(cache)
            variants.append(
                {
                    "id": fingerprint.variant_id(fp),
                    "engine": engine,
                    "device": "cpu",
                    "fingerprint": fp,
                    "code_hash": envelope.sha256_hex(source),
                    "files": {
                        "source": file_entry(f"{stem}.py", source),
                        "cache": file_entry(f"{stem}.cache", cache),
                    },
                    "capture_seconds": 1.0,
                    "captured_at": "2026-11-29T16:00:00Z",
                }
            )
        doc["targets"][target] = {
            "required": True,
            "status": "ok",
            "reason": None,
            "variants": variants,
        }
    pkg.write_manifest(doc)
    return pkg


def on_path(monkeypatch, p: FakePkg) -> FakePkg:
    monkeypatch.syspath_prepend(str(p.root))
    return p
