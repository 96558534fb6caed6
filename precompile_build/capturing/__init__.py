"""Capture: one real call of the user's function, traced into a flat ATen graph.

Runs inside the capture script's process. Takes the function and its example
arguments from ``precompile_build.capture`` (precompile_build/api.py). Flattens arguments and results with
torch's pytree (pytree_io.py), lifts the models' parameters and buffers (tracing.py;
aliases.py, sharing.py, layouts.py, graph_attrs.py), traces with torch.export or make_fx
(tracers.py, aten_export.py; dynamic dims: dynamic_dims.py; collectives.py), and watches
what the call does besides tensors: Python state (python_state.py), Python's RNG
(rng_state.py); what the process imported and its seconds and peak memory are recorded
by precompile_build.process (imported.py, stats.py). Gives a ``Traced`` call to an engine (precompile_build.engines).
"""
