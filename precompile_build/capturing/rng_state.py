"""What the capture watches of Python's own random state: a function that draws from
Python's ``random`` or numpy's global RNG while it is captured has that value frozen
into the pair (api.py warns), and its eager call cannot be compared with the
pair (engines/frozen.py skips that check)."""

from __future__ import annotations

import pickle
import random
import sys


def python_rng_states() -> dict[str, bytes]:
    """The global RNG states of Python's ``random`` and (when imported) numpy's
    legacy ``numpy.random``, as bytes to compare."""
    states = {"random": pickle.dumps(random.getstate())}
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            states["numpy.random"] = pickle.dumps(np.random.get_state())
        except Exception:  # noqa: BLE001 - an unusual numpy: nothing to watch
            pass
    return states
