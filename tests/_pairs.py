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
