"""Capture: one real call of the user's function, traced into a flat ATen graph.

Runs inside the capture script's process. Takes the function and its example
arguments (api.py: ``precompile_build.capture``). Flattens arguments and results with
torch's pytree (pytree_io.py), lifts the models' parameters and buffers (tracing.py;
aliases.py, sharing.py, layouts.py, graph_attrs.py), traces with torch.export or make_fx
(tracers.py, aten_export.py; dynamic dims: dynamic_dims.py; collectives.py), and watches
what the call does besides tensors: Python state (python_state.py), Python's RNG
(rng_state.py), what the process imported (imported.py), its seconds and peak memory
(stats.py). Gives a ``Traced`` call to an engine (precompile_build.engines).
"""
