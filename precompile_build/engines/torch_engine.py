"""The ``torch`` engine: artifact pairs made by ``torch.compiler.precompile`` itself.

The pair is exactly what torch writes: the source half is torch's ``python_code``
(UTF-8), the cache half torch's own envelope (a ``torch.save`` zip of a plain dict
``{"format": "torch.compiler.precompile", "version", "backend", "code_hash",
"artifact", ...}``, readable with ``weights_only=True``). Nothing of ours is added to
either file, so torch's ``load`` reads them unchanged.

Two API generations exist; which one is detected by feature, never by version string:

- *callable* (torch 2.14): ``torch.compiler.precompile(fn, *args, backend=...)`` returns
  ``(python_code, cache)``; ``torch.compiler.precompile.load(python_code, cache)``.
  Positional arguments only.
- *capture* (newer): ``torch.compiler.precompile.capture(fn, artifact_path=...,
  cache_path=..., tracer=..., backend=...)`` is a context manager; the call made inside
  the block is captured and the two files are written on clean exit;
  ``load(artifact_path, cache_path)`` reads them back.

Both need ``torch``; this module imports it only inside its functions.
"""

from __future__ import annotations

import ast
import hashlib
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Callable

from ..errors import CaptureError, torch_warnings_shown

CACHE_FORMAT = "torch.compiler.precompile"
"""The ``format`` tag torch writes into its cache envelope."""

API_CALLABLE = "callable"
API_CAPTURE = "capture"

_BACKENDS = ("inductor", "eager")
_ZIP_MAGIC = b"PK\x03\x04"
# Top-level literal assignments of torch's python_code that we read (never exec).
_SOURCE_KEYS = (
    "BACKEND",
    "TRACER",
    "SERVING_MODE",
    "USER_INPUT_DEVICES",
    "PARAM_DEVICES",
    "BUFFER_DEVICES",
)


# --------------------------------------------------------------------------- detection


def _precompile_api() -> Any:
    """``torch.compiler.precompile`` or None where this torch has none."""
    import torch.compiler

    return getattr(torch.compiler, "precompile", None)


def api_generation(api: Any | None = None) -> str | None:
    """Which precompile API the installed torch offers, by feature.

    Returns:
        ``"capture"`` when ``torch.compiler.precompile.capture`` exists (newer torch),
        ``"callable"`` when ``torch.compiler.precompile`` is itself callable and has a
        ``load`` (torch 2.14), None when torch has neither. Imports torch.
    """
    api = _precompile_api() if api is None else api
    if api is None:
        return None
    if callable(getattr(api, "capture", None)) and callable(getattr(api, "load", None)):
        return API_CAPTURE
    if callable(api) and callable(getattr(api, "load", None)):
        return API_CALLABLE
    return None


def available() -> bool:
    """True when the installed torch can produce torch pairs (either generation)."""
    try:
        return api_generation() is not None
    except ImportError:
        return False


# --------------------------------------------------------------------------- capture


