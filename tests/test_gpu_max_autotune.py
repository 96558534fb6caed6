"""max-autotune on the frozen engine, on CUDA: Inductor's Triton templates
(mm/addmm, conv, flex attention) frozen as cubins with their tuned configs, extern
choices (``bias_addmm``) as plain torch calls, combined with
`cuda-graphs` and `cuda-archs`.

Each pair is served by test_gpu_frozen's child: a fresh process with empty Inductor
and Triton caches and the serving guard on (``PRECOMPILE_NO_COMPILE=1``), which
counts every torch._inductor / torch._dynamo / triton module it executes (none
allowed) and compares with eager on every visible GPU. Where a test narrows
Inductor's choices (``test_configs.autotune_choice_name_regex``) it is to make one
kind of choice win for certain; the block test takes max-autotune whole.
"""

from __future__ import annotations

import re

import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - CI without torch
    torch = None

from test_gpu_frozen import _metadata, _serve

HAVE_CUDA = torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")]

BF16_TOL = (
    1e-1  # |frozen - eager| <= tol + tol * |eager| (bf16: Inductor fuses where eager rounds per op)
)


def block(x, ln_w, ln_b, w_qkv, b_qkv, w_o, b_o, w_1, b_1, w_2, b_2):
    """A GPT block (pre-norm, causal attention, GELU MLP) over weights passed as tensors."""
    B, T, D = x.shape
    heads = D // 64
    h = F.layer_norm(x, (D,), ln_w, ln_b)
    q, k, v = F.linear(h, w_qkv, b_qkv).view(B, T, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(a.transpose(1, 2).reshape(B, T, D), w_o, b_o)
    return x + F.linear(F.gelu(F.linear(x, w_1, b_1)), w_2, b_2)


def block_args(B, T, D, dtype=torch.bfloat16 if torch else None):
    torch.manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, device="cuda") / shape[-1] ** 0.5).to(dtype)

    return [
        torch.randn(B, T, D, device="cuda", dtype=dtype),
        torch.ones(D, device="cuda", dtype=dtype),
        torch.zeros(D, device="cuda", dtype=dtype),
        w(3 * D, D),
        w(3 * D),
        w(D, D),
        w(D),
        w(4 * D, D),
        w(4 * D),
        w(D, 4 * D),
        w(D),
    ]


def capture(tmp_path, name, fn, args, **options):
    """``fn(*args)`` captured with the frozen engine and ``options``; returns
    ``(source, cache, metadata, eager result)``."""
    import precompile_build

    source, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with precompile_build.capture(
        fn, artifact_path=source, cache_path=cache, engine="frozen", target=name, options=options
    ) as f:
        f(*args)
    with torch.no_grad():
        want = fn(*args)
    text = source.read_text()
    wrapper = text[text.index("def _make_call(") : text.index("    return call\n")]
    assert "torch._inductor" not in wrapper and "async_compile" not in wrapper
    return source, cache, _metadata(text), want


def serve(tmp_path, name, source, cache, args, want, tol=BF16_TOL):
    return _serve(
        tmp_path,
        "args",
        source,
        cache,
        {"args": [a.cpu() for a in args], "out": want.cpu(), "tol": tol},
    )


def templates(meta):
    return [
        k for k in meta["kernels"] if k["kind"] == "triton" and k["name"].startswith("triton_tem")
    ]


def test_a_gpt_block_under_max_autotune_is_served_without_the_compiler(tmp_path):
    """The issue's GPT block shape (bf16, 8x512x1024), max-autotune as torch.compile's:
    whatever Inductor picks (templates, bias_addmm, cuBLAS), the pair serves it."""
    args = block_args(8, 512, 1024)
    source, cache, meta, want = capture(tmp_path, "gpt_block", block, args, mode="max-autotune")
    called = sorted(set(re.findall(r"extern_kernels\.(\w+)\(", source.read_text())))
    print("templates:", [k["name"] for k in templates(meta)], "extern kernels:", called)
    serve(tmp_path, "gpt_block", source, cache, args, want)


