"""A loaded function behind a real HTTP server (FastAPI on uvicorn,
example_project/tinylm/serve.py) on loopback, as servers call it.

tinylm's ``forward`` is captured here with the frozen engine and loaded in this
process; the server runs on uvicorn in a thread on 127.0.0.1. Sixteen client threads
send a fixed number of requests while the weights are reloaded twice
(``load_state_dict``, then ``assign=True``): every answer equals eager's for its input
and the weights version it reports, with the serving guard on (nothing compiles).
A reload never writes into a model a request holds. Inputs of another shape or dtype
get 422 with the CallError message, a call that runs out of memory 503, and the
server goes on; a call that runs out of memory inside the frozen kernels (an address
space limit, in a subprocess) leaves the function usable.
"""

from __future__ import annotations

import base64
import gc
import http.client
import json
import subprocess
import sys
import textwrap
import threading
import weakref
from contextlib import ExitStack, closing
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "example_project"))  # tinylm from the source tree

from tinylm import build_model, example_batch, steps  # noqa: E402
from tinylm.serve import Models, create_app, running  # noqa: E402

pytestmark = pytest.mark.usefixtures("runtime_env")

N_CLIENTS, N_REQUESTS, N_INPUTS = 16, 10, 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the loaded forward, the inputs, weights files v1 and v2, eager logits per
    version and input)."""
    from _pairs import load_pair, pair_paths

    import precompile_build

    tmp = tmp_path_factory.mktemp("serve")
    ids, _ = example_batch("cpu")
    with precompile_build.capture(steps.forward, engine="frozen", **pair_paths(tmp)) as f:
        f(build_model(seed=0), ids)
    fn = load_pair(tmp / "t.py", tmp / "t.cache")
    assert fn.uses_kernels
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randint(0, 256, ids.shape, generator=g) for _ in range(N_INPUTS)]
    files, refs = {}, {}
    for version in (0, 1, 2):
        model = build_model(seed=version)
        if version:
            files[version] = tmp / f"v{version}.pt"
            torch.save(model.state_dict(), files[version])
        with torch.no_grad():
            refs[version] = [steps.forward(model, x) for x in inputs]
    return fn, inputs, files, refs


def _post(conn: http.client.HTTPConnection, path: str, body: dict) -> tuple[int, dict]:
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def _logits(reply: dict) -> torch.Tensor:
    raw = bytearray(base64.b64decode(reply["logits"]))
    return torch.frombuffer(raw, dtype=getattr(torch, reply["dtype"])).reshape(reply["shape"])


def _connect(url: str) -> http.client.HTTPConnection:
    u = urlparse(url)
    assert u.hostname == "127.0.0.1"  # loopback only
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_sixteen_clients_and_two_reloads_get_eager_s_answers(served):
    """16 clients x 10 requests, reloads after a third and two thirds of them: every
    answer is eager's for its input with the weights of the version it reports (the
    versions' answers differ far beyond the tolerance, so a mixed or stale one would
    show), versions never go back for a client, and all three versions answered."""
    from precompile_runtime import no_compilation

    fn, inputs, files, refs = served
    for x in range(N_INPUTS):
        assert not _close(refs[0][x], refs[1][x]) and not _close(refs[1][x], refs[2][x])
    models = Models(build_model(seed=0))
    done, lock = [0], threading.Lock()
    marks = {
        N_CLIENTS * N_REQUESTS // 3: threading.Event(),
        2 * N_CLIENTS * N_REQUESTS // 3: threading.Event(),
    }
    results: dict[int, list] = {c: [] for c in range(N_CLIENTS)}
    errors: list = []

    def client(c: int, url: str) -> None:
        conn = _connect(url)
        try:
            for r in range(N_REQUESTS):
                x = (c + r) % N_INPUTS
                status, reply = _post(conn, "/forward", {"ids": inputs[x].tolist()})
                results[c].append((x, status, reply))
                with lock:
                    done[0] += 1
                    if done[0] in marks:
                        marks[done[0]].set()
        except Exception as e:  # reported by the main thread
            errors.append(e)
        finally:
            conn.close()

    def reloader(url: str) -> None:
        with closing(_connect(url)) as conn:
            for (_mark, event), (version, assign) in zip(
                sorted(marks.items()), ((1, False), (2, True))
            ):
                event.wait(120)
                body = {"path": str(files[version]), "assign": assign}
                status, reply = _post(conn, "/reload", body)
                if (status, reply) != (200, {"version": version}):
                    errors.append(("reload", status, reply))

    with no_compilation(), running(create_app(fn, models)) as url:
        threads = [threading.Thread(target=client, args=(c, url)) for c in range(N_CLIENTS)]
        admin = threading.Thread(target=reloader, args=(url,))
        for t in (*threads, admin):
            t.start()
        for t in (*threads, admin):
            t.join(300)
    assert not errors, errors
    seen = set()
    for c, replies in results.items():
        assert len(replies) == N_REQUESTS
        versions = [reply["version"] for _, _, reply in replies]
        assert versions == sorted(versions), (c, versions)  # a reload only moves forward
        for x, status, reply in replies:
            assert status == 200, reply
            got = _logits(reply)
            assert _close(got, refs[reply["version"]][x]), (c, x, reply["version"])
            seen.add(reply["version"])
    assert seen == {0, 1, 2}
    assert models.current().version == 2


@pytest.mark.parametrize("assign", [False, True], ids=["load_state_dict", "assign"])
def test_a_reload_never_writes_into_a_model_a_request_holds(served, assign):
    """A request holding the snapshot taken before a reload computes with those weights
    to the end: the reload builds another model (with ``assign=True`` its parameters
    are the state dict's tensors) and leaves the held one as it was, freed when its
    holder lets go. A state dict that does not fit raises and swaps nothing."""
    fn, inputs, files, refs = served
    models = Models(build_model(seed=0))
    held = models.current()
    before = {k: v.clone() for k, v in held.model.state_dict().items()}
    state = torch.load(files[1], weights_only=True)
    new = models.reload(state, assign=assign)
    assert new.version == 1 and models.current() is new and new.model is not held.model
    assert all(torch.equal(before[k], v) for k, v in held.model.state_dict().items())
    shared = [new.model.state_dict()[k].data_ptr() == state[k].data_ptr() for k in state]
    assert all(shared) if assign else not any(shared)
    assert _close(fn(held.model, inputs[0]), refs[0][0]) and _close(
        fn(new.model, inputs[0]), refs[1][0]
    )
    with pytest.raises(RuntimeError, match="Missing key"):
        models.reload({k: v for k, v in state.items() if not k.startswith("norm_f")}, assign=assign)
    assert models.current() is new
    gone = weakref.ref(held.model)  # freed with its last holder (the loaded function keeps none)
    del held
    gc.collect()
    assert gone() is None


def test_bad_inputs_get_a_clear_4xx_and_the_server_goes_on(served):
    """While four clients send good requests: another shape and another dtype get 422
    with the loaded function's CallError message, an unknown dtype and ragged rows 422
    before any call, a call that runs out of memory 503, a reload from a missing file
    or of a state dict missing a key 422 (nothing swapped); every good answer is
    eager's, and the server answers after each fault."""
    fn, inputs, _, refs = served
    flaky = threading.Event()

    def forward(
        model, ids
    ):  # the loaded function, made to run out of memory once (this test's input)
        if flaky.is_set() and torch.equal(ids, inputs[0]):
            flaky.clear()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return fn(model, ids)

    models = Models(build_model(seed=0))
    good: list = []
    stop = threading.Event()

    def client(url: str) -> None:
        with closing(_connect(url)) as conn:
            while not stop.is_set():
                good.append(_post(conn, "/forward", {"ids": inputs[1].tolist()}))

    x = inputs[0]
    with ExitStack() as stack:
        url = stack.enter_context(running(create_app(forward, models)))
        threads = [threading.Thread(target=client, args=(url,)) for _ in range(4)]
        for t in threads:
            t.start()
        conn = stack.enter_context(closing(_connect(url)))
        cases = [
            ({"ids": torch.cat([x, x[:, :1]], 1).tolist()}, 422, "CallError", "shape"),
            ({"ids": x.tolist(), "dtype": "int32"}, 422, "CallError", "int32"),
            ({"ids": x.tolist(), "dtype": "float32"}, 422, "CallError", "float32"),
            ({"ids": x.tolist(), "dtype": "int8"}, 422, "ValueError", "one of int64"),
            ({"ids": [[1, 2], [3]]}, 422, "ValueError", ""),
            ({"ids": x.tolist(), "_oom": True}, 503, "OutOfMemoryError", "out of memory"),
        ]
        for body, want, kind, words in cases:
            if body.pop("_oom", False):
                flaky.set()
            status, reply = _post(conn, "/forward", body)
            assert status == want and reply["detail"]["error"] == kind, reply
            assert words in reply["detail"]["message"], reply
            status, reply = _post(
                conn, "/forward", {"ids": x.tolist()}
            )  # and the next one is served
            assert status == 200 and _close(_logits(reply), refs[0][0])
        for body, kind in (
            ({"path": str(_truncated(served).with_name("missing.pt"))}, "FileNotFoundError"),
            ({"path": str(_truncated(served))}, "RuntimeError"),
        ):
            status, reply = _post(conn, "/reload", body)  # nothing swapped: still version 0
            assert status == 422 and reply["detail"]["error"] == kind, reply
            assert reply["detail"]["message"].endswith("still serving version 0"), reply
        assert models.current().version == 0
        stop.set()
        for t in threads:
            t.join(60)
    assert len(good) > 4 and all(s == 200 and _close(_logits(r), refs[0][1]) for s, r in good)


def _truncated(served) -> Path:
    """A state dict of version 1 without the final norm's weight (a missing key)."""
    path = served[2][1].with_name("v1-truncated.pt")
    state = torch.load(served[2][1], weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith("norm_f")}, path)
    return path


