"""Sizes the data decides on CUDA (capturing/unbacked.py): torchvision's nms and a
boolean mask served by the frozen engine's Triton kernels for every count, and CUDA
graphs refused for them, at capture and at load."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _pairs import capture_and_load, pair_paths  # noqa: E402

from precompile_build import CaptureError, capture  # noqa: E402
from precompile_runtime import CallError, no_compilation  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _boxes(n, gen, scores=None):
    xy = torch.rand(n, 2, generator=gen) * 50
    boxes = torch.cat([xy, xy + 5 + torch.rand(n, 2, generator=gen) * 20], 1)
    return boxes.cuda(), (torch.rand(n, generator=gen) if scores is None else scores).cuda()


def _same(got, want):
    return len(got) == len(want) and all(
        g.shape == w.shape and g.device == w.device and torch.allclose(g, w)
        for g, w in zip(got, want)
    )


def test_nms_on_cuda_serves_every_count(tmp_path):
    torchvision = pytest.importorskip("torchvision")

    def post(boxes, scores):
        keep = scores > 0.3
        boxes, scores = boxes[keep], scores[keep]
        kept = torchvision.ops.nms(boxes, scores, 0.5)
        return boxes[kept], scores[kept]

    gen = torch.Generator().manual_seed(0)
    art = capture_and_load(tmp_path / "p", post, *_boxes(64, gen))
    assert art.uses_kernels and art.metadata["data_dependent"]["symbols"]
    one = _boxes(64, gen, torch.zeros(64))
    one[1][5] = 0.9
    counts = set()
    with no_compilation():
        for b, s in [_boxes(64, gen), _boxes(64, gen), _boxes(64, gen, torch.zeros(64)), one]:
            got, want = art(b, s), post(b, s)
            counts.add(len(want[0]))
            assert _same(got, want)
    assert {0, 1} <= counts
    with pytest.raises(CallError, match="CUDA graphs replay the sizes they recorded"):
        art.with_cuda_graphs()


def test_a_boolean_mask_on_cuda_serves_every_count(tmp_path):
    def fn(x):
        return x[x > 0] * 2, torch.nonzero(x > 0.5)

    art = capture_and_load(tmp_path / "p", fn, torch.randn(4, 33, device="cuda"))
    assert art.uses_kernels
    with no_compilation():
        for x in (
            torch.randn(4, 33, device="cuda"),
            -torch.ones(4, 33, device="cuda"),
            torch.ones(4, 33, device="cuda"),
        ):
            assert _same(art(x), fn(x))


def test_cuda_graphs_option_is_refused_for_data_dependent_sizes(tmp_path):
    def fn(x):
        return x[x > 0] * 2

    with (
        pytest.raises(
            CaptureError,
            match=r"cuda-graphs = true replays the sizes a CUDA graph recorded, and this "
            r"function sizes tensors by their values .*drop the option",
        ),
        capture(fn, engine="frozen", options={"cuda_graphs": True}, **pair_paths(tmp_path)) as f,
    ):
        f(torch.randn(64, device="cuda"))
    assert not (tmp_path / "t.py").exists()