def test_triton_templates_freeze_with_their_tuned_configs_and_replay_in_cuda_graphs(tmp_path):
    """Only Triton template choices left: every matrix product is a template kernel
    (its grid passed as launcher arguments), served, in CUDA graphs too."""
    args = block_args(4, 128, 256)
    source, cache, meta, want = capture(
        tmp_path,
        "tem",
        block,
        args,
        mode="max-autotune",
        cuda_graphs=True,
        inductor={"test_configs.autotune_choice_name_regex": "^triton_"},
    )
    tem = templates(meta)
    assert len(tem) >= 4, [k["name"] for k in meta["kernels"]]  # qkv, out, fc1, fc2
    for k in tem:
        assert "_grid_0" in k["launcher"] and k["config"], k
    assert (
        meta["cuda_graphs"] is True
        and "extern_kernels." not in source.read_text().split("def call(")[-1]
    )
    serve(tmp_path, "tem", source, cache, args, want)


def test_templates_with_cuda_archs_reuse_the_build_gpus_choices(tmp_path):
    """`cuda-archs`: the template configs tuned here are compiled for the other GPUs
    (or the architecture is left out, with its reason); this GPU serves its own."""
    args = block_args(2, 64, 128)
    source, cache, meta, want = capture(
        tmp_path,
        "tem_archs",
        block,
        args,
        mode="max-autotune",
        cuda_archs=["8.0", "9.0"],
        inductor={"test_configs.autotune_choice_name_regex": "^triton_"},
    )
    report = meta["cuda_archs"]
    print("cuda_archs:", report)
    assert templates(meta)
    for k in templates(meta):
        sms = {c["sm"] for c in k.get("archs", [])}
        assert "sm_90a" in sms or "9.0" in str(report.get("left_out", {})), (k["name"], sms)
        assert "sm_80" in sms or "8.0" in str(report.get("left_out", {})), (k["name"], sms, report)
    serve(tmp_path, "tem_archs", source, cache, args, want)


def addmm_relu(x, w, b):
    # a 2-D bias of stride 0: Inductor's addmm choices include `bias_addmm` (kernel/mm.py)
    return torch.relu(torch.addmm(b.expand(x.shape[0], -1), x, w.t()))


def test_bias_addmm_is_a_plain_torch_call(tmp_path):
    """The choice the issue's capture failed on, on CUDA: copied into the source half."""
    torch.manual_seed(0)
    args = [
        torch.randn(64, 256, device="cuda", dtype=torch.bfloat16),
        torch.randn(128, 256, device="cuda", dtype=torch.bfloat16) / 16,
        torch.randn(128, device="cuda", dtype=torch.bfloat16),
    ]
    source, cache, meta, want = capture(
        tmp_path,
        "bias_addmm",
        addmm_relu,
        args,
        mode="max-autotune",
        inductor={"test_configs.autotune_choice_name_regex": "bias_addmm"},
    )
    text = source.read_text()
    assert "extern_kernels.bias_addmm(" in text and "def _extern_bias_addmm(" in text
    serve(tmp_path, "bias_addmm", source, cache, args, want)


def convs(x, w3, w1):
    return F.conv2d(F.relu(F.conv2d(x, w3, padding=1)), w1)


def test_convolutions_as_templates(tmp_path):
    """A 3x3 convolution as Inductor's Triton conv template, a 1x1 one (channels-last:
    Inductor makes it a matrix product) as its mm template."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 16, 16, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last
    )
    args = [
        x,
        torch.randn(64, 32, 3, 3, device="cuda", dtype=torch.bfloat16) / 17,
        torch.randn(32, 64, 1, 1, device="cuda", dtype=torch.bfloat16) / 8,
    ]
    source, cache, meta, want = capture(
        tmp_path,
        "conv",
        convs,
        args,
        mode="max-autotune",
        inductor={"test_configs.autotune_choice_name_regex": "^triton_"},
    )
    print("kernels:", [k["name"] for k in meta["kernels"]])
    assert len(templates(meta)) >= 2
    serve(tmp_path, "conv", source, cache, args, want)


def test_flex_attention_template(tmp_path):
    """flex_attention is a Triton template whatever the mode; max-autotune tunes its
    block sizes: frozen with them."""
    from torch.nn.attention.flex_attention import flex_attention

    def attend(q, k, v):
        return flex_attention(
            q, k, v, score_mod=lambda s, b, h, qi, kv: torch.where(qi >= kv, s, -float("inf"))
        )

    torch.manual_seed(0)
    args = [torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    source, cache, meta, want = capture(tmp_path, "flex", attend, args, mode="max-autotune")
    assert templates(meta), [k["name"] for k in meta["kernels"]]
    serve(tmp_path, "flex", source, cache, args, want)
