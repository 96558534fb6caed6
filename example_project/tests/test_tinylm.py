"""Eager-only tests of the tinylm model, tokenizer and demo logic (no artifacts)."""

import pytest
import torch

import tinylm
from tinylm import demo, kernels, steps
from tinylm.model import TinyLMConfig


@pytest.fixture
def batch():
    return tinylm.example_batch("cpu")


def test_logits_shape_and_dtype(batch):
    ids, _ = batch
    logits = tinylm.build_model(0)(ids)
    assert ids.shape == (2, 32) and ids.dtype == torch.long
    assert logits.shape == (2, 32, 256) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_example_batch_targets_are_shifted_ids():
    ids, targets = tinylm.example_batch("cpu", batch=3, seq=16)
    assert ids.shape == targets.shape == (3, 16)
    flat = tinylm.encode(tinylm.DEMO_TEXT)
    for row in range(3):
        assert torch.equal(ids[row], flat[row * 16 : row * 16 + 16])
        assert torch.equal(targets[row], flat[row * 16 + 1 : row * 16 + 17])
    with pytest.raises(ValueError, match="DEMO_TEXT"):
        tinylm.example_batch("cpu", batch=100, seq=64)


def test_build_model_is_deterministic():
    a, b = tinylm.build_model(0), tinylm.build_model(0)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    c = tinylm.build_model(1)
    assert not torch.equal(sa["tok_emb.weight"], c.state_dict()["tok_emb.weight"])


def test_build_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tinylm.build_model(0)
    assert torch.equal(torch.rand(3), expected)


def test_causal_mask(batch):
    ids, _ = batch
    model = tinylm.build_model(0)
    changed = ids.clone()
    changed[:, 20:] = (changed[:, 20:] + 7) % 256
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_output_head_is_tied_to_token_embedding(batch):
    ids, _ = batch
    model = tinylm.build_model(0)
    names = [n for n, _ in model.named_parameters()]
    assert not any("head" in n for n in names)
    # logits are exactly the final hidden state times the embedding matrix
    with torch.no_grad():
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x)
        h = model.norm_f(x)
    torch.testing.assert_close(model(ids).detach(), h @ model.tok_emb.weight.T)
    # and changing the embedding storage changes the head
    with torch.no_grad():
        model.tok_emb.weight[65].zero_()
        assert torch.all(model(ids)[..., 65] == 0)


def test_encode_round_trip():
    for text in (tinylm.DEMO_TEXT, "", "héllo wörld ✓"):
        ids = tinylm.encode(text)
        assert ids.dtype == torch.long and ids.dim() == 1
        assert all(0 <= i < 256 for i in ids.tolist())
        assert tinylm.decode(ids) == text
    assert tinylm.encode("AB").tolist() == [65, 66]


def test_train_step_accumulates_grads(batch):
    ids, targets = batch
    model = tinylm.build_model(0)
    loss = steps.train_step(model, ids, targets)
    assert loss.requires_grad is False and loss.dim() == 0
    # an untrained byte model is close to uniform: loss ~ ln(256)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    steps.train_step(model, ids, targets)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n])


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        TinyLMConfig(d_model=64, n_heads=5)
    with pytest.raises(ValueError, match="max_seq"):
        tinylm.build_model(0)(torch.zeros(1, 65, dtype=torch.long))


def test_fused_rmsnorm_refuses_cpu_tensors():
    x = torch.randn(2, 4, 64)
    with pytest.raises(RuntimeError, match="CUDA"):
        kernels.fused_rmsnorm(x, torch.ones(64))
    ref = kernels.rmsnorm_reference(x, torch.ones(64))
    torch.testing.assert_close(ref.pow(2).mean(-1), torch.ones(2, 4), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not kernels.triton_available(), reason="needs CUDA and triton")
def test_fused_rmsnorm_matches_reference_on_cuda():
    model = tinylm.build_model(0, device="cuda")
    ids, _ = tinylm.example_batch("cuda")
    torch.testing.assert_close(
        steps.triton_rmsnorm(model, ids), steps.triton_rmsnorm_reference(model, ids)
    )


def test_importing_tinylm_does_not_import_triton():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, tinylm, tinylm.kernels, tinylm.demo; assert 'triton' not in sys.modules"
    root = str(Path(tinylm.__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# --- demo logic, with eager functions standing in for loaded artifacts ---------------


def _manifest(*names, device="cpu", status="ok"):
    variant = {"engine": "eager", "device": device, "fingerprint": {}}
    return {"targets": {n: {"status": status, "variants": [variant]} for n in names}}


@pytest.fixture
def host_matches(monkeypatch):
    monkeypatch.setattr(demo, "_mismatches", lambda variant: [])


EAGER = {"forward": steps.forward, "train_step": steps.train_step}


def test_demo_passes_when_artifacts_match_eager(host_matches):
    lines = []
    rc = demo.run_demo(
        _manifest("forward", "train_step"), EAGER.__getitem__, cuda=False, out=lines.append
    )
    assert rc == 0, lines
    assert lines[0].startswith("forward") and "engine=eager" in lines[0] and lines[0].endswith("ok")
    assert lines[1].startswith("train_step") and lines[1].endswith("ok")
    assert lines[2].startswith("triton_rmsnorm") and "skip: needs CUDA" in lines[2]


def test_demo_fails_on_missing_target(host_matches):
    lines = []
    rc = demo.run_demo(_manifest("forward"), EAGER.__getitem__, cuda=False, out=lines.append)
    assert rc == 1
    assert any(line.startswith("train_step") and "MISSING" in line for line in lines)


def test_demo_fails_when_cuda_target_was_left_out_on_a_cuda_host(host_matches):
    m = _manifest("forward", "train_step")
    m["targets"]["triton_rmsnorm"] = {"status": "failed", "reason": "no CUDA", "variants": []}
    lines = []
    rc = demo.run_demo(m, EAGER.__getitem__, cuda=True, out=lines.append)
    assert rc == 1
    assert any(
        "triton_rmsnorm" in line and "MISSING" in line and "no CUDA" in line for line in lines
    )


def test_demo_fails_on_mismatch(host_matches):
    def wrong_train_step(model, ids, targets):
        loss = steps.train_step(model, ids, targets)
        model.tok_emb.weight.grad.add_(1e-2)
        return loss

    loads = {**EAGER, "train_step": wrong_train_step}
    lines = []
    rc = demo.run_demo(
        _manifest("forward", "train_step"), loads.__getitem__, cuda=False, out=lines.append
    )
    assert rc == 1
    assert "MISMATCH" in lines[1] and any("tok_emb.weight.grad" in line for line in lines)


def test_demo_reports_load_errors(host_matches):
    def load(name):
        raise RuntimeError("tampered")

    lines = []
    rc = demo.run_demo(_manifest("forward", "train_step"), load, cuda=False, out=lines.append)
    assert rc == 1 and "ERROR RuntimeError: tampered" in lines[0]


def test_demo_skips_cuda_only_variants_without_cuda(host_matches):
    lines = []
    rc = demo.run_demo(
        _manifest("forward", "train_step", device="cuda"),
        EAGER.__getitem__,
        cuda=False,
        out=lines.append,
    )
    assert rc == 0
    assert "skip: built for cuda only" in lines[0]
