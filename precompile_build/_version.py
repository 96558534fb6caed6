"""precompile-build's version (pyproject.toml's), importable by any stage."""

__version__ = "0.1.0"