_OOM_CHILD = """
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
from _pairs import load_pair
fn = load_pair(sys.argv[2], sys.argv[3])
x = torch.randn(4096, 64)
want = torch.relu(x @ x.T) + 1
torch.testing.assert_close(fn(x), want)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 24 * 2**20, hard))  # less than the 64 MiB result
try:
    fn(x)
    print("no error")
except (RuntimeError, MemoryError) as e:
    print("raised", type(e).__name__, str(e).splitlines()[0][:120])
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
torch.testing.assert_close(fn(x), want)
torch.testing.assert_close(fn(2 * x), torch.relu(4 * x @ x.T) + 1)
print("usable after")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_a_call_that_runs_out_of_memory_leaves_the_function_usable(tmp_path):
    """The CPU analogue of a CUDA out-of-memory inside a served call: the frozen
    kernels' output allocation fails (the process's address space capped below it);
    the call raises torch's allocator error, and with the cap lifted the next calls
    give eager's results."""
    from _pairs import pair_paths

    import precompile_build

    with precompile_build.capture(
        lambda x: torch.relu(x @ x.T) + 1, engine="frozen", **pair_paths(tmp_path)
    ) as f:
        f(torch.randn(4096, 64))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_OOM_CHILD),
            str(REPO / "tests"),
            str(tmp_path / "t.py"),
            str(tmp_path / "t.cache"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert out[-2].startswith("raised RuntimeError") and "alloc" in out[-2], out
    assert out[-1] == "usable after"
