"""Loading a captured pair in the test's own process: what ``load_packaged`` does
once its manifest, host and integrity checks have passed (unpack the cache's blobs,
execute the source, call its ``load``). Imported by the capture-level tests."""

from __future__ import annotations

from pathlib import Path


def load_pair(src, cache, kernel_dir=None):
    """The pair at ``src`` (source half) and ``cache`` (cache half), loaded here.

    Args:
        src, cache: the two files a capture wrote (str or Path).
        kernel_dir: where the cache's blobs are unpacked (default: ``<src stem>-kernels``
            beside ``src``, so several pairs can share a folder).
    Returns:
        the source's ``load(kernel_dir)`` result, a ``CompiledArtifact``; a pair with
        no blobs (eager engine) is loaded with ``load(None)``.
    Raises:
        IntegrityError: the cache is not a valid envelope.
    """
    from precompile_runtime.envelope import loads

    src, cache = Path(src), Path(cache)
    env = loads(cache.read_bytes())
    kdir = Path(kernel_dir) if kernel_dir else src.parent / f"{src.stem}-kernels"
    for name, blob in env.blobs.items():
        (kdir / name).parent.mkdir(parents=True, exist_ok=True)
        (kdir / name).write_bytes(blob)
    ns: dict = {"__name__": "pair"}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    return ns["load"](str(kdir) if env.blobs else None)


def pair_paths(tmp_path):
    """capture()'s ``artifact_path``/``cache_path`` keywords for a pair in ``tmp_path``."""
    return dict(artifact_path=Path(tmp_path) / "t.py", cache_path=Path(tmp_path) / "t.cache")


def load_pair_at(tmp_path):
    """The pair at pair_paths(tmp_path), loaded in this process with its frozen kernels."""
    return load_pair(Path(tmp_path) / "t.py", Path(tmp_path) / "t.cache")


def capture_and_load(tmp, fn, *args):
    """``fn(*args)`` captured with the frozen engine into the new folder ``tmp``
    (a Path), then loaded: the CompiledArtifact."""
    import precompile_build

    tmp.mkdir()
    with precompile_build.capture(fn, engine="frozen", **pair_paths(tmp)) as f:
        f(*args)
    return load_pair_at(tmp)


def marked(*shape, lo=1, hi=None, dims=(0,)):
    """A random tensor of ``shape``, its ``dims`` marked dynamic in [lo, hi]
    (torch._dynamo.mark_dynamic)."""
    import torch

    x = torch.randn(*shape)
    for d in dims:
        torch._dynamo.mark_dynamic(x, d, min=lo, max=hi)
    return x
