"""The serving guard: with PRECOMPILE_NO_COMPILE=1 or inside no_compilation(),
compile entry points raise ServingCompileError; outside, they work as usual."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import precompile_runtime
from precompile_runtime import ServingCompileError, no_compilation

RUNTIME = str(Path(__file__).resolve().parents[1] / "runtime")


def _run(code: str, tmp_path: Path, **env: str) -> str:
    script = tmp_path / "guard_child.py"
    script.write_text(f"import sys\nsys.path.insert(0, {RUNTIME!r})\n" + textwrap.dedent(code))
    full = {k: v for k, v in os.environ.items() if k != "PRECOMPILE_NO_COMPILE"}
    full.update(env)
    res = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=full, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_no_compilation_blocks_torch_compile(monkeypatch):
    monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    torch = pytest.importorskip("torch")

    def fn(x):
        return x.sin() + 1

    x = torch.ones(3)
    assert not precompile_runtime.guard_active()
    with no_compilation():
        assert precompile_runtime.guard_active()
        with pytest.raises(ServingCompileError, match="serving guard"):
            torch.compile(fn)(x)
        with pytest.raises(ServingCompileError):
            torch._dynamo.optimize("eager")(fn)
    assert not precompile_runtime.guard_active()
    # off again: compiling works (eager backend: no C compiler needed)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, backend="eager")(x), fn(x))


def test_env_var_guard_patches_modules_imported_later(tmp_path):
    out = _run(
        """
        import precompile_runtime            # before torch: arms the import hook
        from precompile_runtime import ServingCompileError
        import torch

        def check(label, call):
            try:
                call()
            except ServingCompileError:
                print(label, "blocked")
            except Exception as e:
                # dynamo may wrap a backend's error; the guard's error must be the cause
                cause = e
                while cause is not None and not isinstance(cause, ServingCompileError):
                    cause = cause.__cause__ or cause.__context__
                print(label, "blocked" if cause is not None else f"other {type(e).__name__}: {e}")
            else:
                print(label, "ran")

        x = torch.ones(3)
        check("compile", lambda: torch.compile(lambda t: t + 1)(x))
        import torch._inductor.compile_fx as cfx
        check("compile_fx", lambda: cfx.compile_fx(None, []))
        check("compile_fx_inner", lambda: cfx.compile_fx_inner(None, []))
        import torch.utils.cpp_extension as ce
        check("load_inline", lambda: ce.load_inline("x", cpp_sources=""))
        check("load", lambda: ce.load("x", sources=[]))
        import subprocess, sys
        print("child", subprocess.run([sys.executable, "-c",
              "import os; print(os.environ.get('PRECOMPILE_NO_COMPILE'))"],
              capture_output=True, text=True).stdout.strip())
        """,
        tmp_path,
        PRECOMPILE_NO_COMPILE="1",
    )
    lines = out.split("\n")
    for label in ("compile", "compile_fx", "compile_fx_inner", "load_inline", "load"):
        assert f"{label} blocked" in lines, out
    assert "child 1" in lines


def test_env_var_guard_when_torch_imported_first(tmp_path):
    out = _run(
        """
        import torch
        import torch._inductor.compile_fx as cfx
        import precompile_runtime
        from precompile_runtime import ServingCompileError
        for label, call in [("compile", lambda: torch.compile(lambda t: t)),
                            ("compile_fx", lambda: cfx.compile_fx(None, []))]:
            try:
                call()
                print(label, "ran")
            except ServingCompileError:
                print(label, "blocked")
        """,
        tmp_path,
        PRECOMPILE_NO_COMPILE="1",
    )
    assert out.split() == ["compile", "blocked", "compile_fx", "blocked"]


def test_triton_compile_patched_on_import(tmp_path):
    # a stand-in triton package (the CPU test venv has no triton)
    fake = tmp_path / "fake_site" / "triton"
    (fake / "compiler").mkdir(parents=True)
    (fake / "__init__.py").write_text("from .compiler import compile\n")
    (fake / "compiler" / "__init__.py").write_text("from .compiler import compile\n")
    (fake / "compiler" / "compiler.py").write_text(
        "def compile(src, target=None):\n    return 'cubin'\n"
    )
    out = _run(
        f"""
        sys.path.insert(0, {str(fake.parent)!r})
        import precompile_runtime
        from precompile_runtime import ServingCompileError, no_compilation
        with no_compilation():
            import triton
            import triton.compiler.compiler as tcc
            for label, fn in [("triton.compile", triton.compile),
                              ("triton.compiler.compile", triton.compiler.compile),
                              ("triton.compiler.compiler.compile", tcc.compile)]:
                try:
                    fn("src")
                    print(label, "ran")
                except ServingCompileError:
                    print(label, "blocked")
        print("after", triton.compile("src"), tcc.compile("src"))
        """,
        tmp_path,
    )
    assert out.splitlines() == [
        "triton.compile blocked",
        "triton.compiler.compile blocked",
        "triton.compiler.compiler.compile blocked",
        "after cubin cubin",
    ]
