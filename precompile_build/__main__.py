"""``python -m precompile_build``: see :mod:`precompile_build.cli`."""

import sys

from .cli import main

sys.exit(main())
