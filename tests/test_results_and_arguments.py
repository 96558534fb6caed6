"""Results that hold the call's own inputs, result classes registered while the call
runs, and arguments whose structure the call changes.

- A result leaf that is an input tensor (``return x.add_(1)``, ``return m(x), x``, a
  ModelOutput or dict holding an input, a parameter returned) comes back as that
  tensor, on every call (the frozen wrapper empties the list of inputs it is given).
- transformers registers a ModelOutput class with pytree when the class is made, but
  not while compiling: a class first imported inside the captured function is
  registered as transformers does, and its next instance does not fail.
- A call that adds keys to a dict argument (sentence-transformers' forward) or items
  to a list is refused with the argument's path and what changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from _pairs import capture_and_load

from precompile_build import CaptureError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())


def test_an_input_written_in_place_and_returned_comes_back_on_every_call(tmp_path):
    def bump(x):
        return x.add_(1).mul_(2)

    art = capture_and_load(tmp_path / "p", bump, torch.randn(3))
    assert art.uses_kernels and art.metadata["outputs"]["leaves"] == [["input", 0]]
    for _ in range(2):
        x = torch.randn(3)
        want = (x + 1) * 2
        got = art(x)
        assert got is x and torch.equal(x, want)


def test_an_input_returned_beside_a_result_comes_back_as_itself(tmp_path):
    def fn(m, x):
        return m(x), x

    m = _model()
    art = capture_and_load(tmp_path / "p", fn, m, torch.randn(2, 4))
    assert art.uses_kernels
    for _ in range(2):
        x = torch.randn(2, 4)
        y, same = art(m, x)
        assert same is x and torch.allclose(y, m(x), atol=1e-6)


def test_a_parameter_and_a_dict_holding_an_input_come_back_as_themselves(tmp_path):
    def fn(m, x):  # (a sibling: a lifted parameter, and an input inside a container)
        return {"y": m(x), "x": x, "w": m[0].weight}

    m = _model()
    art = capture_and_load(tmp_path / "p", fn, m, torch.randn(2, 4))
    for _ in range(2):
        x = torch.randn(2, 4)
        out = art(m, x)
        assert (
            out["x"] is x and out["w"] is m[0].weight and torch.allclose(out["y"], m(x), atol=1e-6)
        )


def test_a_model_output_holding_an_input_comes_back_as_itself(tmp_path):
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")

    def fn(m, x):
        return modeling_outputs.BaseModelOutput(last_hidden_state=m(x), hidden_states=(x,))

    m = _model()
    art = capture_and_load(tmp_path / "p", fn, m, torch.randn(2, 4))
    x = torch.randn(2, 4)
    for _ in range(2):
        out = art(m, x)
        assert type(out) is modeling_outputs.BaseModelOutput and out.hidden_states[0] is x
        assert torch.allclose(out.last_hidden_state, m(x), atol=1e-6)


_OUTPUT_MODULE = """
from dataclasses import dataclass
from typing import Optional

import torch
from transformers.utils import ModelOutput


@dataclass
class TinyOutput(ModelOutput):
    logits: Optional[torch.Tensor] = None
    extra: Optional[torch.Tensor] = None
"""


def test_a_model_output_class_first_imported_inside_the_call(tmp_path, monkeypatch):
    """A user's ModelOutput (a sibling of transformers' own classes) whose module the
    captured function imports first: registered the way transformers registers it."""
    pytest.importorskip("transformers")
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pcb_tiny_outputs.py").write_text(_OUTPUT_MODULE)
    monkeypatch.syspath_prepend(str(mods))
    assert "pcb_tiny_outputs" not in sys.modules

    def fn(m, x):
        from pcb_tiny_outputs import TinyOutput

        return TinyOutput(logits=m(x))

    m = _model()
    try:
        art = capture_and_load(tmp_path / "p", fn, m, torch.randn(2, 4))
        x = torch.randn(2, 4)
        out = art(m, x)
        assert type(out).__name__ == "TinyOutput" and out.extra is None
        assert (
            torch.allclose(out.logits, m(x), atol=1e-6) and fn(m, x).logits is not None
        )  # eager again
    finally:
        sys.modules.pop("pcb_tiny_outputs", None)


def test_base_model_output_first_imported_inside_the_call_in_a_fresh_process(tmp_path):
    """transformers.modeling_outputs imported for the first time inside the captured
    function (a fresh process, as a capture script is)."""
    pytest.importorskip("transformers")
    script = textwrap.dedent(f"""
        import sys, pathlib, torch
        sys.path[:0] = [{REPO!r} + "/tests", {REPO!r}, {REPO!r} + "/runtime"]
        import transformers  # (its top level, not modeling_outputs)
        from _pairs import capture_and_load
        assert "transformers.modeling_outputs" not in sys.modules

        def fn(x):
            from transformers.modeling_outputs import BaseModelOutput
            return BaseModelOutput(last_hidden_state=torch.relu(x) * 2)

        art = capture_and_load(pathlib.Path({str(tmp_path / "p")!r}), fn, torch.randn(2, 4))
        x = torch.randn(2, 4)
        out = art(x)
        assert type(out).__name__ == "BaseModelOutput", type(out)
        assert torch.equal(out.last_hidden_state, fn(x).last_hidden_state)
        print("served")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("served"), proc.stderr[-3000:]


