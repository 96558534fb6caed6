"""``python -m precompile_build``: capture, inspect, merge, clean.

Exit status: 0 ok, 2 usage or configuration error, 1 any other failure; errors are
one ``error: ...`` line on stderr, without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from .builder.workdir import build_tempdir
from .errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m precompile_build", description="Precompiled PyTorch artifacts in wheels."
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="run capture scripts without building a wheel")
    c.add_argument("--project", default=".", help="project root (default: .)")
    c.add_argument("--targets", help="comma-separated targets (default: all)")
    c.add_argument("--out", help="output directory (default: PROJECT/build/precompiled)")
    c.add_argument("-v", "--verbose", action="store_true", help="stream script output")
    i = sub.add_parser("inspect", help="describe artifacts and whether this host matches")
    i.add_argument(
        "where",
        metavar="WHEEL_OR_DIR",
        help="a wheel, a directory with manifest.json, or an installed package",
    )
    i.add_argument("--json", action="store_true", help="machine-readable output")
    m = sub.add_parser("merge", help="combine wheels built on different hosts")
    m.add_argument("wheels", nargs="+", metavar="WHEEL")
    m.add_argument("-o", "--out", required=True, metavar="OUT_DIR")
    k = sub.add_parser("clean", help="delete the capture cache")
    k.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the cache to delete (default: PRECOMPILE_BUILD_CACHE_DIR, else "
        "`cache-dir` of --project's pyproject.toml, else the per-user cache)",
    )
    k.add_argument("--project", metavar="DIR", help="read `cache-dir` from this project")
    return p


def _capture(args: argparse.Namespace) -> int:
    from .builder.runner import run_captures
    from .config.settings import load_settings, select_targets
    from .wheels.manifest import assemble, write_dir_atomic

    environ = {
        k: v
        for k, v in os.environ.items()  # capture is explicit: never skipped;
        if k not in ("PRECOMPILE_SKIP",)  # --targets wins over PRECOMPILE_TARGETS
        and not (args.targets is not None and k == "PRECOMPILE_TARGETS")
    }
    settings = load_settings(args.project, {}, environ)
    if args.targets is not None:  # its errors name the flag, not a config setting
        settings = dataclasses.replace(
            settings, selected=select_targets(settings.targets, args.targets, "--targets")
        )
    out = Path(args.out) if args.out else settings.root / "build" / "precompiled"
    with build_tempdir() as tmp:
        results = run_captures(settings, Path(tmp), verbose=args.verbose or None)
        write_dir_atomic(out, assemble(settings.package, results))
    print(f"wrote {out}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .wheels.inspect_cmd import format_report, inspect_report

    report = inspect_report(args.where)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .wheels.merge import merge_wheels

    print(merge_wheels(args.wheels, args.out))
    return 0


def _clean(args: argparse.Namespace) -> int:
    from .builder.capture_cache import clean
    from .config.settings import default_cache_dir, load_settings, resolve_cache_dir

    # the directory the build uses: --cache-dir, else the project's settings (which
    # include PRECOMPILE_BUILD_CACHE_DIR, relative to the project root), else that
    # variable relative to here, else the per-user default
    if args.cache_dir:
        root = resolve_cache_dir(args.cache_dir, Path.cwd())
    elif args.project:
        root = load_settings(args.project).cache_dir or default_cache_dir()
    elif os.environ.get("PRECOMPILE_BUILD_CACHE_DIR"):
        root = resolve_cache_dir(os.environ["PRECOMPILE_BUILD_CACHE_DIR"], Path.cwd())
    else:
        root = default_cache_dir()
    n = clean(root.absolute())
    print(f"removed {n} capture cache entr{'y' if n == 1 else 'ies'} from {root}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        return {"capture": _capture, "inspect": _inspect, "merge": _merge, "clean": _clean}[
            args.command
        ](args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - one line, no traceback
        msg = str(e).strip() or type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 1
