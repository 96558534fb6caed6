"""A fixture library built with pdm's backend, wrapped by precompile-build."""

__version__ = "0.1.0"
