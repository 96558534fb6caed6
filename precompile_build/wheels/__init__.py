"""Packaging: the pairs of a build into a wheel, and the commands that read wheels.

Takes the builder's ``CaptureResult`` per target. manifest.py assembles `_precompiled/`
(manifest.json and the pairs; builder/arch_report.py says what a CUDA variant records of
its architectures); rewrite.py puts it into setuptools' wheel with the torch pin and
precompile-runtime in `Requires-Dist` and the platform tag of platform_tags.py;
sdist.py makes the sdist carry the capture scripts and no artifacts. The CLI's
``merge`` (merge.py) combines wheels built on different hosts, ``inspect``
(inspect_cmd.py) describes a wheel's variants and whether this host matches.
"""
