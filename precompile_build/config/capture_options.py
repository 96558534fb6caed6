"""What decides how ``precompile_build.capture`` captures: one typed, validated value.

:meth:`CaptureOptions.parse` checks everything that can be checked before the
function runs (``capture()`` calls it); :meth:`CaptureOptions.for_call` what depends on
the first call's device and the engine it resolves to, and gives the engine its
options. The engines read the same rules when called directly (:func:`option_problem`).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, cast

from ..errors import CaptureError
from . import capture_env
from .choices import (
    ENGINES,
    FALLBACKS,
    MODES,
    TRACERS,
    Engine,
    EngineChoice,
    Fallback,
    TracerChoice,
    check_tracer,
)
from .choices import resolve as resolve_engine

BACKENDS = ("inductor", "eager")
EAGER_CHECKS = ("refuse", "warn", "off")
"""Values of ``options["eager_check"]``."""
GUARDS = ("dynamo", "recorded")
"""Values of ``options["guards"]``: ``"dynamo"`` (default) checks the Python state the
call read through the guards TorchDynamo builds for it, and the capture refuses a call
it cannot trace in one graph; ``"recorded"`` checks only what assumed_state.py records."""

OPTIONS = (
    "cuda_archs",
    "cuda_graphs",
    "eager_check",
    "guards",
    "inductor",
    "mode",
    "tracer",
    "validation_multiple",
)
"""The keys ``capture(options=...)`` accepts (see :func:`precompile_build.capture`)."""

FROZEN_OPTIONS = (
    "cuda_graphs",
    "eager_check",
    "inductor",
    "validation_multiple",
    "cuda_archs",
    "mode",
    "guards",
)
"""The keys of :data:`OPTIONS` that only the frozen engine (and, for ``eager_check``,
the eager engine) reads: with ``engine="auto"`` any of them picks the frozen engine;
with the torch engine they are refused. (``tracer`` means torch's own tracer there.)"""

KERNEL_OPTIONS = ("inductor", "validation_multiple", "mode")
"""The keys about kernels, which the eager engine has not: refused with it."""


def _distributed_world() -> bool:
    """Whether this process is one rank of an initialized world of several processes
    (torch.distributed imported by the script; not imported here otherwise)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    return bool(
        dist is not None
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
    )


def check_choice(engine: str, backend: str, fallback: str) -> None:
    """``engine=``, ``backend=`` and ``fallback=`` (resolved from the environment) of
    ``capture()``. Raises ValueError naming the argument and its valid values."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use 'inductor' or 'eager'")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback={fallback!r} (or PRECOMPILE_FALLBACK): use 'none' or 'eager'")
    if engine != "auto" and engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: use 'auto', {', '.join(map(repr, ENGINES))}")


def option_problem(options: Mapping[str, Any], key: str) -> Optional[str]:
    """What is wrong with ``options[key]`` (``"validation_multiple"``: a positive
    number; ``"eager_check"``: one of :data:`EAGER_CHECKS`; ``"mode"``: one of
    :data:`MODES`), as the text both checks
    use (capture()'s ValueError before the function runs, an engine's CaptureError
    when called directly), or None when it is absent or valid."""
    value = options.get(key)
    if value is None:
        return None
    if key == "validation_multiple":
        import numbers  # numpy's scalars register as numbers.Real too

        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not value > 0  # type: ignore[operator]
            or not math.isfinite(value)
        ):  # inf would accept any error: no check at all
            return (
                f"options['validation_multiple'] = {value!r}: use a positive number (the "
                "multiple of eager's error allowed, e.g. 10; not inf, which would allow any error)"
            )
    elif key == "guards":
        if value not in GUARDS:
            return (
                f"options['guards'] = {value!r}: use 'dynamo' (default: every value the call read "
                "is checked) or 'recorded' (only what the recorder sees; docs/assumed_state.md)"
            )
    elif key == "eager_check":
        if value not in EAGER_CHECKS:
            return f"options['eager_check'] = {value!r}: use 'refuse' (default), 'warn' or 'off'"
    elif key == "mode":
        if value not in MODES:
            close = difflib.get_close_matches(str(value), MODES, n=1)
            return (
                f"options['mode'] = {value!r} (or the target's `mode`, {capture_env.MODE}): use "
                + " or ".join(map(repr, MODES))
                + (f"; did you mean {close[0]!r}?" if close else "")
                + " (max-autotune without Inductor's CUDA graphs: `cuda-graphs` are the frozen "
                "engine's own, combinable with it)"
            )
    return None