def capture_pair(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    *,
    target: str,
    device: str | None,
    options: Mapping[str, Any] | None,
) -> tuple[bytes, bytes]:
    """Capture one call of ``fn`` with ``torch.compiler.precompile`` into a torch pair.

    Args:
        fn: the whole computation, e.g. ``lambda model, x: model(x)`` or a training step
            that calls ``loss.backward()``.
        args: the real example call's positional arguments. ``nn.Module`` arguments are
            passed as they are: torch lifts their parameters and buffers to inputs (no
            weights in the pair). Dims marked with
            ``torch._dynamo.decorators.mark_unbacked`` stay dynamic (inductor backend).
        kwargs: the example call's keyword arguments. The callable API (torch 2.14)
            takes positional arguments only, so a non-empty ``kwargs`` is refused there;
            the capture API receives them as they are.
        target: the target name, used in error messages.
        device: ``"cpu"``/``"cuda"`` the target is built for, or None/``"auto"``. When
            given, the pair's recorded input device type must agree with it.
        options: engine options: ``"backend"`` (``"inductor"`` default, or ``"eager"``;
            the capture API sets it from ``capture(backend=...)``, users do not pass it)
            and ``"tracer"`` (``"make_fx"`` default, ``"dynamo"`` where torch has it, or
            a tracer object of the capture API).
    Returns:
        ``(source_bytes, cache_bytes)``: torch's python_code as UTF-8 bytes and torch's
        cache envelope bytes, verified with :func:`inspect_torch_pair`.
    Raises:
        CaptureError: torch has no ``torch.compiler.precompile``; an unknown option;
            ``kwargs`` on the callable API; torch refused the capture (its
            ``PrecompileError``, ``NotImplementedError`` or any other exception, chained
            as ``__cause__``); the pair does not validate; the device disagrees.
    """
    options = dict(options or {})
    kwargs = dict(kwargs or {})
    what = f"Capture of target {target!r} with the torch engine (torch.compiler.precompile)"
    api = _precompile_api()
    generation = api_generation(api)
    if generation is None:
        import torch

        raise CaptureError(
            f"{what} failed: torch {torch.__version__} has no torch.compiler.precompile; "
            'use engine="frozen" (or engine="auto"), or build with a torch that has it'
        )
    backend = options.pop("backend", "inductor")
    tracer = options.pop("tracer", None)
    if options:
        raise CaptureError(
            f"{what} failed: unknown torch engine option(s) {sorted(options)}; "
            "it reads options={'tracer': ...} (torch's own tracer) and the backend given "
            "to precompile_build.capture(backend=...); the other options are the frozen "
            "engine's: pass engine='frozen'"
        )
    if backend not in _BACKENDS:
        raise CaptureError(
            f"{what} failed: backend={backend!r} is not one of {', '.join(map(repr, _BACKENDS))}"
        )

    if generation == API_CALLABLE:
        source, cache = _capture_callable(api, fn, args, kwargs, backend, tracer, what)
    else:
        source, cache = _capture_with_capture_api(
            api, fn, args, kwargs, backend, tracer, what, target
        )

    try:
        info = inspect_torch_pair(source, cache, what=f"the pair torch wrote for target {target!r}")
    except CaptureError as e:
        raise CaptureError(f"{what} failed: {e}") from e
    recorded = info["device"] if isinstance(info, dict) else info.device
    if device in ("cpu", "cuda") and recorded != device:
        raise CaptureError(
            f"{what} failed: the target's device is {device!r} but the example inputs and "
            f"model are on {recorded!r}; move them to {device!r} in the capture script "
            "(or set the target's `device` to match)"
        )
    return source, cache


def _explain(e: BaseException) -> str:
    """A short ``Type: message`` of a torch exception for our messages."""
    msg = str(e).strip() or "(no message)"
    if len(msg) > 2000:
        msg = msg[:2000] + " ..."
    return f"{type(e).__name__}: {msg}"


_FIX_HINT = (
    "Change the capture script as torch's message says (see Note [precompile programming "
    'model] in torch/_precompile.py), or build this target with engine="frozen"'
)


def _capture_callable(api, fn, args, kwargs, backend, tracer, what):
    if kwargs:
        raise CaptureError(
            f"{what} failed: this torch's torch.compiler.precompile takes positional "
            f"arguments only, but the call passed keyword argument(s) {sorted(kwargs)}; "
            "pass them positionally (e.g. `fn(model, x, mask)` instead of "
            "`fn(model, x, mask=mask)`), in the capture and when calling the loaded target"
        )
    kw: dict[str, Any] = {"backend": backend}
    if tracer is not None:
        if not isinstance(tracer, str):
            raise CaptureError(
                f"{what} failed: tracer={tracer!r}: this torch's torch.compiler.precompile "
                "takes a tracer name ('make_fx'), not a tracer object"
            )
        kw["tracer"] = tracer
    try:
        with torch_warnings_shown():
            python_code, cache = api(fn, *args, **kw)
    except NotImplementedError as e:
        raise CaptureError(
            f"{what} failed: this torch does not implement it: {_explain(e)}. "
            'Use tracer="make_fx" / backend="inductor", or engine="frozen"'
        ) from e
    except Exception as e:  # PrecompileError and whatever else capture/lowering raises
        raise CaptureError(f"{what} failed: torch refused it: {_explain(e)}. {_FIX_HINT}") from e
    if not isinstance(python_code, str) or not isinstance(cache, (bytes, bytearray)):
        raise CaptureError(
            f"{what} failed: torch.compiler.precompile returned "
            f"({type(python_code).__name__}, {type(cache).__name__}), expected (str, bytes)"
        )
    return python_code.encode("utf-8"), bytes(cache)


def _tracer_object(api, tracer, what):
    """Map a tracer name to the capture API's tracer object; objects pass through."""
    if tracer is None or not isinstance(tracer, str):
        return tracer
    names = {"make_fx": "MakeFxTracer", "dynamo": "DynamoTracer"}
    cls = getattr(api, names.get(tracer, ""), None)
    if cls is None:
        raise CaptureError(
            f"{what} failed: tracer={tracer!r} is not offered by this torch "
            f"(known: {', '.join(n for n, c in names.items() if getattr(api, c, None))})"
        )
    return cls()


