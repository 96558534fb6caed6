"""A real library's own sdist, timm 1.0.31 (pdm-backend), given a
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


ST_VERSION = "6.0.1"
_ST_TOML = """
[tool.precompile]
package = "sentence_transformers"

[tool.precompile.targets.tiny_encode]
script = "captures/tiny_encode.py"
device = "cpu"
timeout = 900
"""
_ST_TINY = """import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from sentence_transformers import SentenceTransformer, models

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "a", "cat", "sat", "on", "mat"]


def tiny(folder, seed):
    \"\"\"A one-layer BERT sentence encoder with random weights, saved to and read from ``folder``.\"\"\"
    Path(folder, "vocab.txt").write_text("\\n".join(WORDS) + "\\n")
    BertTokenizerFast(vocab_file=str(Path(folder, "vocab.txt"))).save_pretrained(folder)
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(folder)
    return SentenceTransformer(modules=[models.Transformer(folder), models.Pooling(16)], device="cpu").eval()
"""
_ST_CAPTURE = """import tempfile

import torch

import precompile_build
from sentence_transformers import SentenceTransformer
from tiny import tiny

with tempfile.TemporaryDirectory() as folder:
    model = tiny(folder, seed=0)
    features = dict(model.preprocess(["hello world", "a cat sat"]))
    with torch.no_grad(), precompile_build.capture(SentenceTransformer._modules_pass) as f:
        f(model, features)
