"""Where a served call's guard check spends its time, on a transformers decode pair (CPU).

One decode pair (``bench/driver_overhead.py``'s ``lm_step`` with a StaticCache, or the
export wrapper) is captured twice, with the guards and with ``options={"guards":
"recorded"}``, and served with a kernel call that returns a ready tensor. Printed: how
many of 200 calls took the full check (the fast path must hold: 1), the whole call of
each pair (interleaved rounds), and the parts of the guards' fast path timed alone
(templates/guards.py): the covering dicts' versions (on Python 3.12+, where they are watched,
the one tick read in their place) and the slots (`_models_stand`:
those compared per call, the closure cells where the audit hook watches code and
defaults, and every one), the watch tuple of the non-module arguments
(`_guards_watch`), the checks run per call (`_guards_call`), then the whole
`_check_guards` alone, and the guards' pair called with `_check_guards` left out (it
should cost what the recorded pair does: the difference is the guard check).

    PYTHONPATH=$PWD:$PWD/runtime python bench/guard_parts.py --layers 2 --kind cache
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import driver_overhead as D  # noqa: E402  (this folder's benches, beside this file)
from dict_versions import _ns  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--kind", choices=["cache", "wrapper"], default="cache")
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    _step, make = D._decode_case(a.kind, a.layers)
    fn, args = D._serve(D._decode_source(a.kind, a.layers, tmp), None, "g", make)
    recorded = D._decode_source(a.kind, a.layers, tmp, {"guards": "recorded"})
    fnr, argsr = D._serve(recorded, None, "r", make)
    ns = fn.__call__.__globals__
    full = ns["_guards_full"]
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return full(*args, **kwargs)

    ns["_guards_full"] = counting
    with torch.no_grad():
        for _ in range(200):
            fn(*args)
    ns["_guards_full"] = full
    print(f"decode {a.kind} {a.layers}L: full checks in 200 calls: {count[0]}")
    with_guards, without = [], []
    for _ in range(3):
        with_guards.append(D._time(fn, args, a.calls))
        without.append(D._time(fnr, argsr, a.calls))
    g, r = statistics.median(with_guards), statistics.median(without)
    print(f"call: guards {g / 1000:.1f} us, recorded {r / 1000:.1f} us, +{(g - r) / 1000:.1f} us")
    seen = next(iter(ns["_G_SEEN"].values()))
    roots = ns["_G_ROOTS"][0]
    version = ns["_DICT_VERSION"]
    slots = seen[4]
    # (where they are watched the pair keeps no version: read them here, for the row)
    dicts = list({id(d): d for d in ns["_guards_dicts"](roots, *args)}.values())
    pairs = seen[1] or [(d, version(d)) for d in dicts]

    def dicts_part():
        for d, v in pairs:
            if version(d) != v:
                return False
        return True

    objs = ns["_guards_slots"](roots, *args)
    every = list(
        {
            (id(o), at): (o, at, ns["_slot_value"](o, at))
            for o, at in zip(objs, ns["_G_SLOT_ATTRS"])
        }.values()
    )

    def slots_part(slots=slots):
        for o, attr, v in slots:
            if getattr(o, attr) is not v:
                return False
        return True

    watched = seen[5]  # (Python 3.12+: a call reads the tick's version, not each dict's)
    tick = ns["_G_TICK"][0][0] if watched else None
    parts = [
        (
            f"{len(pairs)} covering dicts' versions"
            + (" (watched: not read per call)" if watched else ""),
            dicts_part,
        ),
        *([("the tick, read per call in their place", tick)] if watched else []),
        (f"{len(slots)} slots compared per call", slots_part),
        # (read here with the hook in place: each `__code__` read is an audit event)
        (f"{len(every)} slots, every kind, hook in place", lambda: slots_part(every)),
        ("the watch tuple", lambda: ns["_guards_watch"](roots, *args)),
        ("the per-call checks", lambda: ns["_guards_call"](roots, *args)),
    ]
    modules = [args[0]]
    parts.append(
        ("the whole guard check (_check_guards)", lambda: ns["_check_guards"](args, {}, modules))
    )
    for label, part in parts:
        print(f"  {label}: {_ns(part, 20000, 5) / 1000:.2f} us")
    check = ns["_check_guards"]
    ns["_check_guards"] = lambda *a, **k: None  # the same pair, its guard check left out
    bare = statistics.median(D._time(fn, args, a.calls) for _ in range(3))
    ns["_check_guards"] = check
    print(f"call without the guard check: {bare / 1000:.1f} us (recorded: {r / 1000:.1f} us)")


if __name__ == "__main__":
    main()
