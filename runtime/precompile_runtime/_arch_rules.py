# ---- which GPU binary a CUDA device runs (`cuda-archs`) -----------------------------
# One implementation for both sides: precompile_runtime.arch_select builds its choice
# of variant on these functions, and precompile_build's codegen copies this file
# verbatim into the source half of frozen Triton kernels, whose launcher
# (triton_launcher.py) picks each kernel's binary with them. The source half runs on
# torch alone, so this file uses no other module, and its names stay private there.
#
# Binaries are named the way ptxas names its targets: sm_80 (a cubin), sm_90a (an
# architecture-specific cubin: Triton compiles 9.0 and above this way), compute_80
# (PTX). A device of compute capability M.m runs, in this order of preference:
#   1. a cubin for exactly M.m (EXACT);
#   2. a cubin for a lower minor of the same major that is not architecture-specific
#      (binary compatible: an sm_80 cubin runs on sm_86 and sm_89), the highest one
#      (LOWER_MINOR);
#   3. PTX for M.m or any lower capability that is not architecture-specific, the
#      highest: the driver JIT-compiles it at load, which is a compile (PTX);
#   4. nothing.
# (Annotations are quoted and name builtins only: a source half runs on Python 3.9 too,
# and this file, copied into its middle, uses no module, `__future__` included.)

_BINARY_EXACT, _BINARY_LOWER_MINOR, _BINARY_PTX = 0, 1, 2
_FORCE_PTX_ENV = "PRECOMPILE_TEST_FORCE_PTX"
_DIGITS = "0123456789"


def _binary_parse(name: "object") -> "tuple[int, int, bool, bool] | None":
    """``"sm_86"`` -> ``(8, 6, False, False)``: (major, minor, architecture-specific,
    PTX); ``"compute_80"`` -> ``(8, 0, False, True)``; ``"sm_100a"`` -> ``(10, 0,
    True, False)``. None for anything else (other forms, non-strings)."""
    if not isinstance(name, str):
        return None
    kind, _, rest = name.partition("_")
    specific = rest.endswith("a")
    digits = rest[:-1] if specific else rest
    if (
        kind not in ("sm", "compute")
        or not 2 <= len(digits) <= 3
        or any(c not in _DIGITS for c in digits)
    ):
        return None
    cc = int(digits)
    return cc // 10, cc % 10, specific, kind == "compute"


def _binary_serves(name: "object", host: "tuple[int, int] | list[int]") -> "int | None":
    """How the binary ``name`` serves a device of capability ``host`` (``(major,
    minor)``): _BINARY_EXACT, _BINARY_LOWER_MINOR or _BINARY_PTX (the order above), or
    None when it cannot run there."""
    p = _binary_parse(name)
    if p is None:
        return None
    major, minor, specific, ptx = p
    if ptx:
        return _BINARY_PTX if not specific and (major, minor) <= tuple(host) else None
    if (major, minor) == tuple(host):
        return _BINARY_EXACT
    if not specific and major == host[0] and minor < host[1]:
        return _BINARY_LOWER_MINOR
    return None


def _binary_force_ptx(value: "str | None") -> bool:
    """Whether ``value`` (``os.environ.get(_FORCE_PTX_ENV)``) turns on the tests-only
    switch ``PRECOMPILE_TEST_FORCE_PTX=1``: PTX first wherever it can run, so that a GPU
    test can check the PTX path on a GPU that has its cubin."""
    return (value or "").strip() == "1"


def _binary_best(
    names: "list[str]", host: "tuple[int, int] | list[int]", force_ptx: bool = False
) -> "str | None":
    """The name among ``names`` a device of capability ``host`` runs (the order above;
    with ``force_ptx``, PTX first), or None when none runs there."""
    ranked = []
    for name in names:
        kind = _binary_serves(name, host)
        if kind is None:
            continue
        if force_ptx and kind == _BINARY_PTX:
            kind = -1
        parsed = _binary_parse(name)
        assert parsed is not None  # (served: it parses)
        ranked.append((kind, -parsed[0], -parsed[1], str(name)))
    return min(ranked)[3] if ranked else None


def _binary_pick(
    choices: "list[dict[str, object]]", host: "tuple[int, int] | list[int]", force_ptx: bool = False
) -> "dict[str, object] | None":
    """The kernel binary to load on a device of capability ``host``: one of
    ``choices`` (a kernel entry's ``archs``, each with ``sm``: its binary's name), or
    None when none runs on that device."""
    name = _binary_best([str(c["sm"]) for c in choices], host, force_ptx)
    return next((c for c in choices if c["sm"] == name), None)
