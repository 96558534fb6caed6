"""Loading ``torch`` engine pairs with torch's own ``torch.compiler.precompile.load``.

A torch pair is what torch wrote: the source half is its ``python_code`` (UTF-8), the
cache half its envelope (a ``torch.save`` zip of ``{"format":
"torch.compiler.precompile", "version", "backend", "code_hash", "artifact", ...}``).

Both API generations are served, detected by feature: where
``torch.compiler.precompile.capture`` exists, ``load(artifact_path, cache_path)`` takes
two files (the pair is written to a private temp directory for the call and removed
after); otherwise ``load(python_code, cache)`` takes the contents (torch 2.14).

Before torch sees anything we verify the pair ourselves: torch's ``load`` treats an
unreadable envelope as "no cache" and silently JIT-compiles, which would hide a
corrupt file; here a corrupt envelope or a code_hash mismatch is an
:class:`~precompile_runtime.errors.IntegrityError`.

The fallback (``fallback=True``: this host matches no variant's fingerprint) loads the
same python_code with torch's own ``load`` but with the compiled artifact removed from
the envelope, so nothing is primed from the foreign build: the python_code compiles its
kernels itself on this host (slower; needs a C++ compiler on CPU and triton on CUDA).
Only python_code of a make_fx capture is self-contained this way; a pair from another
tracer is loaded with its cache as it is, and torch decides. Limits of this fallback:
python_code calls torch internals of the torch it was captured with, so another torch
version may fail to load it (a :class:`PrecompileLoadError` here); and inductor CPU
kernel source bakes the capture host's vector width (AVX512: 16 floats), so on a CPU
without that ISA the recompiled kernels are not guaranteed correct. Where the mismatch
is the torch version or the CPU ISA, prefer eager model code or a variant built for
this host.

torch's cache (torch 2.14.1) does not contain the compiled CPU kernels, so even
``fallback=False`` compiles the kernels with g++ inside ``load`` unless
``TORCHINDUCTOR_CACHE_DIR`` is already warm (``bench/results/torch_engine_load_cpu.md``).

torch is imported inside the functions only: importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import zipfile
from typing import Any, Callable

from . import _safe_path
from .errors import CallError, IntegrityError, PrecompileLoadError, ServingCompileError

CACHE_FORMAT = "torch.compiler.precompile"
_ZIP_MAGIC = b"PK\x03\x04"


def read_envelope(cache: bytes) -> dict[str, Any]:
    """Parse torch's cache envelope without running anything in it: every zip
    member's CRC32 first (``torch.load`` alone accepts many flipped bytes), then
    ``torch.load(weights_only=True)``, the way torch's own ``load`` reads it.

    Returns:
        the envelope dict (``format``, int ``version``, str ``code_hash``, ...).
    Raises:
        ValueError: saying what is wrong. Imports torch.
    """
    if cache[:4] != _ZIP_MAGIC:
        raise ValueError("it is not a torch.compiler.precompile cache (no zip magic bytes)")
    try:
        with zipfile.ZipFile(io.BytesIO(cache)) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
        raise ValueError(f"it is a corrupt zip ({type(e).__name__}: {e})") from None
    if bad is not None:
        raise ValueError(f"its member {bad!r} fails its CRC32 check")
    import torch

    try:
        blob = torch.load(io.BytesIO(cache), weights_only=True)
    except Exception as e:
        raise ValueError(
            f"torch.load(weights_only=True) cannot read it ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != CACHE_FORMAT:
        raise ValueError(f"its format tag is not {CACHE_FORMAT!r}")
    if not isinstance(blob.get("version"), int) or not isinstance(blob.get("code_hash"), str):
        raise ValueError("its version or code_hash tag is missing")
    return blob


def _strip_artifact(blob: dict[str, Any]) -> bytes:
    """The same envelope with ``artifact=None``: torch's load then primes nothing."""
    import torch

    stripped = dict(blob)
    stripped["artifact"] = None
    buf = io.BytesIO()
    torch.save(stripped, buf)
    return buf.getvalue()


