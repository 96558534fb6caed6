"""Issue 55 items 2-3: a real library's own sdist, timm 1.0.31 (pdm-backend), given a
target the way docs/existing-library.md says (its backend wrapped, a capture script of
`VisionTransformer.forward` on timm's tiny `test_vit` with random weights, the method
routed through the pair with `precompile_runtime.packaged`), built with ``python -m
build --no-isolation``, installed into a fresh virtual environment and served: timm's
own API (``model(images)``) by the pair under ``PRECOMPILE_NO_COMPILE=1``,
equal to timm's code; another structure and another batch size by timm's code.

Runs where timm 1.0.31 and torchvision are installed (the torch 2.14.1 run of
scripts/test.sh) and the sdist can be downloaded (``pip download``); skipped
otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from _build_helpers import dist_links

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("build_env")]
REPO = Path(__file__).resolve().parents[1]
VERSION = "1.0.31"

_TOML = """
[tool.precompile]
backend = "pdm.backend"
package = "timm"

[tool.precompile.targets.test_vit]
script = "captures/test_vit.py"
device = "cpu"
timeout = 900
"""
_CAPTURE = """import torch

import precompile_build
import timm
from timm.models.vision_transformer import VisionTransformer

model = timm.create_model("test_vit", pretrained=False).eval()
images = torch.randn(2, *model.default_cfg["input_size"])
with torch.no_grad(), precompile_build.capture(VisionTransformer.forward) as f:
    f(model, images)
"""
_ROUTING = """
try:  # calls served by the wheel's precompiled pair where one serves this host and call
    from precompile_runtime import packaged
except ImportError:  # precompile-runtime not installed: the code as written
    def packaged(name, **kwargs):
        return lambda fn: fn
"""
_SERVE = """import sys, torch, timm
from timm.models.vision_transformer import VisionTransformer
assert timm.__file__.startswith(sys.prefix), timm.__file__
own = VisionTransformer.forward.__wrapped__
model = timm.create_model("test_vit", pretrained=False).eval()
images = torch.randn(2, *model.default_cfg["input_size"])
with torch.no_grad():
    eager = own(model, images)
    before = set(sys.modules)
    served = model(images)
    compiler = [n for n in set(sys.modules) - before if n.startswith(("torch._inductor", "torch._dynamo", "triton"))]
    other = timm.create_model("test_vit2", pretrained=False).eval()
    x2 = torch.randn(2, *other.default_cfg["input_size"])
    assert torch.equal(other(x2), own(other, x2))
    three = torch.randn(3, *model.default_cfg["input_size"])
    assert torch.equal(model(three), own(model, three))
assert torch.allclose(served, eager, rtol=1e-4, atol=1e-5), (served - eager).abs().max()
route = VisionTransformer.forward.route
print("route", route.served, route.fallback, compiler)
"""


def _sdist(tmp: Path) -> Path:
    pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    if timm.__version__ != VERSION:
        pytest.skip(f"timm {timm.__version__} installed, the recipe is for {VERSION}")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                          f"timm=={VERSION}", "-d", str(tmp)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"timm's sdist cannot be downloaded here: {got.stderr[-300:]}")
    with tarfile.open(next(tmp.glob("timm-*.tar.gz"))) as tf:
        tf.extractall(tmp, filter="data")
    return tmp / f"timm-{VERSION}"


def test_timm_from_its_own_sdist_builds_and_serves_its_api_through_the_pair(tmp_path):
    pytest.importorskip("pdm.backend")
    src = _sdist(tmp_path / "sdist")
    py = src / "pyproject.toml"
    text = py.read_text()
    assert 'build-backend = "pdm.backend"' in text
    text = text.replace('build-backend = "pdm.backend"', 'build-backend = "precompile_build.backend"', 1)
    text = text.replace('    "safetensors",\n]', '    "safetensors",\n    "precompile-runtime",\n]', 1)
    py.write_text(text + _TOML)
    (src / "captures").mkdir()
    (src / "captures" / "test_vit.py").write_text(_CAPTURE)
    vit = src / "timm" / "models" / "vision_transformer.py"
    code = vit.read_text()
    code = code.replace("from torch.jit import Final\n", "from torch.jit import Final\n" + _ROUTING, 1)
    method = ("    def forward(\n            self,\n            x: torch.Tensor,\n"
              "            attn_mask: Optional[torch.Tensor] = None,\n            is_causal: bool = False,\n"
              "    ) -> torch.Tensor:\n        x = self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal)\n")
    assert code.count(method) == 1  # VisionTransformer.forward
    code = code.replace(method, '    @packaged("test_vit", package="timm")\n' + method)
    vit.write_text(code)

    env = {k: v for k, v in os.environ.items() if k not in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    build = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--wheel",
                            "--outdir", str(tmp_path / "dist"), str(src)], env=env, capture_output=True, text=True,
                           timeout=1200)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    (whl,) = (tmp_path / "dist").glob("timm-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert sorted(n for n in names if "_precompiled" in n) == sorted(
        f"timm/_precompiled/{n}" for n in ("manifest.json", "test_vit.cache", "test_vit.py",
                                           f"test_vit.{sys.implementation.cache_tag}.pyc"))
    assert len([n for n in names if n.startswith(("timm/data/_info/", "timm/models/_pruned/"))]) >= 25  # pdm's data
    assert "-none-any" not in whl.name
    meta = zipfile.ZipFile(whl).read(f"timm-{VERSION}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if r.startswith("precompile-runtime")]
    assert len(runtime) == 1, requires  # once: timm's edited dependencies name it too
    torch_pins = [r for r in requires if r.replace(" ", "").startswith(("torch=", "torch>", "torch<", "torch~"))]
    assert len(torch_pins) == 1 and torch.__version__.split("+")[0].rsplit(".", 1)[0] in torch_pins[0], requires
    assert all(r in requires for r in ("pyyaml", "huggingface_hub", "safetensors")), requires  # timm's own, kept

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    links = dist_links(tmp_path / "links", ["torch", "torchvision", "pyyaml", "huggingface_hub", "safetensors"])
    Path(site, "links.pth").write_text(f"{links}\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "rt"), str(REPO / "runtime")], check=True, capture_output=True)
    plain = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index",
                    str(whl), *map(str, (tmp_path / "rt").glob("*.whl"))], check=True, capture_output=True, env=plain)
    served = subprocess.run([str(vpy), "-c", _SERVE], cwd=tmp_path, capture_output=True, text=True,
                            env=dict(plain, PRECOMPILE_NO_COMPILE="1", PRECOMPILE_CACHE_DIR=str(tmp_path / "kcache")))
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
    # 1 served: the pair loaded (packaged loads it strictly; a load that failed would
    # have warned and served none), 2 by timm's code; no compiler module at load
    assert served.stdout.split()[-4:] == ["route", "1", "2", "[]"], served.stdout
