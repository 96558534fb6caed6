"""What changed since a capture recorded its imports, asked in the capture's import
context (builder/script.py: imports_changes starts it as ``python check_imports.py``
with the script's environment, the project root as working directory).

Reads ``{"module": process/imported.py's file, "script_dir", "root", "record"}`` as JSON
on stdin, puts the script's folder first on ``sys.path`` (as the capture had it), runs
imported.py alone (no package import: the capture's import context stays as it was) and
prints its ``changes()``'s list as JSON.
"""

import json
import runpy
import sys


def main() -> None:
    req = json.load(sys.stdin)
    sys.path[0] = req["script_dir"]
    ns = runpy.run_path(req["module"], run_name="precompile_imports_check")
    print(json.dumps(ns["changes"](req["record"], req["root"])))


if __name__ == "__main__":
    main()
