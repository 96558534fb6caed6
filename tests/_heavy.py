"""tests/heavy.txt, the unit tests left out of the fast loop: what it lists, and how it is
made from a measured run (docs/contributing.md).

Each line of heavy.txt is ``SECONDS  PATH::FUNCTION`` (or ``PATH::CLASS::FUNCTION``):
a test function whose slowest case took SECONDS (setup, call and teardown) in the
measured runs. tests/conftest.py gives every case of a listed function the ``heavy`` mark.

Re-measure (on a quiet machine) the unit tier, then the fast loop that the new list
leaves (the one-time costs a heavy test paid, the first compile of a process, move to
the tests left), and rewrite it from both::

    python -m pytest -q -p no:cacheprovider tests example_project/tests \\
        -m "not slow and not gpu" --durations=0 > unit.txt
    python tests/_heavy.py unit.txt > tests/heavy.txt
    python -m pytest -q -p no:cacheprovider tests example_project/tests \\
        -m "not slow and not gpu and not heavy" --durations=0 > fast.txt
    python tests/_heavy.py unit.txt fast.txt > tests/heavy.txt
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

HEAVY_SECONDS = 1.0
"""A test function with a case of at least this many seconds is heavy."""
HEAVY_FILE = Path(__file__).with_name("heavy.txt")
_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")


def function_id(nodeid: str) -> str:
    """``tests/test_x.py::test_y[case]`` -> ``tests/test_x.py::test_y``."""
    return nodeid.split("[", 1)[0]


def read(path: Path = HEAVY_FILE) -> dict[str, float]:
    """heavy.txt: function id -> the seconds of its slowest case when it was measured."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, name = line.split()
            out[name] = float(seconds)
    return out


def measured(durations: str) -> dict[str, float]:
    """pytest's ``--durations=0`` report: function id -> its slowest case's seconds
    (setup, call and teardown of a case added up)."""
    per_case: dict[str, float] = defaultdict(float)
    for line in durations.splitlines():
        m = _LINE.match(line.strip())
        if m:
            per_case[m.group(2)] += float(m.group(1))
    out: dict[str, float] = {}
    for nodeid, seconds in per_case.items():
        name = function_id(nodeid)
        out[name] = max(out.get(name, 0.0), seconds)
    return out


def render(*durations: str, threshold: float = HEAVY_SECONDS) -> str:
    """heavy.txt's text for ``--durations=0`` reports: the functions whose slowest case
    in any of them took ``threshold`` seconds or more."""
    heavy: dict[str, float] = {}
    for report in durations:
        for name, seconds in measured(report).items():
            if seconds >= threshold:
                heavy[name] = max(heavy.get(name, 0.0), seconds)
    head = [
        f"# the unit tests left out of the fast loop: a case of {threshold:g} s or more "
        "(tests/_heavy.py says how this list is made; docs/contributing.md)"
    ]
    return "\n".join(head + [f"{s:7.1f}  {name}" for name, s in sorted(heavy.items())]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(*(Path(a).read_text(encoding="utf-8") for a in sys.argv[1:])))