"""
_ST_ROUTE = """
    def forward(self, input: dict[str, Tensor], **kwargs) -> dict[str, Tensor]:
        \"\"\"The modules' pass, through the wheel's precompiled pair where one serves.\"\"\"
        return self._modules_pass(dict(input)) if not kwargs else super().forward(input, **kwargs)

    @packaged("tiny_encode", package="sentence_transformers")
    def _modules_pass(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        return BaseModel.forward(self, dict(features))  # (a copy: the modules add their outputs to it)

"""
_ST_SERVE = """import sys, tempfile, torch
sys.path.insert(0, sys.argv[1])
import sentence_transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.model import BaseModel
from tiny import tiny
assert sentence_transformers.__file__.startswith(sys.prefix), sentence_transformers.__file__
with tempfile.TemporaryDirectory() as folder:
    model = tiny(folder, seed=1)
    before = set(sys.modules)
    served = model.encode(["hello world", "a cat sat"], convert_to_tensor=True)
    compiler = [n for n in set(sys.modules) - before if n.startswith(("torch._inductor", "torch._dynamo", "triton"))]
    with torch.no_grad():
        own = BaseModel.forward(model, dict(model.preprocess(["hello world", "a cat sat"])))["sentence_embedding"]
        longer = model.encode(["a cat sat on a mat"], convert_to_tensor=True)
        own_longer = BaseModel.forward(model, dict(model.preprocess(["a cat sat on a mat"])))["sentence_embedding"]
assert torch.allclose(served, own, rtol=1e-4, atol=1e-5), (served - own).abs().max()
assert torch.equal(longer, own_longer)
route = SentenceTransformer._modules_pass.route
print("route", route.served, route.fallback, compiler)
"""


def _sdist(tmp: Path, dist: str, module: str, version: str) -> Path:
    """The unpacked sdist of ``dist==version`` (``pip download``); skips where ``module``
    is another version here (the recipe's edits are for ``version``) or the sdist cannot
    be downloaded."""
    installed = pytest.importorskip(module)
    if installed.__version__ != version:
        pytest.skip(f"{dist} {installed.__version__} installed, the recipe is for {version}")
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-binary",
            ":all:",
            "--no-deps",
            f"{dist}=={version}",
            "-d",
            str(tmp),
        ],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        pytest.skip(f"{dist}'s sdist cannot be downloaded here: {got.stderr[-300:]}")
    with tarfile.open(next(tmp.glob("*.tar.gz"))) as tf:
        tf.extractall(tmp, filter="data")
    return next(p for p in tmp.iterdir() if p.is_dir())


def _build(src: Path, tmp_path: Path) -> tuple[Path, dict]:
    """The wheel ``python -m build --no-isolation`` makes of ``src`` with this
    repository's backend and runtime importable, and the environment it ran with."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER")
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(tmp_path / "dist"),
            str(src),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    (whl,) = (tmp_path / "dist").glob("*.whl")
    return whl, env


def _requires(whl: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` values."""
    zf = zipfile.ZipFile(whl)
    meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def _assert_pinned(requires: list[str], own: tuple[str, ...]) -> None:
    """precompile-runtime once, one torch pin of this torch's release, the library's own
    requirements kept."""
    assert len([r for r in requires if r.startswith("precompile-runtime")]) == 1, requires
    torch_pins = [
        r
        for r in requires
        if r.replace(" ", "").startswith(("torch=", "torch>", "torch<", "torch~"))
    ]
    assert (
        len(torch_pins) == 1 and torch.__version__.split("+")[0].rsplit(".", 1)[0] in torch_pins[0]
    ), requires
    assert all(any(r.startswith(o) for r in requires) for o in own), requires


def _install_and_serve(tmp_path: Path, whl: Path, env: dict, deps: list[str], serve: str) -> str:
    """Install ``whl`` and this repository's runtime into a fresh virtual environment that
    sees ``deps`` (and what they require) as installed here; run ``serve`` there under
    ``PRECOMPILE_NO_COMPILE=1``; return its stdout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    links = dist_links(tmp_path / "links", deps)
    Path(site, "links.pth").write_text(f"{links}\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "rt"),
            str(REPO / "runtime"),
        ],
        check=True,
        capture_output=True,
    )
    plain = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(whl),
            *map(str, (tmp_path / "rt").glob("*.whl")),
        ],
        check=True,
        capture_output=True,
        env=plain,
    )
    served = subprocess.run(
        [str(vpy), "-c", serve],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(plain, PRECOMPILE_NO_COMPILE="1", PRECOMPILE_CACHE_DIR=str(tmp_path / "kcache")),
    )
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
    return served.stdout


def _add_targets(
    src: Path, backend: str, last_dependency: str, toml: str, captures: dict[str, str]
) -> None:
    """Step 1-3 of docs/existing-library.md on an unpacked sdist: the build backend
    wrapped, precompile-runtime added after ``last_dependency`` in
    ``project.dependencies``, the ``[tool.precompile]`` table ``toml`` and the capture
    scripts ``captures`` (file name -> text) in ``captures/``."""
    py = src / "pyproject.toml"
    text = py.read_text()
    was, dep = f'build-backend = "{backend}"', f"    {last_dependency},\n]"
    assert text.count(was) == 1 and text.count(dep) == 1, (
        "the recipe's edits are for another version"
    )
    text = text.replace(was, 'build-backend = "precompile_build.backend"')
    text = text.replace(dep, f'    {last_dependency},\n    "precompile-runtime",\n]')
    py.write_text(text + toml)
    (src / "captures").mkdir()
    for name, code in captures.items():
        (src / "captures" / name).write_text(code)


def test_timm_from_its_own_sdist_builds_and_serves_its_api_through_the_pair(tmp_path):
    pytest.importorskip("pdm.backend")
    pytest.importorskip("torchvision")
    src = _sdist(tmp_path / "sdist", "timm", "timm", VERSION)
    _add_targets(src, "pdm.backend", '"safetensors"', _TOML, {"test_vit.py": _CAPTURE})
    vit = src / "timm" / "models" / "vision_transformer.py"
    code = vit.read_text()
    code = code.replace(
        "from torch.jit import Final\n", "from torch.jit import Final\n" + _ROUTING, 1
    )
    method = (
        "    def forward(\n            self,\n            x: torch.Tensor,\n"
        "            attn_mask: Optional[torch.Tensor] = None,\n            is_causal: bool = False,\n"
        "    ) -> torch.Tensor:\n        x = self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal)\n"
    )
    assert code.count(method) == 1  # VisionTransformer.forward
    code = code.replace(method, '    @packaged("test_vit", package="timm")\n' + method)
    vit.write_text(code)

    whl, env = _build(src, tmp_path)
    names = zipfile.ZipFile(whl).namelist()
    assert sorted(n for n in names if "_precompiled" in n) == sorted(
        f"timm/_precompiled/{n}"
        for n in (
            "manifest.json",
            "test_vit.cache",
            "test_vit.py",
            f"test_vit.{sys.implementation.cache_tag}.pyc",
        )
    )
    assert (
        len([n for n in names if n.startswith(("timm/data/_info/", "timm/models/_pruned/"))]) >= 25
    )  # pdm's data
    assert "-none-any" not in whl.name
    _assert_pinned(_requires(whl), ("pyyaml", "huggingface_hub", "safetensors"))
    out = _install_and_serve(
        tmp_path,
        whl,
        env,
        ["torch", "torchvision", "pyyaml", "huggingface_hub", "safetensors"],
        _SERVE,
    )
    # 1 served: the pair loaded (packaged loads it strictly; a load that failed would
    # have warned and served none), 2 by timm's code; no compiler module at load
    assert out.split()[-4:] == ["route", "1", "2", "[]"], out


def test_sentence_transformers_from_its_own_sdist_serves_encode_through_the_pair(tmp_path):
    """A setuptools library (the default wrapped backend): sentence-transformers 6.0.1's
    sdist given a target, its ``encode()`` served by the pair through the modules' pass
    the recipe routes (a copy of the features dict: the modules add keys to it)."""
    src = _sdist(tmp_path / "sdist", "sentence-transformers", "sentence_transformers", ST_VERSION)
    _add_targets(
        src,
        "setuptools.build_meta",
        '"tqdm>=4.0.0"',
        _ST_TOML,
        {"tiny.py": _ST_TINY, "tiny_encode.py": _ST_CAPTURE},
    )
    model_py = src / "sentence_transformers" / "sentence_transformer" / "model.py"
    code = model_py.read_text()
    head = "from .model_card import SentenceTransformerModelCardData\n"
    assert code.count(head) == 1 and code.count("    def is_singular_input(") == 1
    code = code.replace(head, head + _ROUTING, 1)
    code = code.replace(
        "    def is_singular_input(", _ST_ROUTE.lstrip("\n") + "    def is_singular_input(", 1
    )
    model_py.write_text(code)

    whl, env = _build(src, tmp_path)
    names = zipfile.ZipFile(whl).namelist()
    assert sorted(n for n in names if "_precompiled" in n) == sorted(
        f"sentence_transformers/_precompiled/{n}"
        for n in (
            "manifest.json",
            "tiny_encode.cache",
            "tiny_encode.py",
            f"tiny_encode.{sys.implementation.cache_tag}.pyc",
        )
    )
    assert any(n.endswith("model_card_template.md") for n in names)  # setuptools' package data
    assert not any(n.startswith("captures/") for n in names)
    assert "-none-any" not in whl.name
    _assert_pinned(_requires(whl), ("transformers", "tokenizers", "scikit-learn"))
    out = _install_and_serve(
        tmp_path,
        whl,
        env,
        [
            "torch",
            "transformers",
            "tokenizers",
            "huggingface_hub",
            "numpy",
            "scikit-learn",
            "scipy",
            "typing_extensions",
            "tqdm",
        ],
        _ST_SERVE.replace("sys.argv[1]", repr(str(src / "captures"))),
    )
    # encode() of the captured shape served by the pair, the longer sentence by the
    # library's code (another sequence length: the pair's check declines it quietly)
    assert out.split()[-4:] == ["route", "1", "1", "[]"], out
