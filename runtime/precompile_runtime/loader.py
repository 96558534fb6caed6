"""``load_packaged``: find, verify and load a packaged artifact pair.

Steps (``docs/internals.md``, "Runtime load"):

1. read ``<package>/_precompiled/manifest.json`` through ``importlib.resources``
   (works from a zip and from a read-only site-packages: the package is only read);
2. pick the first variant whose fingerprint matches this host
   (:func:`precompile_runtime.fingerprint.mismatches`);
3. verify size and sha256 of both files against the manifest, and the code_hash;
4. by engine: ``frozen``/``eager`` unpack the cache's blobs into the per-user cache
   directory and call the source's ``load(kernel_dir)``; ``torch`` hands the pair to
   :func:`precompile_runtime.torch_pairs.load_torch_pair`.

No variant matches: strict mode raises :class:`HostMismatchError`; otherwise one
:class:`HostMismatchWarning` and a fallback (``load(None)`` of the source, or
``load_torch_pair(..., fallback=True)``). Every file is verified before any of its
bytes run, also in the fallback.

Kernel cache directory: ``$PRECOMPILE_CACHE_DIR``, else
``$XDG_CACHE_HOME/precompile-runtime``, else ``~/.cache/precompile-runtime``, used
only when nobody but this user or root can change it; each process writes the
verified blobs into its own folder there, ``.run-XXXXXXXX/<code_hash>/`` (removed at
exit), and loads from it (precompile_runtime/kernel_cache.py, docs/security.md). When
that root cannot be written or is not trusted, the blobs go to a private temp
directory of this process (``tempfile.mkdtemp``, removed at exit).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from importlib import resources
from typing import Any, NamedTuple

from . import _bytecode, _installed, _stale
from . import arch_select as _arch_select
from . import envelope as _envelope
from . import fingerprint as _fingerprint
from . import manifest as _manifest
from . import pair_format as _pair_format
from ._env import env_flag
from ._guard import install_if_env
from ._pair_files import (
    DATA_DIR,
    exec_source,
    raise_if_changed,
    raise_if_package_gone,
    read_pair,
    shown_dir,
)
from .errors import (
    CacheDirNotExecutableError,
    HostMismatchError,
    HostMismatchWarning,
    IntegrityError,
    LoadOptionError,
    ManifestError,
    PackageChangedError,
    PrecompileLoadError,
    StaleArtifactError,
    StaleArtifactWarning,
    TargetNotFoundError,
)
from .kernel_cache import CACHE_ENV, cache_root
from .kernel_cache import unpack as _unpack

__all__ = ["load_packaged", "cache_root"]

STRICT_ENV = "PRECOMPILE_STRICT"
_NO_FALLBACK = " Strict mode (strict=True or PRECOMPILE_STRICT=1): no fallback."

# (package, name, manifest sha256) -> _Loaded ; one lock per key so distinct targets load
# in parallel; a package's manifest is one per process (_installed.py)
_loaded: dict[tuple[str, ...], _Loaded] = {}
_key_locks: dict[tuple[str, ...], threading.Lock] = {}
_global_lock = threading.Lock()


class _Loaded:
    __slots__ = ("value", "mismatch_text", "fallback", "refusal", "twins")

    def __init__(
        self,
        value: Any,
        mismatch_text: str | None,
        fallback: str,
        refusal: tuple[type[PrecompileLoadError], str] | None = None,
    ) -> None:
        self.value = value
        self.twins: dict[bool, Any] = {}  # cuda_graphs override -> artifact
        self.mismatch_text = mismatch_text  # set when this is a fallback for the host
        self.fallback = fallback  # what the fallback runs, for the warning
        # (error class, message) that strict mode raises instead of this fallback (a
        # host mismatch, a noexec cache directory, a stale editable install), or None
        self.refusal = refusal


# --------------------------------------------------------------------------- API


def _type_name(value: object) -> str:
    """``int``, ``numpy.bool`` (not plain ``bool``, which would read as the type asked for)."""
    t = type(value)
    return (
        t.__name__
        if t.__module__ == "builtins"
        else f"{t.__module__.split('.')[0]}.{t.__qualname__}"
    )


def load_packaged(
    name: str,
    *,
    package: str | None = None,
    strict: bool | None = None,
    cuda_graphs: bool | None = None,
) -> Any:
    """The compiled callable of target ``name`` packaged in ``package``.

    Args:
        name: the target name (``[tool.precompile.targets.NAME]``).
        package: the import package that carries ``_precompiled/``; default: the
            top-level package of the calling module (required when called from a
            ``__main__`` script that is not part of a package).
        strict: True: a host that matches no variant raises instead of falling back.
            None (default): strict when the environment variable ``PRECOMPILE_STRICT``
            is on (``1``, ``true``, ``yes``, ``on``, any case). A bool or None only.
        cuda_graphs: True/False: replay CUDA graphs of the frozen kernels, or not
            (frozen CUDA inference targets; docs/cuda-graphs.md says when graphs pay).
            None (default): as the target's ``cuda-graphs`` option recorded. Ignored
            by fallbacks and by pairs of the ``torch`` engine. A bool or None only.
    Returns:
        the callable returned by the pair's ``load(kernel_dir)`` (it has the captured
        ``fn``'s calling convention). The same object for every call in this process
        with the same (package, name, cuda_graphs); the first call loads, concurrent
        callers wait. It pickles as that reference, not its kernels: unpickled in a
        worker process (multiprocessing, a DataLoader worker), it is the target
        loaded there (frozen and eager pairs).
    Raises:
        TargetNotFoundError: the package cannot be imported, has no ``_precompiled/``
            data, has no such target, or the target's capture failed at build time.
        ManifestError: the manifest is unreadable, of a newer format version, or
            names a file outside ``_precompiled/``.
        IntegrityError: a file is missing or differs from the manifest (size,
            sha256), the cache does not belong to the source (code_hash), or the
            cache envelope is corrupt. Nothing from the pair ran.
        PackageChangedError: (an IntegrityError) the files changed while they were
            read (a concurrent reinstall): retry; or the package's manifest differs from
            the one this process first loaded from (an upgrade or reinstall in place,
            another install imported): the callables loaded before keep serving the
            old version, and no load serves the new one in this process (one process,
            one version): restart it.
        HostMismatchError: strict mode and no variant matches this host;
            CacheDirNotExecutableError (one of them): strict mode and the kernel
            cache directory cannot map code (noexec).
        StaleArtifactError: an editable install's source changed since its capture
            and either strict mode is on (also when a non-strict load of this process
            already served the current code) or the captured function has no
            importable name to call instead (a lambda, a function of the capture
            script, a torch-engine pair): never the old code's result.
        LoadOptionError: (a ValueError) ``strict`` or ``cuda_graphs`` is not None,
            True or False (``"false"``, ``1`` and other non-bools are refused), or
            ``cuda_graphs=True`` for a target that cannot replay CUDA graphs (one
            captured on the CPU, or one that runs a backward).
        LoadOptionError: also when ``strict`` is None and ``PRECOMPILE_STRICT``, or
            ``PRECOMPILE_NO_COMPILE``, is set to a value that is not a boolean (on:
            1/true/yes/on; off: 0/false/no/off/empty); the message names the variable.
        PrecompileLoadError: anything else the load could not do (e.g. no place to
            unpack kernels), with the package and target in the message.
    Warns:
        HostMismatchWarning: once per (package, name) when no variant matches and a
            fallback is used; StaleArtifactWarning: an editable install's source
            changed: the returned callable is the captured function's current code
            (imported by the module and qualname the capture recorded), run eagerly.
    """
    for option, value in (("strict", strict), ("cuda_graphs", cuda_graphs)):
        if value is not None and not isinstance(value, bool):  # "false" and 1 are not bools
            raise LoadOptionError(
                f"load_packaged({name!r}, {option}={value!r}): use None, True or False "
                f"({option} takes a bool; this is {_type_name(value)})"
            )
    if package is None:
        package = _caller_package(sys._getframe(1))
    if strict is None:
        strict = env_flag(STRICT_ENV)
    install_if_env()
    installed = _installed.current(_package_data(package) / "manifest.json")
    if installed is not None:  # (else _load says why it cannot be read)
        _installed.check(package, installed)
    key = (package, name, installed[1] if installed is not None else "")
    done = _loaded.get(key)
    if done is None:
        with _global_lock:
            lock = _key_locks.setdefault(key, threading.Lock())
        with lock:
            done = _loaded.get(key)
            if done is None:  # (a strict load that would fall back raises here)
                done = _load(package, name, strict, installed)
                if installed is not None:  # the version this process serves from now on
                    _installed.check(package, installed, record=True)
                _loaded[key] = done
                if done.mismatch_text is not None:
                    warnings.warn(
                        done.mismatch_text
                        + " Using the slower fallback: "
                        + done.fallback
                        + ". Pass strict=True or set PRECOMPILE_STRICT=1 to make this an error.",
                        HostMismatchWarning,
                        stacklevel=2,
                    )
    if strict and done.refusal is not None:  # a fallback cached by a non-strict load
        error, message = done.refusal
        raise error(message)
    _check_cuda_graphs(package, name, done.value, cuda_graphs)
    value = _with_graphs(done, cuda_graphs)
    if hasattr(value, "with_cuda_graphs") and "__reduce_ex__" not in vars(
        value
    ):  # frozen and eager pairs
        value.__reduce_ex__ = lambda protocol: (_unpickled, (package, name, cuda_graphs))
    return value


def _unpickled(package: str, name: str, cuda_graphs: bool | None) -> Any:
    """A loaded function where it is unpickled (a multiprocessing or DataLoader worker):
    pickled as the reference ``(package, name, cuda_graphs)``, never its kernels, it is
    the same target loaded there with :func:`load_packaged` (once per process).

    Args:
        package, name, cuda_graphs: as the load that returned it was called.
    Returns:
        ``load_packaged(name, package=package, cuda_graphs=cuda_graphs)`` in this process.
    Raises:
        whatever that load raises here (the package not installed in the worker's
        environment: TargetNotFoundError).
    """
    return load_packaged(name, package=package, cuda_graphs=cuda_graphs)


def _check_cuda_graphs(package: str, name: str, value: Any, cuda_graphs: bool | None) -> None:
    """Raise :class:`LoadOptionError` for ``cuda_graphs=True`` on a target that can
    never replay CUDA graphs (its pair's metadata: captured on the CPU, or runs a
    backward), whichever variant this host loaded; pairs of the ``torch`` engine
    ignore the option."""
    meta = getattr(value, "metadata", None)
    if not cuda_graphs or not hasattr(value, "with_cuda_graphs") or not isinstance(meta, dict):
        return
    if meta.get("device") != "cuda":
        why, fix = f"was captured on {meta.get('device')}", "; or capture it on a CUDA device"
    elif meta.get("grad_param_indices"):
        why, fix = "runs a backward (a training step)", ""
    else:
        return
    raise LoadOptionError(
        f"CUDA graphs replay the frozen kernels of CUDA inference targets, and this target {why}. "
        f"Drop cuda_graphs=True (pass None or False){fix}",
        context=f"package {package!r}, target {name!r}",
        where="load_packaged(..., cuda_graphs=True)",
    )


def _with_graphs(done: _Loaded, cuda_graphs: bool | None) -> Any:
    """``done.value``, or its CUDA-graph twin (made once, kept on ``done``)."""
    value = done.value
    if (
        cuda_graphs is None
        or not getattr(value, "uses_kernels", False)
        or not hasattr(value, "with_cuda_graphs")
        or value.cuda_graphs == cuda_graphs
    ):
        return value
    with _global_lock:
        twin = done.twins.get(cuda_graphs)
        if twin is None:
            twin = done.twins[cuda_graphs] = value.with_cuda_graphs(cuda_graphs)
    return twin


# ---------------------------------------------------------------------- internals


def _caller_package(frame: Any) -> str:
    g = frame.f_globals
    pkg = g.get("__package__") or ""
    mod = g.get("__name__") or ""
    if not pkg and mod and mod != "__main__":
        pkg = mod
    if not pkg:
        raise PrecompileLoadError(
            "load_packaged() was called from a script that is not part of a package "
            f"(__name__ == {mod!r}); pass package='your_package'"
        )
    return pkg.split(".")[0]


def _load(
    package: str, name: str, strict: bool, installed: tuple[str, str] | None = None
) -> _Loaded:
    """Steps 1-4 of the module docstring for target ``name`` of ``package``."""
    ctx = f"package {package!r}, target {name!r}"
    data = _package_data(package)
    raw, doc = _read_manifest(package, data, ctx, installed)
    variants = _variants(doc, name, ctx)
    hosts: dict[str, dict[str, Any]] = {}
    chosen, reports = _select(variants, hosts)
    text, stale, refusal = _refusal(ctx, doc, variants, chosen, reports)
    if strict and refusal is not None:
        raise refusal[0](refusal[1])
    # PTX only: a compile at load (checked for the kernels that will serve: not a stale pair's)
    if refusal is None and chosen is not None and chosen.get("device") == "cuda":
        _arch_select.check_jit_at_load(ctx, chosen, hosts["cuda"].get("compute_capability"), strict)
    variant = chosen if chosen is not None else variants[0]
    try:
        source, cache, code_hash = read_pair(data, ctx, variant)
    except IntegrityError as e:  # files replaced by a reinstall after the manifest was read?
        raise_if_changed(ctx, data, raw, e, again=lambda: read_pair(data, ctx, variant))
        raise
    if stale is not None:  # the pair is the old code's: the current code or nothing
        current, note = _stale.current_code(stale, cache)
        warnings.warn(note, StaleArtifactWarning, stacklevel=3)
        return _Loaded(current, None, "", refusal)
    if variant["engine"] == "torch":
        from . import torch_pairs  # lazy: imports torch

        value = torch_pairs.load_torch_pair(source, cache, fallback=refusal is not None, where=ctx)
        return _Loaded(
            value, text, "torch's own load of the source without the compiled cache", refusal
        )
    pair = _Pair(package, name, ctx, data, raw, variant, source, cache, code_hash)
    return _load_source(pair, strict, text, refusal)


def _read_manifest(
    package: str, data: Any, ctx: str, installed: tuple[str, str] | None
) -> tuple[bytes, dict[str, Any]]:
    """Step 1: the manifest's bytes and its parsed document, checked to be the one
    :func:`load_packaged` saw (``installed``) and this process serves."""
    manifest_file = data / "manifest.json"
    try:
        raw: bytes = manifest_file.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise_if_package_gone(package)
        raise TargetNotFoundError(
            f"package {package!r} has no {DATA_DIR}/manifest.json in {shown_dir(package, data)} "
            "(is this the installed package? a source checkout on sys.path shadows it): it "
            "was built without precompiled targets (or with the captures skipped)",
            advice="rebuild the wheel with the precompile-build backend",
        ) from None
    except OSError as e:
        raise ManifestError(
            f"cannot read {DATA_DIR}/manifest.json ({e})", context=f"package {package!r}"
        ) from None
    read = _installed.of_bytes(manifest_file, raw)
    if installed is not None and read[1] != installed[1]:  # changed since load_packaged looked
        raise PackageChangedError(
            f"{ctx}: the installed files changed while they were being loaded (a pip install of the "
            "package running at the same time?); nothing from them ran. Retry once the installation "
            "has finished (in a new process if the package was upgraded). What was seen: "
            f"{DATA_DIR}/manifest.json changed between two reads"
        )
    _installed.check(package, read)
    try:
        doc = _manifest.parse(
            raw, where=f"{DATA_DIR}/manifest.json", context=f"package {package!r}"
        )
    except ManifestError as e:  # a manifest half-written by a reinstall?
        raise_if_changed(f"package {package!r}", data, raw, e)
        raise
    return raw, doc


def _variants(doc: dict[str, Any], name: str, ctx: str) -> list[dict[str, Any]]:
    """The variants of target ``name`` (step 2's candidates); raises
    TargetNotFoundError where the manifest has none to offer."""
    targets = doc["targets"]
    target = targets.get(name)
    if target is None:
        ok = sorted(t for t, v in targets.items() if v.get("status", "ok") == "ok")
        failed = sorted(t for t, v in targets.items() if v.get("status", "ok") != "ok")
        has = f"the package has {', '.join(map(repr, ok)) or 'no targets'}"
        if failed:
            has += f" (failed at build time: {', '.join(map(repr, failed))})"
        raise TargetNotFoundError("no such target", context=ctx, advice=has)
    if target.get("status", "ok") != "ok":
        raise TargetNotFoundError(
            "its capture failed at build time and it was left out of the wheel "
            f"(reason: {target.get('reason') or 'not recorded'})",
            context=ctx,
            advice="fix the capture script and rebuild",
        )
    variants = target.get("variants") or []
    if not variants:
        raise TargetNotFoundError(
            "the manifest lists no variants of it", context=ctx, advice="rebuild the wheel"
        )
    return variants


def _refusal(
    ctx: str,
    doc: dict[str, Any],
    variants: list[dict[str, Any]],
    chosen: dict[str, Any] | None,
    reports: list[list[str]],
) -> tuple[str | None, str | None, tuple[type[PrecompileLoadError], str] | None]:
    """``(mismatch text, stale text, refusal)``: why the chosen variant cannot serve as
    built (no variant matches this host, or an editable install's source changed), and
    the error strict mode raises instead of the fallback; all None when it can."""
    text = stale = None
    refusal: tuple[type[PrecompileLoadError], str] | None = (
        None  # what strict mode raises instead of a fallback
    )
    if chosen is None:
        text = _mismatch_text(ctx, variants, reports)
        refusal = (HostMismatchError, text + _NO_FALLBACK)
    else:
        stale = _stale.stale_text(ctx, doc)
        if stale is not None:
            refusal = (StaleArtifactError, f"{stale}. {_stale.REINSTALL}{_NO_FALLBACK}")
    return text, stale, refusal


class _Pair(NamedTuple):
    """A verified pair of a ``frozen`` or ``eager`` variant, with where it came from."""

    package: str
    name: str
    ctx: str
    data: Any
    raw: bytes
    """The manifest's bytes this load read."""
    variant: dict[str, Any]
    source: bytes
    cache: bytes
    code_hash: str


def _load_source(
    pair: _Pair,
    strict: bool,
    text: str | None,
    refusal: tuple[type[PrecompileLoadError], str] | None,
) -> _Loaded:
    """Step 4 for the ``frozen`` and ``eager`` engines: the cache's envelope checked
    against the source, the kernels unpacked (frozen, not a fallback), the source half
    run and its ``load(kernel_dir)`` called."""
    package, name, ctx, data, _, variant, source, _, code_hash = pair
    env = _checked_envelope(pair)
    kernel_dir = None
    if refusal is None and variant["engine"] == "frozen":
        kernel_dir = _unpack(ctx, code_hash, env)
    rel = variant["files"]["source"]["path"]
    where = f"{ctx}: {DATA_DIR}/{rel}"
    module = exec_source(
        package,
        name,
        rel,
        source,
        data / rel,
        lambda meta: _pair_format.check_version(meta, where=where),
        _bytecode.shipped_bytes(data, variant, ctx),
    )
    _pair_format.check_version(getattr(module, "PRECOMPILE_METADATA", None), where=where)
    load = getattr(module, "load", None)
    if not callable(load):
        raise PrecompileLoadError(
            "the source half defines no load(kernel_dir) function",
            context=ctx,
            where=f"{DATA_DIR}/{rel}",
        )
    runs_instead = "the captured graph from the source file, without precompiled kernels"
    try:
        value = load(kernel_dir)
    except ImportError as e:  # dlopen refused the kernels: a noexec file system
        if kernel_dir is None or not _cannot_map(kernel_dir, e):
            raise
        text = _noexec_text(ctx, kernel_dir, e)
        if strict:
            raise CacheDirNotExecutableError(text + _NO_FALLBACK) from None
        return _Loaded(
            load(None), text, runs_instead, (CacheDirNotExecutableError, text + _NO_FALLBACK)
        )
    return _Loaded(value, text, runs_instead, refusal)


def _checked_envelope(pair: _Pair) -> _envelope.Envelope:
    """The cache half's envelope, checked to belong to the source half (code_hash) and
    to the manifest's engine; a failure that a concurrent reinstall explains raises
    PackageChangedError."""
    ctx, data, raw, variant, cache, code_hash = (
        pair.ctx,
        pair.data,
        pair.raw,
        pair.variant,
        pair.cache,
        pair.code_hash,
    )
    engine = variant["engine"]
    cache_name = f"{DATA_DIR}/{variant['files']['cache']['path']}"
    try:
        # read_pair verified the whole file's sha256 against the manifest: header
        # and blobs, these very bytes; the blobs' own sha256s are not hashed again
        env = _envelope.loads(cache, what=cache_name, context=ctx, check_blobs=False)
        if env.code_hash != code_hash:
            raise IntegrityError(
                f"code_hash check failed: the cache belongs to a source with sha256 {env.code_hash}, "
                f"but {DATA_DIR}/{variant['files']['source']['path']} has {code_hash}",
                advice="the pair was mixed up or tampered with, rebuild the wheel",
                context=ctx,
                where=cache_name,
            )
    except IntegrityError as e:
        raise_if_changed(ctx, data, raw, e)
        raise
    if env.engine != engine:
        raise IntegrityError(
            f"engine check failed: the cache says {env.engine!r}, the manifest says {engine!r}",
            context=ctx,
            where=cache_name,
        )
    return env


def _cannot_map(kernel_dir: str, e: ImportError) -> bool:
    """Whether ``e`` is the dynamic loader refusing to map code from ``kernel_dir``."""
    if "failed to map segment" in str(e):
        return True
    try:
        return bool(os.statvfs(kernel_dir).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False


def _noexec_text(ctx: str, kernel_dir: str, e: ImportError) -> str:
    return (
        f"{ctx}: the precompiled kernels unpacked in {kernel_dir} cannot be loaded: its file "
        f"system does not allow mapping code (mounted noexec?): {type(e).__name__}: {e}. "
        f"Set {CACHE_ENV} to a directory on a file system mounted with exec (e.g. under "
        "your home directory) to use them."
    )


def _package_data(package: str) -> Any:
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise TargetNotFoundError(
            f"package {package!r} cannot be imported ({e}); is it installed?"
        ) from None
    except TypeError as e:  # a plain module, not a package
        raise TargetNotFoundError(f"{package!r} is not a package ({e})") from None
    return root / DATA_DIR


def _select(
    variants: list[dict[str, Any]],
    hosts: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any] | None, list[list[str]]]:
    """(the variant this host serves, or None; each other variant's mismatches). The
    host fingerprints it reads, per device type, are left in ``hosts``."""
    hosts = {} if hosts is None else hosts
    reports, matches = [], []
    # A CUDA variant that matches wins over a CPU one: a GPU host serves on its GPU
    # (hide the GPU with CUDA_VISIBLE_DEVICES="" to get the CPU variant).
    for v in sorted(variants, key=lambda v: (v.get("device") or "cpu") != "cuda"):
        device = v.get("device") or v["fingerprint"].get("device_type") or "cpu"
        if device not in hosts:
            try:
                hosts[device] = _fingerprint.host_fingerprint(device)
            except ImportError as e:
                raise PrecompileLoadError(
                    f"cannot check this host against the packaged variants: torch does not "
                    f"import ({e}); install the torch the package was built for"
                ) from None
        problems = _fingerprint.mismatches(v["fingerprint"], hosts[device])
        if not problems:
            matches.append(v)
        else:
            reports.append(problems)
    if matches:  # several: the one tuned on this GPU, then the best binary (arch_select)
        cc = hosts["cuda"].get("compute_capability") if "cuda" in hosts else None
        return _arch_select.best_variant(matches, cc), reports
    return None, reports


def _mismatch_text(ctx: str, variants: list[dict[str, Any]], reports: list[list[str]]) -> str:
    lines = [f"{ctx}: no variant matches this host, so its precompiled kernels are not used."]
    for i, (v, problems) in enumerate(zip(variants, reports)):
        head = f"variant {i} (id {v.get('id', '?')}, engine {v['engine']}, device {v.get('device', '?')})"
        lines.append(f"  {head}: " + "; ".join(problems))
    lines.append(
        "  To use precompiled kernels here, build the wheel on a host like this one, or add "
        "such a variant with `python -m precompile_build merge`."
    )
    return "\n".join(lines)