def _api(where: str) -> Any:
    import torch

    api = getattr(torch.compiler, "precompile", None)
    if api is None or not callable(getattr(api, "load", None)):
        raise PrecompileLoadError(
            f"this torch ({torch.__version__}) has no torch.compiler.precompile.load, "
            "but the target was built with the torch engine; install the torch version the "
            "wheel was built for (see its Requires-Dist), or rebuild the wheel here",
            context=where,
        )
    return api


def _private_paths(source: bytes, cache: bytes, where: str) -> tuple[str, str, str]:
    """(folder, artifact path, cache path): the verified bytes written into a private
    temp folder (mode 0o700) for torch's ``load(artifact_path, cache_path)``; the
    caller removes the folder. Raises PrecompileLoadError where the folder lies below
    one others can write, who could swap it (docs/security.md); OSError."""
    tmp = tempfile.mkdtemp(prefix="precompile-torch-load-")
    try:
        found = _safe_path.problem(tmp)
        if found is not None:
            raise PrecompileLoadError(
                f"cannot hand the verified pair to torch: the private temp directory {tmp} could "
                f"be changed by another user: {found[0]}",
                context=where,
                advice=f"set TMPDIR to a directory only you can write ({found[1]})",
            )
        artifact_path = os.path.join(tmp, "artifact.py")
        cache_path = os.path.join(tmp, "artifact.cache")
        with open(artifact_path, "wb") as f:
            f.write(source)
        with open(cache_path, "wb") as f:
            f.write(cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, artifact_path, cache_path


def load_torch_pair(
    source_bytes: bytes,
    cache_bytes: bytes,
    *,
    fallback: bool = False,
    where: str = "torch artifact pair",
) -> Callable[..., Any]:
    """Load a torch pair with torch's own ``torch.compiler.precompile.load``.

    Args:
        source_bytes: torch's python_code, as written (UTF-8).
        cache_bytes: torch's cache envelope, as written.
        fallback: False on a host that matches the pair's fingerprint: the compiled
            artifact primes torch's kernel caches and the python_code's kernels load from
            it. True on a host that does not: the artifact is left out and the
            python_code JIT-compiles its kernels here (make_fx pairs; see module doc).
        where: names the package, target and file in messages.
    Returns:
        the callable torch's ``load`` returns, wrapped: call it like the captured
        ``fn`` (positional arguments, model(s) passed again). A call outside the
        captured contract (dtype, device, shape outside the marked dynamic dims,
        layout with inductor) raises :class:`~precompile_runtime.errors.CallError`
        with torch's ``PrecompileError`` as its ``__cause__``.
    Raises:
        IntegrityError: the source is not UTF-8; the cache is not torch's envelope
            (corrupt zip, CRC failure, wrong tags) where it is needed (``fallback=False``);
            the cache's code_hash differs from sha256 of the source.
        ServingCompileError: the serving guard is on and torch's ``load`` tried to
            compile (torch 2.14's CPU pairs compile their C++ kernels at load).
        PrecompileLoadError: this torch has no precompile ``load``, or torch's ``load``
            raised (its error is chained as ``__cause__``).
    """
    try:
        python_code = source_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IntegrityError(
            f"the source is not UTF-8 ({e}); rebuild the wheel", context=where
        ) from None
    code_hash = hashlib.sha256(source_bytes).hexdigest()
    try:
        blob: dict[str, Any] | None = read_envelope(cache_bytes)
    except ValueError as e:
        if not fallback:
            raise IntegrityError(
                f"the cache does not validate: {e}; the wheel is corrupt, rebuild or reinstall it",
                context=where,
            ) from None
        blob = None  # the fallback does not need the cache; the source is verified
    if blob is not None and blob["code_hash"] != code_hash:
        raise IntegrityError(
            f"code_hash check failed: the cache belongs to a source with sha256 "
            f"{blob['code_hash']}, but the source has {code_hash}; the pair was mixed up or "
            "tampered with, rebuild the wheel",
            context=where,
        )
    api = _api(where)
    by_paths = callable(getattr(api, "capture", None))

    if fallback:
        tracer = (blob or {}).get("tracer", "make_fx")
        if blob is not None and tracer == "make_fx":
            cache_bytes = _strip_artifact(blob)
        elif blob is None:
            cache_bytes = _minimal_envelope(python_code, code_hash, where)
        # else: another tracer's artifact may need its cache to run at all; keep it.

    paths = _private_paths(source_bytes, cache_bytes, where) if by_paths else None
    try:
        if paths is not None:
            fn = api.load(paths[1], paths[2])
        else:
            fn = api.load(python_code, cache_bytes)
    except Exception as e:
        refused = _serving_compile_error(e)
        if refused is not None:
            import torch

            raise ServingCompileError(
                f"torch.compiler.precompile.load tried to compile while the serving "
                f"guard is on (PRECOMPILE_NO_COMPILE or no_compilation()): this torch's "
                f"({torch.__version__}) CPU pairs compile their C++ kernels at load (its cache "
                'does not hold them). Build this target with the frozen engine (engine="frozen", '
                'or engine="auto" for a CPU capture), which serves compiling nothing; or turn '
                f"the guard off. The guard said: {refused}",
                context=where,
            ) from e
        mode = (
            "without the compiled cache (host mismatch fallback)" if fallback else "with its cache"
        )
        hint = (
            "torch pairs need the torch build they were captured with; install it, or "
            "rebuild the wheel on this host"
            if fallback
            else "rebuild the wheel with the torch installed here"
        )
        raise PrecompileLoadError(
            f"torch.compiler.precompile.load failed {mode}: {type(e).__name__}: {e}; {hint}",
            context=where,
        ) from e
    finally:
        if paths is not None:
            shutil.rmtree(paths[0], ignore_errors=True)
    return _calls_checked(fn, getattr(api, "PrecompileError", None), where)


def _serving_compile_error(e: BaseException | None) -> ServingCompileError | None:
    """The guard's :class:`ServingCompileError` in ``e`` or its causes/contexts (torch
    may wrap what a compile step raised), or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ServingCompileError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _calls_checked(fn: Callable[..., Any], error: Any, where: str) -> Callable[..., Any]:
    """``fn`` raising :class:`~precompile_runtime.errors.CallError` (torch's
    ``PrecompileError`` as its ``__cause__``) for a call outside the captured contract,
    as pairs of the other engines do. ``fn`` itself where this torch has no such error."""
    if not (isinstance(error, type) and issubclass(error, BaseException)):
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except error as e:
            raise CallError(f"the call does not match the capture: {e}", context=where) from e

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


def _minimal_envelope(python_code: str, code_hash: str, where: str) -> bytes:
    """An envelope with no artifact for a python_code whose own cache this torch cannot
    read (fallback only): its tags come from the python_code's ``BACKEND``."""
    import ast

    import torch

    backend = None
    try:
        for node in ast.parse(python_code).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "BACKEND"
            ):
                backend = ast.literal_eval(node.value)
    except (SyntaxError, ValueError) as e:
        raise IntegrityError(
            f"the source is not valid Python ({e}); rebuild the wheel", context=where
        ) from None
    if not isinstance(backend, str):
        raise IntegrityError(
            "the source is not a torch.compiler.precompile artifact (no BACKEND)", context=where
        )
    buf = io.BytesIO()
    torch.save(
        {
            "format": CACHE_FORMAT,
            "version": 1,
            "backend": backend,
            "code_hash": code_hash,
            "artifact": None,
        },
        buf,
    )
    return buf.getvalue()
