"""Serving templates: the code copied into every frozen or eager source half.

Only what a pair carries lives here; engines/codegen.py assembles a source half from
these files, less each one's stand-ins block (source_names.py: typed stand-ins for the
names the other blocks and the generated parts define, for linters and mypy). In the
order they are copied: kernel_loader.py (binds frozen kernels from the cache),
triton_launcher.py (CUDA kernels, after the runtime's _arch_rules.py),
module_settings.py (the models' settings a call is checked against), pytree_types.py
(transformers' caches registered with pytree), state_values.py (how plain values and
hooks are recorded), call_args.py (arguments and results through pytree, the alias
checks), op_libraries.py (imports the libraries whose custom ops the graph calls),
driver.py (``load(kernels)``: the served callable), assumed_state.py (the Python state
the trace assumed, checked per call), cuda_graphs.py (frozen CUDA targets: graph
capture and replay). A pair imports torch
and the standard library only (precompile_runtime where installed); so do these.
The capture side reuses module_settings.py, pytree_types.py and state_values.py.
"""