def test_keys_added_to_a_dict_argument_are_named():
    """sentence-transformers' modules add their outputs to the features dict they are
    given; the refusal names the dict and the keys."""
    import precompile_build

    lin = torch.nn.Linear(4, 4)

    def forward(m, features):
        emb = m(features["input_ids"])
        features.update({"token_embeddings": emb, "sentence_embedding": emb.mean(0)})
        return features

    with (
        pytest.raises(
            CaptureError,
            match=r"changes the structure of its arguments \(argument 'features': added "
            r"the key\(s\) 'token_embeddings', 'sentence_embedding'\).*passes the function a copy",
        ),
        precompile_build.capture(
            forward,
            engine="frozen",
            artifact_path="/nonexistent/t.py",
            cache_path="/nonexistent/t.cache",
        ) as f,
    ):
        f(lin, {"input_ids": torch.randn(3, 4)})


@pytest.mark.parametrize(
    "fn, args, where",
    [
        (
            lambda features: features.pop("mask") * features["x"],
            ({"x": torch.randn(3), "mask": torch.ones(3)},),
            r"argument 'features': removed the key\(s\) 'mask'",
        ),
        (
            lambda xs: xs.append(xs[0] * 2) or xs[-1],
            ([torch.randn(3)],),
            r"argument 'xs' had 1 item\(s\), now 2",
        ),
        (
            lambda batch: batch["inner"].update(y=batch["inner"]["x"] + 1) or batch["inner"]["y"],
            ({"inner": {"x": torch.randn(3)}},),
            r"argument 'batch'\['inner'\]: added the key\(s\) 'y'",
        ),
    ],
)
def test_a_key_removed_an_item_appended_and_a_nested_dict_are_named(fn, args, where):
    import precompile_build

    with (
        pytest.raises(
            CaptureError, match=r"changes the structure of its arguments \(" + where + r"\)"
        ),
        precompile_build.capture(
            fn,
            engine="frozen",
            artifact_path="/nonexistent/t.py",
            cache_path="/nonexistent/t.cache",
        ) as f,
    ):
        f(*args)


def test_sentence_transformers_forward_is_refused_naming_its_dict_and_a_copy_serves(tmp_path):
    """The real package (tests under torch 2.14.1): its modules add their outputs to the
    features dict; a wrapper passing a copy serves, the input tensors returned as they are."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from _pairs import load_pair_at, pair_paths
    from transformers import BertConfig, BertModel, BertTokenizerFast

    import precompile_build

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "a", "cat", "sat"]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(tmp_path / "tiny" / "vocab.txt")).save_pretrained(
        tmp_path / "tiny"
    )
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=len(words),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    ).save_pretrained(tmp_path / "tiny")
    from sentence_transformers import models

    st = sentence_transformers.SentenceTransformer(
        modules=[models.Transformer(str(tmp_path / "tiny")), models.Pooling(16)], device="cpu"
    ).eval()
    features = {
        k: v
        for k, v in st.tokenize(["hello world", "a cat sat"]).items()
        if isinstance(v, torch.Tensor)
    }
    (tmp_path / "p").mkdir()
    with (
        pytest.raises(
            CaptureError,
            match=r"\(argument 'input': added the key\(s\) 'token_embeddings', "
            r"'sentence_embedding'\)",
        ),
        torch.no_grad(),
        precompile_build.capture(st.forward, engine="frozen", **pair_paths(tmp_path / "p")) as f,
    ):
        f(dict(features))

    def encode(model, features):
        return model(dict(features))

    with (
        torch.no_grad(),
        precompile_build.capture(encode, engine="frozen", **pair_paths(tmp_path / "p")) as f,
    ):
        f(st, dict(features))
    art = load_pair_at(tmp_path / "p")
    with torch.no_grad():
        got, want = art(st, features), st(dict(features))
    assert sorted(got) == sorted(want) and got["input_ids"] is features["input_ids"]
    assert all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)
