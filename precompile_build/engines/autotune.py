"""max-autotune at capture: Inductor's choices that can be frozen, and the tuning's seconds.

With ``max_autotune`` (the target's ``mode = "max-autotune"``, or
``options["inductor"]``), Inductor times several implementations of each matrix
product, convolution or attention (``AlgorithmSelectorCache`` in
torch/_inductor/select_algorithm.py) and keeps the fastest. What each can become in
a frozen pair:

- an extern kernel (``ExternKernelCaller``: cuBLAS, oneDNN, ``bias_addmm``...): a
  plain torch call in the source half (extern_calls.py);
- a Triton template (``TritonTemplateCaller``: mm, addmm, bmm, conv, flex attention):
  a Triton kernel of the wrapper like any other, frozen as a cubin with its tuned
  config (triton_freeze.py; its grid comes in as launcher arguments), as long as
  Inductor launches it with torch's static CUDA launcher (not with TMA
  descriptors, num_ctas > 1, ...: its compile result, after the choice was timed);
- a CPU C++ template (``CppTemplateCaller``): compiled into the wrapper's ``.so``;
- a subgraph choice (``SubgraphChoiceCaller``, decompose-k): ordinary wrapper code.

Anything else (CUTLASS, CK, CuTe DSL... kernels) cannot be frozen. While
:func:`tuning` is active, a choice that cannot be frozen is dropped from the timings
Inductor picks the fastest of, after they were measured
(``AlgorithmSelectorCache.do_autotuning``): the best-timed choice that can be frozen
wins instead, and each such replacement is reported (the build line says it). With
no choice that can be frozen, Inductor's own pick stands (the capture then says
which kernel could not be frozen).

:func:`tuning` also measures the seconds spent autotuning: choosing among those
implementations during the compile, and Triton's config autotuning and coordinate
descent at the first run (the union of those intervals, over threads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import extern_calls

log = logging.getLogger("precompile_build")

# ChoiceCaller classes whose choice becomes ordinary wrapper code (by name: the module
# each lives in differs across torch versions)
_PLAIN_CHOICES = ("CppTemplateCaller", "SubgraphChoiceCaller")


@dataclass
class Replacement:
    """One selection where the fastest choice could not be frozen."""

    op: str
    """What was selected (Inductor's name: ``mm``, ``addmm``, ``convolution``...)."""
    fastest: str
    """The fastest choice, which cannot be frozen (name and description)."""
    fastest_ms: float
    """Its time, milliseconds."""
    why: str
    """Why it cannot be frozen."""
    chosen: str
    """The best-timed choice that can, which is frozen instead."""
    chosen_ms: float
    """Its time, milliseconds."""

    def line(self) -> str:
        """``addmm: bias_addmm (0.012 ms) cannot be frozen (...); froze triton_mm_4 (0.013 ms, 1.08x)``."""
        ratio = self.chosen_ms / self.fastest_ms if self.fastest_ms > 0 else float("inf")
        return (
            f"{self.op}: {self.fastest} ({self.fastest_ms:.4g} ms) cannot be frozen ({self.why}); "
            f"froze {self.chosen} ({self.chosen_ms:.4g} ms, {ratio:.2f}x its time)"
        )


@dataclass
class Report:
    """What :func:`tuning` saw."""

    seconds: float = 0.0
    """Wall seconds spent autotuning (the union of the tuning intervals)."""
    replaced: list[Replacement] = field(default_factory=list)
    """Selections whose fastest choice could not be frozen, in the order they ran."""
    selections: int = 0
    """Selections timed (``do_autotuning`` calls)."""


class _Clock:
    """The union of possibly nested, possibly concurrent intervals, in seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._since = 0.0
        self.total = 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            if self._open == 0:
                self._since = time.perf_counter()
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self.total += time.perf_counter() - self._since


def choice_problem(choice: Any) -> str | None:
    """Why Inductor's autotuning ``choice`` (a ``ChoiceCaller``) cannot be frozen,
    or None when it can (see the module docstring for each kind). A Triton template
    whose compile result this process does not hold (timed in a subprocess) counts
    as one that can: freezing it then says if it cannot."""
    while isinstance(getattr(choice, "__dict__", None), dict) and "_wrapped" in vars(choice):
        choice = vars(choice)[
            "_wrapped"
        ]  # DataProcessorChoiceCallerWrapper (CPU GEMMs' weight packing)
    kind = type(choice).__name__
    bases = {c.__name__ for c in type(choice).__mro__}
    if "ExternKernelCaller" in bases:
        extern = getattr(choice, "choice", None)
        if extern is None or getattr(extern, "use_fallback_kernel", False):
            return None  # an operator call of the wrapper (FallbackKernel), not extern_kernels.X
        name = str(getattr(extern, "name", None) or getattr(choice, "name", "?"))
        try:
            impl = extern.to_callable()
        except Exception as e:  # noqa: BLE001 - any failure means: not bindable
            return f"Inductor's extern kernel {name!r} has no callable ({type(e).__name__}: {e})"
        why = extern_calls.problem(name, impl)
        return f"the extern kernel {name!r}: {why}" if why else None
    if "TritonTemplateCaller" in bases:
        return _template_problem(choice)
    if bases & set(_PLAIN_CHOICES):
        return None
    return (
        f"a {kind} kernel is compiled outside Triton and Inductor's C++ kernels, which are "
        "what the frozen engine freezes"
    )


def _template_problem(choice: Any) -> str | None:
    """A Triton template choice that Inductor, having compiled it to time it, does
    not launch with torch's static CUDA launcher (the frozen launcher's)."""
    bmreq = getattr(choice, "bmreq", None)
    path = getattr(bmreq, "module_path", None)
    if path is None:
        return None
    try:
        from torch._inductor.codecache import PyCodeCache

        module = PyCodeCache.modules_no_attr.get(path)
    except (ImportError, AttributeError):
        return None
    kernel = (
        getattr(module, getattr(bmreq, "kernel_name", ""), None) if module is not None else None
    )
    results = list(getattr(kernel, "compile_results", None) or [])
    meta = getattr(kernel, "triton_meta", None) or {}
    if not results or meta.get("device_type", "cuda") != "cuda":
        return None
    dynamic = [type(r).__name__ for r in results if type(r).__name__ != "StaticTritonCompileResult"]
    if dynamic:
        return (
            "Inductor launches this template with Triton's own launcher, not torch's static CUDA "
            "launcher (TMA descriptors, num_ctas > 1, launch attributes...)"
        )
    return None


def _describe(choice: Any) -> str:
    name = str(getattr(choice, "name", type(choice).__name__))
    desc = str(getattr(choice, "description", "") or "")
    return f"{name} ({desc})" if desc and len(desc) < 160 else name


def _freezable(name: str, timings: Any, report: Report) -> Any:
    """``timings`` ({choice: ms}) without the choices that cannot be frozen, the
    replacement recorded when the fastest was one; unchanged when none can be."""
    if not isinstance(timings, dict) or not timings:
        return timings
    problems = {c: choice_problem(c) for c in timings}
    kept = {c: t for c, t in timings.items() if problems[c] is None}
    if not kept or len(kept) == len(timings):
        return timings
    fastest = min(timings, key=timings.__getitem__)
    if problems[fastest] is not None:
        chosen = min(kept, key=kept.__getitem__)
        r = Replacement(
            op=str(name),
            fastest=_describe(fastest),
            fastest_ms=float(timings[fastest]),
            why=str(problems[fastest]),
            chosen=_describe(chosen),
            chosen_ms=float(kept[chosen]),
        )
        if r not in report.replaced:  # Inductor may ask for the timings again (benchmark fusion)
            report.replaced.append(r)
            log.warning("precompile_build: max-autotune: %s", r.line())
    return kept


@contextlib.contextmanager
def tuning() -> Iterator[Report]:
    """Around the frozen engine's compile and first run: keep Inductor's autotuning
    from choosing what cannot be frozen (:func:`choice_problem`), and measure its
    seconds. Process-wide while active (Inductor's classes are patched): do not
    compile other graphs meanwhile. Yields the :class:`Report`, filled in as it goes.

    Pipelined autotuning (``pipeline_max_autotune_gemm``, off by default) is turned
    off meanwhile: it times choices in a separate path that this does not see."""
    from torch._inductor import config
    from torch._inductor.runtime import triton_heuristics as th
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    report = Report()
    clock = _Clock()
    saved: list[tuple[type, str, Any]] = []

    def wrap(cls: type, attr: str, make) -> None:
        orig = cls.__dict__.get(attr)
        if orig is None:
            return
        saved.append((cls, attr, orig))
        setattr(cls, attr, make(orig))

    def selecting(orig):
        def do_autotuning(self, name, *args, **kwargs):
            with clock.running():
                timings = orig(self, name, *args, **kwargs)
            report.selections += 1
            return _freezable(name, timings, report)

        return do_autotuning

    def timed(orig):
        def method(self, *args, **kwargs):
            with clock.running():
                return orig(self, *args, **kwargs)

        return method

    wrap(AlgorithmSelectorCache, "do_autotuning", selecting)
    for attr in ("benchmark_all_configs", "coordinate_descent_tuning"):
        wrap(th.CachingAutotuner, attr, timed)
    patch = (
        {"pipeline_max_autotune_gemm": False}
        if hasattr(config, "pipeline_max_autotune_gemm")
        else {}
    )
    try:
        with config.patch(patch):
            yield report
    finally:
        for cls, attr, orig in reversed(saved):
            setattr(cls, attr, orig)
        report.seconds = round(clock.total, 3)
