"""Sizes the data decides (capturing/unbacked.py), served by the frozen engine.

``x[x > 0]``, nonzero, masked_select, ``.item()`` sizing, unique, ``tolist()`` splits and
torchvision's nms trace to unbacked symbols; the pair must serve every count as eager
does, zero included, and compile nothing while it does. Also here: the custom ops a
graph calls, whose library a served pair imports at load (capturing/custom_ops.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from _pairs import capture_and_load, marked, pair_paths

from precompile_build import CaptureError, capture
from precompile_runtime import CallError, no_compilation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _masked(x):
    return x[x > 0] * 2


def _nonzero(x):
    return torch.nonzero(x > 0), x.relu()


def _masked_select(x):
    return torch.masked_select(x, x > 0.5).sin()


def _item_sized(x):  # int() of .item(): strict export keeps it a symbol (tracers.py)
    n = int((x > 0).sum().item())
    return torch.zeros(n) + x.sum()


def _unique(x):
    return torch.unique(x, return_counts=True)


def _split_by_values(x):  # sizes from tolist(), then a slice and a split by them
    sizes = (x[:3].abs() * 3).long().tolist()
    return x[3:].repeat(10)[: sum(sizes)].split(sizes)


def _sliced_by_value(x):  # a value's count as a slice's start, and as an end with a step
    n = (x[:1] * 4).long().tolist()[0]
    return x[1:].repeat(2)[n:] * 2, x[1:][:n:2]


def _reduced(x):  # a fixed-size result of a data-dependent intermediate
    return (x[x > 0] ** 2).sum()


def _inputs(kind):
    """Examples whose counts differ: random ones, none selected, all selected."""
    if kind == "int":
        return [torch.randint(0, 5, (10,)), torch.zeros(10, dtype=torch.int64), torch.arange(10)]
    shape = (3, 4) if kind == "2d" else (8,)
    return [
        torch.randn(shape),
        torch.randn(shape),
        -torch.rand(shape) - 1,
        torch.rand(shape) + 1,
        torch.zeros(shape),
    ]


def _same(got, want):
    got, want = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
    return len(got) == len(want) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.allclose(g, w, atol=1e-5)
        for g, w in zip(got, want)
    )


@pytest.mark.parametrize(
    "fn, kind, sized_outputs",
    [
        (_masked, "1d", {"0"}),
        (_nonzero, "2d", {"0"}),
        (_masked_select, "1d", {"0"}),
        (_item_sized, "1d", {"0"}),
        (_unique, "int", {"0", "1"}),
        (_split_by_values, "split", {"0", "1", "2"}),
        (_sliced_by_value, "1d", {"0", "1"}),
        (_reduced, "2d", set()),
    ],
)
def test_sizes_the_values_decide_serve_every_count_as_eager(tmp_path, fn, kind, sized_outputs):
    examples = [torch.rand(8)] * 3 if kind == "split" else _inputs(kind)
    art = capture_and_load(tmp_path / "p", fn, examples[0])
    recorded = art.metadata["data_dependent"]
    assert recorded["symbols"] and set(recorded["outputs"]) == sized_outputs
    if kind == "split":
        examples = [
            torch.rand(8),
            torch.zeros(8),
            torch.full((8,), 5.0),
        ]  # sums 0..45 within the slice
    with no_compilation():  # served: nothing compiles (the serving guard raises on any compile)
        for x in examples:
            assert _same(art(x), fn(x)), x


def test_cuda_graphs_are_refused_for_sizes_the_values_decide(tmp_path):
    art = capture_and_load(tmp_path / "p", _masked, torch.randn(8))
    assert art.uses_kernels
    with pytest.raises(
        CallError,
        match=r"CUDA graphs replay the sizes they recorded, and this target's code "
        r"sizes tensors by their values .*u\d+\); load it without cuda_graphs",
    ):
        art.with_cuda_graphs()


def test_data_dependent_sizes_with_a_dim_marked_dynamic(tmp_path):
    def fn(x):
        return x[x > 0] * 2, x.sum(0)

    art = capture_and_load(tmp_path / "p", fn, marked(6, 3, lo=1, hi=64))
    assert art.metadata["dynamic"]["symbols"] and set(
        art.metadata["data_dependent"]["outputs"]
    ) == {"0"}
    for x in (torch.randn(6, 3), torch.randn(17, 3), -torch.ones(2, 3)):
        assert _same(art(x), fn(x))


def test_static_sizes_record_nothing_data_dependent(tmp_path):
    art = capture_and_load(tmp_path / "p", lambda x: x.relu() * 2, torch.randn(4))
    assert "data_dependent" not in art.metadata and art.metadata["op_libraries"] == {}


# ---- custom ops: the library that registers them is imported at load ---------------
_OPS_MODULE = """
import torch

lib = torch.library.Library("pcbtinyops", "DEF")
lib.define("keep_positive(Tensor x) -> Tensor")


@torch.library.impl(lib, "keep_positive", "CompositeExplicitAutograd")
def keep_positive(x):
    return x[x > 0].clone()


@torch.library.register_fake("pcbtinyops::keep_positive", lib=lib)
def _fake(x):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)