def _capture_with_capture_api(api, fn, args, kwargs, backend, tracer, what, target):
    kw: dict[str, Any] = {"backend": backend}
    tracer_obj = _tracer_object(api, tracer, what)
    if tracer_obj is not None:
        kw["tracer"] = tracer_obj
    with tempfile.TemporaryDirectory(prefix="precompile-torch-") as tmp:
        artifact_path = os.path.join(tmp, f"{target}.py")
        cache_path = os.path.join(tmp, f"{target}.cache")
        try:
            with (
                torch_warnings_shown(),
                api.capture(fn, artifact_path=artifact_path, cache_path=cache_path, **kw) as cap,
            ):
                cap(*args, **kwargs)
        except NotImplementedError as e:
            raise CaptureError(
                f"{what} failed: this torch does not implement it: {_explain(e)}. "
                'Choose another tracer/backend, or engine="frozen"'
            ) from e
        except Exception as e:
            raise CaptureError(
                f"{what} failed: torch refused it: {_explain(e)}. {_FIX_HINT}"
            ) from e
        missing = [p for p in (artifact_path, cache_path) if not os.path.isfile(p)]
        if missing:
            raise CaptureError(
                f"{what} failed: torch.compiler.precompile.capture exited cleanly but did not "
                f"write {', '.join(os.path.basename(p) for p in missing)}"
            )
        with open(artifact_path, "rb") as f:
            source = f.read()
        with open(cache_path, "rb") as f:
            cache = f.read()
    return source, cache


# --------------------------------------------------------------------------- inspect


def is_torch_cache(cache_bytes: bytes) -> bool:
    """True when ``cache_bytes`` looks like torch's envelope (a ``torch.save`` zip), as
    opposed to our own envelope (``precompile_runtime.envelope``). Cheap: magic bytes."""
    return cache_bytes[:4] == _ZIP_MAGIC


def read_torch_envelope(cache_bytes: bytes) -> dict[str, Any]:
    """Parse torch's cache envelope (``precompile_runtime.torch_pairs.read_envelope``:
    zip CRCs, then ``torch.load(weights_only=True)``; nothing in it runs) and check
    the tags a pair needs before it enters a wheel.

    Returns:
        the envelope dict; it has a ``format`` of :data:`CACHE_FORMAT`, an int
        ``version``, a str ``backend`` and a 64-hex ``code_hash``.
    Raises:
        ValueError: not a zip, a CRC failure, unreadable by ``torch.load``, not a dict,
            or a missing/mistyped tag. Imports torch.
    """
    from precompile_runtime.torch_pairs import read_envelope

    blob = read_envelope(cache_bytes)
    if isinstance(blob["version"], bool):
        raise ValueError(f"the cache's version tag is {blob['version']!r}, not an integer")
    code_hash = blob["code_hash"]
    if len(code_hash) != 64:
        raise ValueError(f"the cache's code_hash is {code_hash!r}, not 64 hex characters")
    if not isinstance(blob.get("backend"), str):
        raise ValueError(f"the cache's backend tag is {blob.get('backend')!r}, not a string")
    return blob


def read_source_metadata(source_bytes: bytes) -> dict[str, Any]:
    """The calling-convention tags of torch's python_code, read with ``ast`` (never
    executed: exec would JIT the kernels).

    Returns:
        the values of those of ``BACKEND``, ``TRACER``, ``SERVING_MODE``,
        ``USER_INPUT_DEVICES``, ``PARAM_DEVICES``, ``BUFFER_DEVICES`` that are present.
    Raises:
        ValueError: not UTF-8, not valid Python, or no ``BACKEND`` (not a
            torch.compiler.precompile artifact).
    """
    try:
        text = source_bytes.decode("utf-8")
        tree = ast.parse(text)
    except (UnicodeDecodeError, SyntaxError, ValueError) as e:
        raise ValueError(
            f"the source is not valid UTF-8 Python ({type(e).__name__}: {e})"
        ) from None
    found: dict[str, Any] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in _SOURCE_KEYS
        ):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    if not isinstance(found.get("BACKEND"), str):
        raise ValueError(
            "the source has no BACKEND assignment: it is not a torch.compiler.precompile artifact"
        )
    return found


def _device_type(meta: Mapping[str, Any]) -> str:
    """``"cuda"`` when any recorded input/param/buffer device is CUDA, else ``"cpu"``."""
    for key in ("USER_INPUT_DEVICES", "PARAM_DEVICES", "BUFFER_DEVICES"):
        for dev in meta.get(key) or ():
            if isinstance(dev, str) and dev.split(":", 1)[0] == "cuda":
                return "cuda"
    return "cpu"


