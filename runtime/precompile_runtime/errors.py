"""Error types of the runtime. Every error a load can raise derives from
:class:`PrecompileLoadError`, so ``except PrecompileLoadError`` catches them all."""

from __future__ import annotations

from typing import Any


class PrecompileLoadError(RuntimeError):
    """Loading a packaged artifact failed; the message names the package, the target
    and what to change.

    Args:
        finding: what was found (or the whole message, given alone).
        context: the package and target (``package 'pkg', target 'fwd'``), or None.
        where: the file or part checked (``_precompiled/fwd.py``), or None.
        advice: what to do, or None.
    The message is ``context: where: finding; advice`` (the parts given); code that
    catches one reads the fields, never the text.
    """

    def __init__(
        self,
        finding: str = "",
        *,
        context: str | None = None,
        where: str | None = None,
        advice: str | None = None,
    ) -> None:
        self.finding, self.context, self.where, self.advice = finding, context, where, advice
        super().__init__(
            ": ".join(p for p in (context, where, finding) if p) + (f"; {advice}" if advice else "")
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # pickle keeps the fields
        return _rebuild, (type(self), self.finding, self.context, self.where, self.advice)


def _rebuild(
    cls: type[PrecompileLoadError],
    finding: str,
    context: str | None,
    where: str | None,
    advice: str | None,
) -> PrecompileLoadError:
    return cls(finding, context=context, where=where, advice=advice)


class ManifestError(PrecompileLoadError):
    """``_precompiled/manifest.json`` is missing, unreadable, of an unknown format or
    version, or names a file outside ``_precompiled/``."""


class IntegrityError(PrecompileLoadError):
    """A file of an artifact pair differs from what the manifest or the pair records
    (size, sha256, code_hash, envelope structure). Nothing from that pair ran."""


class PairFormatError(PrecompileLoadError):
    """A source half is of a pair format version this precompile-runtime does not read
    (precompile_runtime.pair_format): upgrade precompile-runtime, or rebuild the wheel."""


class HostMismatchError(PrecompileLoadError):
    """No variant of a target matches this host (raised only in strict mode; otherwise
    a :class:`HostMismatchWarning` is emitted and a fallback runs)."""


class PackageChangedError(IntegrityError):
    """The installed files changed while they were being loaded (a ``pip install``
    of the package ran at the same time); nothing from them ran: retry the load. Also:
    the package's files changed since this process loaded a target from them (an
    upgrade in place, another install imported): one process serves one version, so
    restart it to serve the new one."""


class CacheDirNotExecutableError(HostMismatchError):
    """The kernel cache directory is on a file system that does not allow mapping
    code (mounted ``noexec``), so the frozen kernels cannot load there (raised only in
    strict mode; otherwise a :class:`HostMismatchWarning` and the fallback)."""


class TargetNotFoundError(PrecompileLoadError):
    """The package has no ``_precompiled/`` data, or its manifest has no such target,
    or the target's capture failed at build time and was left out."""


class LoadOptionError(PrecompileLoadError, ValueError):
    """An argument of ``load_packaged`` is invalid, or cannot apply to this target
    (``cuda_graphs=True`` for a target captured on the CPU or one that runs a
    backward); the message says what to pass instead."""


class CallError(PrecompileLoadError, ValueError):
    """A call to a loaded artifact does not match what was captured (dtype, device,
    shape, layout, model structure)."""


class ServingCompileError(PrecompileLoadError):
    """Something tried to compile while the serving guard (``PRECOMPILE_NO_COMPILE=1``
    or :func:`precompile_runtime.no_compilation`) was on."""


class CacheSecurityWarning(UserWarning):
    """The kernel cache directory (``PRECOMPILE_CACHE_DIR``), or an entry in it, could
    be changed by another user (owned by another uid, writable by group or others, a
    symlink, or below a folder such a user can write): it is not used, and the kernels
    are written from the wheel's verified bytes into a private folder instead. The
    message names the path and the fix (docs/security.md)."""


class HostMismatchWarning(UserWarning):
    """Emitted once per target when no variant matches this host and a slower
    fallback is used instead."""


class StaleArtifactError(PrecompileLoadError):
    """Editable install: the package source changed since the build that captured its
    pairs, and strict mode is on or the captured function cannot be imported by name
    to run its current code instead (``pip install -e`` again)."""


class StaleArtifactWarning(UserWarning):
    """Editable install: the package source changed since the capture; the pair is
    not used, the captured function's current code runs eagerly instead."""


class CudaGraphWarning(UserWarning):
    """A loaded function could not record a CUDA graph for some input sizes (the
    recording failed and was undone); those calls run the frozen kernels without a
    graph, with the same results. Emitted once per failed size."""


class PtxJitWarning(UserWarning):
    """A variant serves this GPU through PTX only: the driver compiles it at load
    (refused instead under strict mode and ``PRECOMPILE_NO_COMPILE=1``)."""
