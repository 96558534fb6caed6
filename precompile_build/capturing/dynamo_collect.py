"""Asking TorchDynamo for the guard set of one call, without running it.

dynamo_guards.py translates what :func:`collect` returns into the checks a pair runs;
this module holds the conversation with Dynamo: the guard filter that stops the compile
once the guards are built, the logging it silences, the marks it must not see, and what
a failure's first line and a guard's source line read as in a refusal.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable


class _Collected(Exception):
    """Raised from the guard filter once Dynamo handed over the guards: nothing runs."""


def user_line(guard) -> str:
    """``file:line`` of the code that read the guarded value, the file named from the
    import root it was found under (``transformers/masking_utils.py``): the same on
    every build host, so two builds of one project are byte-identical; "" where the
    guard carries no stack."""
    stack: Any = getattr(guard, "user_stack", None) or getattr(guard, "stack", None)
    try:
        frame = stack[-1]
        filename, lineno = frame.filename, frame.lineno
    except (TypeError, IndexError, AttributeError):
        return ""
    roots = [os.path.join(os.path.abspath(p), "") for p in sys.path if p]
    root = max((r for r in roots if filename.startswith(r)), key=len, default="")
    return f"{filename[len(root) :]}:{lineno}"


def collect(fn: Callable, args: tuple, kwargs: dict, traced: list | None = None) -> list:
    """The guard entries (torch's ``GuardFilterEntry``) Dynamo builds for
    ``fn(*args, **kwargs)`` traced as one graph; the function does not run. ``traced``,
    where given, is extended with the code objects Dynamo traced (the tracing context's
    ``traced_code``: the function's, and each function and method it inlined).

    Raises:
        the exception Dynamo raised where it cannot trace the call in one graph
        (``torch._dynamo.exc.Unsupported`` and friends).
    """
    import torch
    import torch._dynamo

    box: list = []

    def keep(entries):
        box.extend(entries)
        raise _Collected

    def backend(gm, _example):
        context = torch._guards.TracingContext.try_get()
        if traced is not None and context is not None:
            traced.extend(getattr(context, "traced_code", ()))
        return gm.forward

    compiled = torch.compile(fn, backend=backend, fullgraph=True, options={"guard_filter_fn": keep})
    patch = torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True, suppress_errors=False
    )
    try:
        with patch, _quiet_dynamo():
            compiled(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - Dynamo wraps whatever the guard filter raised
        if not box:
            raise _root_cause(e) from None
    return box


@contextlib.contextmanager
def _quiet_dynamo():
    import logging

    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None and not isinstance(e, _Collected):
        e = e.__cause__
    return e


@contextlib.contextmanager
def without_dynamic_marks(args: tuple, kwargs: dict):
    """The call's tensors without their ``mark_dynamic`` marks while Dynamo builds the
    guards: the sizes are the dynamic dims' own checks (dynamic_dims.py), whose refusals
    say more than Dynamo's constraint violations."""
    import torch
    from torch.utils import _pytree as pytree

    saved = []
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            marks = {k: v for k, v in vars(t).items() if k.startswith("_dynamo_")}
            for k in marks:
                delattr(t, k)
            saved.append((t, marks))
    try:
        yield
    finally:
        for t, marks in saved:
            for k, v in marks.items():
                setattr(t, k, v)


def first_line(e: BaseException) -> str:
    """The first line of Dynamo's refusal ``e`` for a capture's message, with the
    ``File ..., line N`` of the user code it names where its text has one."""
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    where = next((line.strip() for line in text if "File " in line or ", line " in line), "")
    return first + (f" ({where})" if where else "")


def has_guard_filter() -> bool:
    """Whether this torch hands guards to a ``guard_filter_fn`` (torch 2.8 and later)."""
    import torch._dynamo.types

    return hasattr(torch._dynamo.types, "GuardFilterEntry")


def in_process_group() -> bool:
    """True inside an initialised torch.distributed process group: a rank's call is
    traced with its collectives by export or make_fx alone (its Python state is checked
    by assumed_state.py's recording; docs/assumed_state.md)."""
    import torch

    return torch.distributed.is_available() and torch.distributed.is_initialized()
