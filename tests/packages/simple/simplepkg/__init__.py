"""A fixture library: nothing but a package that receives `_precompiled/`."""