# Inductor settings the frozen engine pins for every capture (engines/frozen.py), and why
PINNED_INDUCTOR = {
    "cpp.march": "the CPU kernels' instruction set, from Inductor's vector ISA: the wheel's CPU "
    "requirement in its fingerprint",
    "fallback_random": "random ops call torch's generator, as eager does",
    "aot_inductor.enable_line_tables": "off: line tables name the build's cache path",
    "use_static_cuda_launcher": "on: CUDA kernels are frozen with Triton's static launcher",
    "static_launch_user_defined_triton_kernels": "on: user-defined Triton kernels are frozen the same way",
    "triton.descriptive_names": "off: Triton truncates a long kernel name's cubin file, which is then not found",
}
# Not pinned, but set by the frozen engine where options['inductor'] does not:
# triton.autotune_at_compile_time, off for CUDA graphs that do not branch (the capture's
# first run autotunes, as under torch.compile; engines/frozen.py _standalone_options).


def _check_inductor_option(value: Any, target: str) -> None:
    """``options["inductor"]``: a dict of Inductor config names (``"max_autotune"``,
    ``"triton.cudagraphs"``...) to values, checked here so that a typo is not later
    reported as a compiler failure. Raises ValueError."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ValueError(
            f"precompile_build.capture: target {target!r}: options['inductor'] = "
            f"{value!r}: use a dict of Inductor config names to values, e.g. "
            "{'max_autotune': True}"
        )
    from torch._inductor import config  # the capture compiles with Inductor anyway

    known = set(config.get_config_copy())
    for key in value:
        if key in PINNED_INDUCTOR:
            raise ValueError(
                f"precompile_build.capture: target {target!r}: options['inductor'] sets "
                f"{key!r}, which the frozen engine sets itself ({PINNED_INDUCTOR[key]}); "
                "drop it"
            )
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            raise ValueError(
                f"precompile_build.capture: target {target!r}: options['inductor'] has "
                f"{key!r}, which is not an Inductor config name"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + " (see torch/_inductor/config.py)"
            )


def _check_options(options: Mapping[str, Any], target: str) -> None:
    """Unknown keys and the frozen/eager engines' numeric options, checked before
    anything runs (the engines read them only after the compile). Raises ValueError."""
    for key in options:
        if key == "backend":
            raise ValueError(
                f"precompile_build.capture: target {target!r}: options['backend'] "
                f"= {options[key]!r}: the backend is capture()'s own argument, "
                "not an option; pass backend='inductor' (default) or 'eager' to "
                "precompile_build.capture"
            )
        if key not in OPTIONS:
            close = difflib.get_close_matches(str(key), OPTIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"precompile_build.capture: target {target!r}: unknown key {key!r} in "
                f"options; {hint}accepted keys: {', '.join(OPTIONS)}"
            )
    for key in ("validation_multiple", "eager_check", "mode", "guards"):
        problem = option_problem(options, key)
        if problem:
            raise ValueError(f"precompile_build.capture: target {target!r}: {problem}")
    if "cuda_graphs" in options and not isinstance(options["cuda_graphs"], bool):
        raise ValueError(
            f"precompile_build.capture: target {target!r}: options['cuda_graphs'] = "
            f"{options['cuda_graphs']!r}: use True or False"
        )
    if options.get("cuda_archs") is not None:
        from ..errors import ConfigError
        from .compile_keys import parse_cuda_archs

        try:
            parse_cuda_archs(options["cuda_archs"], "options['cuda_archs']")
        except ConfigError as e:
            raise ValueError(f"precompile_build.capture: target {target!r}: {e}") from None
    _check_inductor_option(options.get("inductor"), target)


@dataclass(frozen=True)
class CaptureOptions:
    """``capture()``'s engine choice and ``options=``, validated (:meth:`parse`)."""

    target: str
    """The target's name, for messages."""
    engine: EngineChoice = "auto"
    """``"auto"`` or one of ``precompile_build.config.choices.ENGINES``."""
    backend: str = "inductor"
    """One of :data:`BACKENDS`."""
    tracer: TracerChoice = "auto"
    """The frozen and eager engines' tracer (config/choices.py TRACERS)."""
    fallback: Fallback = "none"
    """One of :data:`FALLBACKS`."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The ``options=`` dict: keys of :data:`OPTIONS`, values checked."""

    @classmethod
    def parse(
        cls,
        *,
        target: str,
        engine: str = "auto",
        backend: str = "inductor",
        tracer: Optional[str] = None,
        fallback: str = "none",
        options: Optional[Mapping[str, Any]] = None,
    ) -> CaptureOptions:
        """Validate ``capture()``'s arguments.

        Args:
            target: the target's name (messages).
            engine, backend, fallback: as ``capture()`` takes them (fallback already
                resolved from ``PRECOMPILE_FALLBACK``).
            tracer: ``capture()``'s ``tracer=`` (None: ``PRECOMPILE_TRACER``, else auto).
            options: ``capture()``'s ``options=`` (None: none).
        Returns:
            the :class:`CaptureOptions`.
        Raises:
            ValueError: an unknown engine, backend, fallback or tracer; an unknown key
                or a bad value in ``options``; ``options['tracer']`` and ``tracer`` both
                given and different.
            TypeError: ``options`` is not a mapping.
        """
        check_choice(engine, backend, fallback)
        tracer = check_tracer(tracer)
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(
                f"precompile_build.capture: options must be a dict, e.g. "
                f"{{'inductor': {{...}}}}, not {type(options).__name__}"
            )
        options = dict(options or {})
        _check_options(options, target)
        given = options.get("tracer")
        if given and tracer != "auto" and given != tracer:  # one would silently win
            raise ValueError(
                f"precompile_build.capture: target {target!r}: options['tracer'] = {given!r} and "
                f"tracer={tracer!r} (from the call, the target's `tracer` key or PRECOMPILE_TRACER) "
                "disagree: options['tracer'] is the torch engine's tracer, tracer= the frozen and "
                "eager engines'; give one of them"
            )
        return cls(
            target=target,
            engine=cast(EngineChoice, engine),
            backend=backend,  # (checked above)
            tracer=cast(TracerChoice, tracer),
            fallback=cast(Fallback, fallback),
            options=options,
        )

    def for_call(self, device: str) -> tuple[Engine, dict[str, Any]]:
        """The engine for a first call on ``device`` and the options it gets: the
        target's `cuda-graphs` / `cuda-archs` / `mode` (``PRECOMPILE_CUDA_GRAPHS`` /
        ``PRECOMPILE_CUDA_ARCHS`` / ``PRECOMPILE_MODE``, where ``options`` has none) added, ``tracer`` (ours) or ``backend`` (the torch
        engine's) set.

        Args:
            device: the device type of the call's tensors (``"cuda"``, ``"cpu"``, ...).
        Returns:
            ``(engine, options)``: the engine's name and the options it is given (a new dict).
        Raises:
            CaptureError: an option or setting that the resolved engine or the device
                cannot honour (checked before the function runs).
            ValueError: ``options['tracer']`` is not a tracer of our engines;
                ``PRECOMPILE_MODE`` is not one of :data:`MODES`.
        """
        options = dict(self.options)
        given_mode = "mode" in options  # the call's own mode wins over the target's
        if options.get("mode") == "default":  # the same as none: no reason to pick an engine
            del options["mode"]
        env_mode = os.environ.get(capture_env.MODE, "").strip()
        if env_mode and env_mode != "default" and not given_mode:  # the target's `mode`
            problem = option_problem({"mode": env_mode}, "mode")
            if problem:
                raise ValueError(f"precompile_build.capture: target {self.target!r}: {problem}")
            options["mode"] = env_mode
        if os.environ.get(capture_env.CUDA_GRAPHS) == "1":  # the `cuda-graphs` target option
            options.setdefault("cuda_graphs", True)
        if os.environ.get(capture_env.CUDA_ARCHS, "").strip() and device == "cuda":  # `cuda-archs`
            options.setdefault("cuda_archs", os.environ[capture_env.CUDA_ARCHS])
        # CUDA graphs replay the frozen engine's kernels, and tracer/fallback and the
        # FROZEN_OPTIONS are its settings: auto picks it for them (PRECOMPILE_ENGINE
        # still decides when set)
        # and a rank of a distributed world (a tensor-parallel model): the frozen engine
        # lifts DTensor parameters as their shards and records the collectives' groups
        wants_frozen = (
            options.get("cuda_graphs")
            or self.tracer != "auto"
            or self.fallback != "none"
            or any(k in options for k in FROZEN_OPTIONS if k != "cuda_graphs")
            or _distributed_world()
        )
        engine = resolve_engine(
            "frozen"
            if wants_frozen
            and self.engine == "auto"
            and not os.environ.get(capture_env.ENGINE, "").strip()
            else self.engine,
            device,
        )
        if self.backend == "eager" and engine == "frozen":
            engine = "eager"
        self._refuse(engine, device, options)
        if engine == "torch":
            options["backend"] = self.backend
        elif options.get("tracer"):  # for the torch engine torch's own tracer; here as tracer=
            try:
                options["tracer"] = check_tracer(options["tracer"])
            except ValueError:
                raise ValueError(
                    f"precompile_build.capture: target {self.target!r}: options['tracer'] = "
                    f"{options['tracer']!r} is not a tracer of the {engine} engine: use one of "
                    f"{', '.join(map(repr, TRACERS))} (torch's own 'make_fx' and 'dynamo' are "
                    "the torch engine's, with engine='torch')"
                ) from None
        else:
            options["tracer"] = self.tracer
        return engine, options

    def _refuse(self, engine: str, device: str, options: Mapping[str, Any]) -> None:
        """What ``engine`` (resolved) on ``device`` cannot honour. Raises CaptureError."""
        if options.get("cuda_graphs") and engine != "frozen":
            raise CaptureError(
                "cuda-graphs = true replays the frozen engine's kernels, "
                f"but this capture uses engine {engine!r}: use engine='frozen' (or 'auto') and "
                "backend='inductor', or drop the option",
                target=self.target,
            )
        if options.get("cuda_graphs") and device != "cuda":  # checked before the trace
            raise CaptureError(
                "cuda-graphs = true needs a CUDA inference target; "
                f"this one's arguments are on {device}: drop the option (a build drops it "
                'for a `device = "auto"` target captured on a host without CUDA)',
                target=self.target,
            )
        if options.get("cuda_archs") and device != "cuda":
            raise CaptureError(
                "options['cuda_archs'] compiles CUDA kernels for other GPUs; this call's "
                f"arguments are on {device}, so it has none: drop the option",
                target=self.target,
            )
        if engine == "torch":
            self._refuse_frozen_only_settings(options)
        kernel_keys = [k for k in KERNEL_OPTIONS if k in options]
        if engine == "eager" and kernel_keys:  # settings of kernels the eager engine has not
            why = (
                " (backend='eager')"
                if self.backend == "eager"
                else " (from PRECOMPILE_ENGINE)"
                if self.engine == "auto"
                else ""
            )
            raise CaptureError(
                f"options {', '.join(map(repr, kernel_keys))} apply to the "
                f"frozen engine's kernels, but this capture uses engine 'eager'{why}, which has "
                "none and would ignore them. Pass engine='frozen' (and backend='inductor') to "
                "precompile_build.capture(), or drop them; nothing written",
                target=self.target,
            )

    def _refuse_frozen_only_settings(self, options: Mapping[str, Any]) -> None:
        """``tracer``, ``fallback`` and the :data:`FROZEN_OPTIONS` mean nothing to the
        torch engine (torch traces with its own tracers and judges nothing against
        eager; a compiler failure there has no fallback): refuse them rather than
        ignore them. Raises CaptureError."""
        given, drop = [], []
        if self.tracer != "auto":
            given.append(f"tracer={self.tracer!r} applies to the frozen and eager engines only")
            drop.append(
                "the target's `tracer` key in pyproject.toml, the capture's tracer=, "
                "PRECOMPILE_TRACER"
            )
        if self.fallback != "none":
            given.append(f"fallback={self.fallback!r} applies to the frozen engine only")
            drop.append("the target's `fallback` key, the capture's fallback=, PRECOMPILE_FALLBACK")
        keys = [k for k in FROZEN_OPTIONS if k in options]
        if keys:
            given.append(f"options {', '.join(map(repr, keys))} apply to the frozen engine only")
            drop.append(
                "the keys of the capture's options="
                + (f" or the target's `mode` ({capture_env.MODE})" if "mode" in keys else "")
            )
        if not given:
            return
        why = " (from PRECOMPILE_ENGINE)" if self.engine == "auto" else ""
        raise CaptureError(
            f"{'; '.join(given)}, but this capture uses engine 'torch'{why}, "
            "which would ignore it. Pass engine='frozen' to precompile_build.capture(), or drop "
            f"the setting ({'; '.join(drop)}); the torch engine's own "
            "tracer is options={'tracer': 'make_fx'}; nothing written",
            target=self.target,
        )