def _cpu_isa() -> str | None:
    """The vector ISA of this CPU as ATen dispatches it (``avx512``, ``avx2``...), or None.

    Inductor's CPU kernels in python_code bake the vector width of the capture host's
    ISA (e.g. ``Vectorized<float>::loadu(p, 16)`` for AVX512), so a CPU pair is bound to
    it. ``torch.backends.cpu.get_cpu_capability()`` needs no compiler probe (inductor's
    ``pick_vec_isa`` compiles test programs).
    """
    try:
        import torch.backends.cpu

        isa = str(torch.backends.cpu.get_cpu_capability()).strip().lower()
    except Exception:  # noqa: BLE001 - a torch without the query: no ISA recorded
        return None
    return None if isa in ("", "default", "none") else isa


def inspect_torch_pair(source_bytes: bytes, cache_bytes: bytes, *, what: str = "the torch pair"):
    """Validate a torch pair before it enters a wheel, and describe it.

    Checks that the cache is torch's envelope (zip CRCs, ``torch.load(weights_only=True)``,
    format tag, int version, backend tag, code_hash), that ``code_hash ==
    sha256(source_bytes)``, that the source is a precompile artifact (its literal
    ``BACKEND``, read without executing it) and that the two backend tags agree. Works for
    a pair from :func:`capture_pair` and for one a capture script wrote itself with
    torch's API at ``PRECOMPILE_ARTIFACT_PATH`` / ``PRECOMPILE_CACHE_PATH``.

    Args:
        source_bytes: the exact bytes of the source file (torch's python_code, UTF-8).
        cache_bytes: the exact bytes of the cache file.
        what: how to name the pair in messages (e.g. its paths).
    Returns:
        a dict with the keys ``engine`` (``"torch"``), ``code_hash``, ``fingerprint``,
        ``device`` and ``meta`` (``precompile_build.builder.pairs`` makes it a ``PairInfo``).
        ``fingerprint`` is ``host_fingerprint(device)`` of this (the capture) host, plus
        ``cpu_isa`` for inductor CPU pairs and ``engine_key``; ``device`` is ``"cuda"``
        when torch recorded any CUDA input/param/buffer, else ``"cpu"``; ``meta`` holds
        ``format``, ``version``, ``backend``, ``tracer``, ``has_artifact``,
        ``artifact_size`` (bytes).
    Raises:
        CaptureError: any check above fails; the message says which and what to do.
    """
    from precompile_runtime.fingerprint import host_fingerprint

    try:
        blob = read_torch_envelope(cache_bytes)
    except ValueError as e:
        raise CaptureError(
            f"Failed to validate {what}: the cache is not torch's envelope: {e}. Write it with "
            "torch.compiler.precompile (and do not modify it afterwards)"
        ) from None
    code_hash = hashlib.sha256(source_bytes).hexdigest()
    if blob["code_hash"] != code_hash:
        raise CaptureError(
            f"Failed to validate {what}: the cache's code_hash {blob['code_hash']} != "
            f"sha256 of the source {code_hash}; the two files come from different captures "
            "or the source was modified. Write both halves from the same capture call"
        )
    try:
        meta = read_source_metadata(source_bytes)
    except ValueError as e:
        raise CaptureError(f"Failed to validate {what}: {e}") from None
    if meta["BACKEND"] != blob["backend"]:
        raise CaptureError(
            f"Failed to validate {what}: the source's BACKEND {meta['BACKEND']!r} "
            f"differs from the cache's backend tag {blob['backend']!r}"
        )
    tracer = blob.get("tracer", meta.get("TRACER", "make_fx"))
    device = _device_type(meta)
    fingerprint = host_fingerprint(device)
    if device == "cpu" and blob["backend"] == "inductor":
        fingerprint["cpu_isa"] = _cpu_isa()
    fingerprint["engine_key"] = f"{CACHE_FORMAT}/v{blob['version']}/{blob['backend']}/{tracer}"
    artifact = blob.get("artifact")
    info_meta = {
        "format": blob["format"],
        "version": blob["version"],
        "backend": blob["backend"],
        "tracer": tracer,
        "has_artifact": artifact is not None,
        "artifact_size": len(artifact) if isinstance(artifact, (bytes, bytearray)) else 0,
    }
    # a plain dict: pairs.py (which imports this module lazily) makes it a PairInfo
    return {
        "engine": "torch",
        "code_hash": code_hash,
        "fingerprint": fingerprint,
        "device": device,
        "meta": info_meta,
    }