@torch.library.custom_op("pcbtinyops2::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@scaled.register_fake
def _(x):
    return torch.empty_like(x)
"""


def _serve_in_a_fresh_process(pair_dir, extra_path, code, watch="pcb_ops_mod"):
    """Run ``code`` in a new interpreter with the pair at ``pair_dir`` loaded as ``art``;
    returns its JSON output, with the modules named ``watch...`` imported before and
    after the load."""
    script = textwrap.dedent("""
        import json, sys, torch
        sys.path[:0] = [{repo!r} + "/tests", {repo!r}, {repo!r} + "/runtime"] + {extra!r}
        from _pairs import load_pair
        before = sorted(m for m in sys.modules if m.startswith({watch!r}))
        out = {{"imported_before": before}}
        try:
            art = load_pair({src!r}, {cache!r})
        except Exception as e:
            out["load_error"] = f"{{type(e).__name__}}: {{e}}"
            print(json.dumps(out)); raise SystemExit
        out["imported_after"] = sorted(m for m in sys.modules if m.startswith({watch!r}))
    """).format(
        repo=REPO,
        extra=extra_path,
        src=str(pair_dir / "t.py"),
        cache=str(pair_dir / "t.cache"),
        watch=watch,
    )
    proc = subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(code) + "\nprint(json.dumps(out))"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_custom_ops_module_is_imported_when_the_pair_loads(tmp_path, monkeypatch):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pcb_ops_mod.py").write_text(_OPS_MODULE)
    monkeypatch.syspath_prepend(str(mods))
    import pcb_ops_mod

    def fn(x):
        return torch.ops.pcbtinyops.keep_positive(x) * 2, pcb_ops_mod.scaled(x)

    (tmp_path / "p").mkdir()
    with capture(fn, engine="frozen", **pair_paths(tmp_path / "p")) as f:
        f(torch.randn(8))
    out = _serve_in_a_fresh_process(
        tmp_path / "p",
        [str(mods)],
        """
        x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0, -7.0, 8.0])
        a, b = art(x)
        out["served"] = [a.tolist(), b.tolist()]
        out["meta"] = art.metadata["op_libraries"]
    """,
    )
    assert out["imported_before"] == [] and out["imported_after"] == ["pcb_ops_mod"]
    assert out["meta"] == {
        "pcbtinyops": {"ops": ["pcbtinyops::keep_positive"], "modules": ["pcb_ops_mod"]},
        "pcbtinyops2": {"ops": ["pcbtinyops2::scaled"], "modules": ["pcb_ops_mod"]},
    }
    assert out["served"] == [
        [2.0, 6.0, 10.0, 12.0, 16.0],
        [3.0, -6.0, 9.0, -12.0, 15.0, 18.0, -21.0, 24.0],
    ]
    # where the module cannot be imported: a CallError at load that names it
    out = _serve_in_a_fresh_process(tmp_path / "p", [], "")
    assert (
        "CallError" in out["load_error"]
        and "'pcb_ops_mod'" in out["load_error"]
        and "pcbtinyops::keep_positive" in out["load_error"]
    ), out


# ---- torchvision: nms and a detection model's post-processing ---------------------
def _boxes(n, scores=None, gen=None):
    xy = torch.rand(n, 2, generator=gen) * 50
    boxes = torch.cat([xy, xy + 5 + torch.rand(n, 2, generator=gen) * 20], 1)
    return boxes, (torch.rand(n, generator=gen) if scores is None else scores)


def test_nms_post_processing_serves_every_count_and_imports_torchvision_at_load(tmp_path):
    torchvision = pytest.importorskip("torchvision")

    def post(boxes, scores):
        keep = scores > 0.3
        boxes, scores = torchvision.ops.clip_boxes_to_image(boxes[keep], (60, 60)), scores[keep]
        small = torchvision.ops.remove_small_boxes(boxes, 1.0)
        boxes, scores = boxes[small], scores[small]
        kept = torchvision.ops.nms(boxes, scores, 0.5)[:10]
        return boxes[kept], scores[kept]

    art = capture_and_load(tmp_path / "p", post, *_boxes(20))
    assert art.metadata["op_libraries"] == {
        "torchvision": {"ops": ["torchvision::nms"], "modules": ["torchvision"]}
    }
    gen = torch.Generator().manual_seed(0)
    one = _boxes(20, torch.zeros(20), gen)
    one[1][3] = 0.9
    calls = [
        _boxes(20, gen=gen),
        _boxes(20, gen=gen),
        _boxes(20, torch.zeros(20), gen),
        one,
        (_boxes(20, gen=gen)[0], torch.full((20,), 0.8)),
    ]
    counts = set()
    with no_compilation():
        for b, s in calls:
            got, want = art(b, s), post(b, s)
            counts.add(len(want[0]))
            assert _same(got, want)
    assert {0, 1} <= counts and len(counts) >= 3
    out = _serve_in_a_fresh_process(
        tmp_path / "p",
        [],
        """
        b = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [30, 30, 45, 45]] * 6 + [[0, 0, 10, 10]] * 2)
        out["kept"] = len(art(b, torch.linspace(0.4, 0.9, 20))[0])
    """,
        watch="torchvision",
    )
    assert (
        out["imported_before"] == [] and "torchvision" in out["imported_after"] and out["kept"] == 2
    )


def test_faster_rcnn_in_eval_mode_is_refused_for_its_branch_not_blamed_on_the_function(tmp_path):
    """torchvision's batched_nms branches on a count (``if boxes.numel() == 0``), which
    torch.compile(fullgraph=True) refuses too; the message names that, never "the function
    itself raises" (the model runs eagerly)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64
    ).eval()
    images = [torch.rand(3, 64, 64)]

    def detect(model, images):
        return model(images)

    with (
        pytest.raises(CaptureError) as info,
        capture(detect, engine="frozen", **pair_paths(tmp_path)) as f,
    ):
        f(model, images)
    assert "itself raises" not in str(info.value)
    assert isinstance(detect(model, images), list)  # it runs eagerly, after the capture too
