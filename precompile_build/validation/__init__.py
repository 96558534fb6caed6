"""Validation at capture: a pair's frozen kernels judged before the pair is written.

Takes the rendered source half and its kernels, and the traced call
(precompile_build.capturing.tracing). Runs them per case (validate.py), against the
traced graph and a wide (fp64) reference run within the memory the model needs
(reference.py), judged as torch's accuracy checks judge compiled code (numerics.py).
Gives the verdicts recorded in the pair's metadata, or a CaptureError.
"""
