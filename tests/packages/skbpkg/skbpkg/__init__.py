"""A fixture library built with scikit-build-core (a C++ extension module beside the
model), wrapped by precompile-build. The extension is imported when first used: the
capture scripts run from the source tree, before the backend compiles it."""

__version__ = "0.1.0"


def twice(x: float) -> float:
    """``2 * x``, computed by the C++ extension module ``skbpkg._native``."""
    from ._native import twice as native

    return native(x)
