"""Configuration: what a build and a capture are asked to do, as typed, checked values.

Takes `[tool.precompile]` of pyproject.toml, PEP 517 config settings (``precompile.*``)
and ``PRECOMPILE_*`` environment variables (settings.py, from the one table of keys in
fields.py; reference.py writes docs/settings.md from it), and the arguments of a
``capture()`` call (capture_options.py). Gives :class:`~.settings.Settings` (the build's
targets) and :class:`~.capture_options.CaptureOptions` (one capture's engine, tracer and
options), with the names they choose among and ``engine="auto"``'s rule (choices.py).
Imports no engine module and no torch.
"""
