"""Checked-hash pycs (PEP 552) of source halves (wheels/bytecode.py: shipped_bytecode
starts it as ``python -I compile_pycs.py JOBS`` in a fresh isolated interpreter, so that
the bytes depend only on the source and the Python). ``JOBS``: a JSON list of
``[source, pyc, name]``; ``name`` is what the pyc records as its source file."""

import json
import py_compile
import sys


def main() -> None:
    for source, pyc, name in json.loads(sys.argv[1]):
        py_compile.compile(
            source,
            cfile=pyc,
            dfile=name,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )


if __name__ == "__main__":
    main()
