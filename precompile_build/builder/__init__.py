"""Build orchestration: the captures of one build, run side by side and reused.

Takes the :class:`~precompile_build.config.settings.Settings` of a build (backend.py and
cli.py call :func:`~.runner.run_captures`). Per target: the device (runner.py), what the
targets share (build_state.py), one target's run (target_run.py, capture_run.py), a device
slot (slots.py), the capture cache's key and entry (capture_cache.py, with the imports
record of precompile_build.process.imported), the capture script in a subprocess
(script.py), the pair it wrote checked (pairs.py), progress on stderr (progress.py), all
inside the build's temp dir (workdir.py); the build line's architectures
(arch_report.py). Gives one ``CaptureResult`` per target (results.py): the pair's bytes and what the
capture measured, for precompile_build.wheels.
"""
