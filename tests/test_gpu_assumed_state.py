"""What a trace assumed of Python state, on CUDA with graphs on: a frozen
CUDA pair replaying CUDA graphs refuses a call whose flags, dicts or hooks differ from
the capture's, from several threads with a model each, and serves again once they are
back. The CPU cases are tests/test_assumed_state.py. Skipped without CUDA."""

from __future__ import annotations

import threading

import pytest

try:
    import torch
except ImportError:  # pragma: no cover - CI without torch
    torch = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")]


def _block_class():
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)
            self.scaling = {"default": 0.5}
            self._disabled = False

        def forward(self, x):
            h = self.down(torch.nn.functional.gelu(self.up(x)))
            return x if self._disabled else x + h * self.scaling["default"]

    return Block


def forward(model, x):
    return model(x)


def test_a_cuda_graph_pair_checks_the_state_the_trace_read_from_several_threads(tmp_path):
    from _pairs import load_pair

    import precompile_build
    from precompile_runtime.errors import CallError

    Block = _block_class()
    torch.manual_seed(0)
    models = [Block().cuda().eval() for _ in range(4)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    x = torch.randn(8, 64, device="cuda")
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with precompile_build.capture(forward, engine="frozen", **paths) as f:
        f(models[0], x)
    served = load_pair(paths["artifact_path"], paths["cache_path"]).with_cuda_graphs()
    problems: list = []

    def client(i):
        m, xi = models[i], torch.randn(8, 64, device="cuda")
        try:
            for step in range(20):
                if step == 5:
                    m.scaling["default"] = 0.25  # this thread's model only
                    try:
                        served(m, xi)
                        problems.append(f"thread {i}: served a changed scaling")
                    except CallError as e:
                        assert "scaling['default'] was 0.5 at capture, now 0.25" in str(e), e
                    m.scaling["default"] = 0.5
                if step == 10:
                    h = m.up.register_forward_hook(lambda mod, inp, out: out * 0)
                    try:
                        served(m, xi)
                        problems.append(f"thread {i}: served with a new hook")
                    except CallError as e:
                        assert "forward hooks of model.up were none at capture" in str(e), e
                    h.remove()
                got = served(m, xi)
                torch.testing.assert_close(got, m(xi), rtol=2e-3, atol=2e-3)
        except Exception as e:  # noqa: BLE001 - reported below with the thread
            problems.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    models[0]._disabled = True  # a flag on a model already checked, between replays
    with pytest.raises(CallError, match=r"model: _disabled was False at capture, now True"):
        served(models[0], x)
    models[0]._disabled = False
    torch.testing.assert_close(served(models[0], x), models[0](x), rtol=2e-3, atol=2e-3)


def test_peft_adapter_state_on_cuda_with_graphs(tmp_path):
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from _pairs import load_pair
    from peft import LoraConfig, get_peft_model

    import precompile_build
    from precompile_runtime.errors import CallError

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = get_peft_model(
        transformers.LlamaForCausalLM(cfg).cuda().eval(),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    ids = torch.randint(0, 256, (1, 16), device="cuda")

    def logits(m, ids):
        return m(input_ids=ids, use_cache=False).logits

    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with torch.no_grad(), precompile_build.capture(logits, engine="frozen", **paths) as f:
        f(model, ids)
    served = load_pair(paths["artifact_path"], paths["cache_path"]).with_cuda_graphs()
    with torch.no_grad():
        want = logits(model, ids)
        for _ in range(3):
            torch.testing.assert_close(served(model, ids), want, rtol=2e-3, atol=2e-3)
        with model.disable_adapter():
            with pytest.raises(CallError, match=r"was False at capture, now True"):
                served(model, ids)
        torch.testing.assert_close(served(model, ids), want, rtol=2e-3, atol=2e-3)


GAIN = (
    2.0  # a module-level value read in a helper method (the guards of capturing/dynamo_guards.py)
)


def test_the_guards_catch_state_the_recorder_did_not_see_on_cuda_with_graphs(tmp_path):
    """A SimpleNamespace config, a global read in a helper method, a closure cell and a
    submodule of another class, changed after served replays, from several threads:
    each raises CallError naming it, and serves again once restored."""
    import types

    from _pairs import load_pair

    import precompile_build
    from precompile_runtime.errors import CallError

    nn = torch.nn

    def make_post(s):
        return lambda y: y * s

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.act = nn.Linear(64, 64), nn.GELU()
            self.cfg = types.SimpleNamespace(temp=0.5)
            self.post = make_post(2.0)

        def helper(self, y):
            return y * GAIN

        def forward(self, x):
            return self.post(self.helper(self.act(self.up(x))) * self.cfg.temp)

    torch.manual_seed(0)
    models = [Net().cuda().eval() for _ in range(4)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    x = torch.randn(8, 64, device="cuda")
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with precompile_build.capture(forward, engine="frozen", **paths) as f:
        f(models[0], x)
    served = load_pair(paths["artifact_path"], paths["cache_path"]).with_cuda_graphs()
    problems: list = []

    def client(i):
        m, xi = models[i], torch.randn(8, 64, device="cuda")
        try:
            for step in range(12):
                if step == 3:
                    m.cfg.temp = 0.7
                    try:
                        served(m, xi)
                        problems.append(f"thread {i}: served a changed config field")
                    except CallError as e:
                        assert "model.cfg.temp was 0.5 at capture, now 0.7" in str(e), e
                    m.cfg.temp = 0.5
                if step == 6:
                    old = m.post
                    m.post = make_post(3.0)
                    try:
                        served(m, xi)
                        problems.append(f"thread {i}: served a changed closure")
                    except CallError as e:
                        assert "at capture" in str(e), e
                    m.post = old
                got = served(m, xi)
                torch.testing.assert_close(got, m(xi), rtol=2e-3, atol=2e-3)
        except Exception as e:  # noqa: BLE001 - reported below with the thread
            problems.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    global GAIN
    GAIN = 3.0
    try:
        with pytest.raises(CallError, match=r"GAIN was 2.0 at capture, now 3.0"):
            served(models[0], x)
    finally:
        GAIN = 2.0
    models[0].act = nn.ReLU().cuda()
    with pytest.raises(
        CallError,
        match=r"model.act was a torch.nn.modules.activation.GELU at capture, now a "
        r"torch.nn.modules.activation.ReLU",
    ):
        served(models[0], x)
