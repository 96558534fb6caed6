"""The version of precompile-runtime (one place: the package and pair_format read it)."""

__version__ = "0.3.0"
