"""The default tolerances on CUDA: a timm efficientnet_b0 training step (fp32, batch 4,
32x32 images) captures with the frozen engine's default tolerances (torch's own:
``same(..., fp64_ref=...)`` with the suites' training tol), where it was refused
for a BatchNorm running_var error 2.4 x eager's; a wrong kernel is still refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

import precompile_build  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402


def _train_step(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def _efficientnet():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("efficientnet_b0", pretrained=False, num_classes=10).cuda().train()


def test_efficientnet_b0_train_step_builds_with_default_settings(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = _efficientnet()
    x, y = torch.randn(4, 3, 32, 32, device="cuda"), torch.randint(0, 10, (4,), device="cuda")
    with precompile_build.capture(
        _train_step,
        engine="frozen",
        target="effnet",
        artifact_path=tmp_path / "e.py",
        cache_path=tmp_path / "e.cache",
    ) as f:
        loss = f(model, x, y)
    assert torch.isfinite(loss) and (tmp_path / "e.py").is_file()
    from precompile_build.builder.pairs import read_source_metadata

    meta = read_source_metadata((tmp_path / "e.py").read_bytes(), what="pair")
    worst = meta["validation"]["cases"][0]["worst"]
    print("efficientnet_b0 worst value:", worst)  # the numbers, for the log
    assert worst["floor"] == pytest.approx(1e-3)  # the training floor: tol 1e-2 / 10


def test_a_wrong_kernel_in_a_cuda_training_step_is_refused(tmp_path, monkeypatch):
    from precompile_build.engines import frozen

    # the frozen wrapper's first gradient 2 % off
    wrong = "\n_call = call\ndef call(args):\n    outs = _call(args)\n    outs[1].mul_(1.02)\n    return outs\n"
    monkeypatch.setattr(
        frozen,
        "_rewrite_wrapper",
        lambda *a, _rewrite=frozen._rewrite_wrapper: _rewrite(*a) + wrong,
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10)
    ).cuda()
    x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    with pytest.raises(
        CaptureError, match=r"value 1 \(gradient of .*\) differs from the traced graph"
    ):
        with precompile_build.capture(
            _train_step,
            engine="frozen",
            target="t",
            artifact_path=tmp_path / "t.py",
            cache_path=tmp_path / "t.cache",
        ) as f:
            f(model, x, y)
