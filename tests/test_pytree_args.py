"""Arguments and results through torch's pytree (capturing/pytree_io.py, the driver's
_flatten_call/_rebuild), and tensors a model holds twice (capturing/aliases.py)."""

from __future__ import annotations

import collections
import dataclasses
import typing

import pytest

torch = pytest.importorskip("torch")

from _pairs import load_pair  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

import precompile_build  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

TRACERS = ["export", "export-strict", "make_fx"]


class Pair(typing.NamedTuple):
    first: torch.Tensor
    count: int


@dataclasses.dataclass
class Registered:
    value: torch.Tensor
    scale: float


pytree.register_dataclass(Registered, serialized_type_name="tests.test_pytree_args.Registered")


@dataclasses.dataclass
class Plain:  # not registered: a result dataclass is registered by the capture
    out: torch.Tensor
    note: str


def _capture(tmp_path, fn, *args, name="t", engine="eager", kwargs=None, **kw):
    src, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with precompile_build.capture(
        fn, artifact_path=src, cache_path=cache, target=name, engine=engine, **kw
    ) as f:
        f(*args, **(kwargs or {}))
    return load_pair(src, cache)


def structured(x, opts, *, extra=None):
    y = x["a"][0] * opts.scale + opts.value
    return {
        "pair": Pair(y, 3),
        "od": collections.OrderedDict(z=y * 2, w=None),
        7: [y + 1, (y - 1,)],
        "reg": Registered(y.sum(0), 0.5),
        "plain": Plain(y * 3, "note"),
        "extra": extra,
    }


def _args():
    return {"a": [torch.randn(2, 3)]}, Registered(torch.randn(3), 2.0)


@pytest.mark.parametrize("engine", ["eager", "frozen"])
def test_every_pytree_type_goes_in_and_comes_back_as_itself(tmp_path, engine):
    f = _capture(tmp_path, structured, *_args(), engine=engine, kwargs={"extra": 4})
    x, opts = _args()
    got = f(x, opts, extra=4)
    want = structured(x, opts, extra=4)
    assert list(got) == list(want)
    assert type(got["pair"]) is Pair and got["pair"].count == 3
    assert type(got["od"]) is collections.OrderedDict and got["od"]["w"] is None
    assert type(got[7]) is list and type(got[7][1]) is tuple
    assert type(got["reg"]) is Registered and got["reg"].scale == 0.5
    assert type(got["plain"]) is Plain and got["plain"].note == "note"
    assert got["extra"] == 4
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def test_calls_of_another_structure_name_the_path(tmp_path):
    f = _capture(tmp_path, structured, *_args(), kwargs={"extra": 4})
    x, opts = _args()
    with pytest.raises(
        CallError, match=r"argument 'x'\['a'\]: expected a list of 1 item\(s\), got a tuple"
    ):
        f({"a": (x["a"][0],)}, opts, extra=4)
    with pytest.raises(
        CallError,
        match=r"argument 'x': expected a dict with keys \['a'\], got a dict with keys \['b'\]",
    ):
        f({"b": x["a"]}, opts, extra=4)
    for leaf, got in (
        (None, "None"),
        (3, "an int"),
        (x["a"][0], "a Tensor"),
    ):  # a leaf named by its type
        with pytest.raises(
            CallError, match=rf"argument 'x': expected a dict with keys \['a'\], got {got};"
        ):
            f(leaf, opts, extra=4)
    with pytest.raises(
        CallError, match=r"keyword argument 'extra': the capture specialised on 4, got 5"
    ):
        f(x, opts, extra=5)
    with pytest.raises(
        CallError, match=r"argument 'opts'.scale: the capture specialised on 2.0, got 3.0"
    ):
        f(x, Registered(opts.value, 3.0), extra=4)
    with pytest.raises(CallError, match=r"argument 'x'\['a'\]\[0\]: dtype torch.float64"):
        f({"a": [x["a"][0].double()]}, opts, extra=4)
    with pytest.raises(
        CallError, match=r"called with 2 positional argument\(s\) and keyword\(s\) \[\]"
    ):
        f(x, opts)


def test_keywords_in_another_order_are_the_same_call(tmp_path):
    f = _capture(
        tmp_path, lambda x, *, a, b: x * a + b, torch.ones(2), kwargs={"a": torch.ones(2), "b": 2.0}
    )
    torch.testing.assert_close(f(torch.ones(2), b=2.0, a=torch.ones(2) * 3), torch.full((2,), 5.0))


class Holder:
    pass


def test_an_unregistered_object_argument_says_what_to_do(tmp_path):
    with pytest.raises(
        CaptureError,
        match=r"target 't': argument 'o' is a Holder, which the capture cannot "
        r"take apart.*Register Holder with torch.utils._pytree",
    ):
        _capture(tmp_path, lambda x, o: x, torch.randn(3), Holder())
    assert not (tmp_path / "t.py").exists()


def test_an_unregistered_object_result_says_what_to_do(tmp_path):
    with pytest.raises(
        CaptureError, match=r"the result's part result\[1\] is a Holder; .*register_pytree_node"
    ):
        _capture(tmp_path, lambda x: (x, Holder()), torch.randn(3))


def test_a_returned_input_is_the_callers_tensor(tmp_path):
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(1))

        def forward(self, x):
            self.n.add_(1)
            return x * 2, self.n

    m = Counter()
    f = _capture(tmp_path, lambda m, x: m(x), m, torch.ones(2))
    served = Counter()
    y, n = f(served, torch.ones(2))
    assert n is served.n and float(served.n) == 1.0
    torch.testing.assert_close(y, torch.full((2,), 2.0))


# ---- tensors a model holds twice ------------------------------------------------------
class _State:
    """A plain object holding tensors (as transformers' StaticCache does)."""

    def __init__(self, t):
        self.t = t


class ListAlias(torch.nn.Module):
    """A buffer also kept in a list, a dict and a plain object, written through them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))
        self.register_buffer("acc", torch.zeros(2, 4))
        self.in_list = [self.buf]
        self.in_dict = {"b": self.buf}
        self.state = _State(self.acc[1])  # a view of a buffer

    def forward(self, x):
        self.in_list[0].add_(x)
        self.state.t.add_(self.in_dict["b"])
        return self.buf * 2


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_buffer_written_through_a_plain_reference_is_the_input(tmp_path, tracer):
    f = _capture(tmp_path, lambda m, x: m(x), ListAlias(), torch.ones(4), tracer=tracer)
    served, eager = ListAlias(), ListAlias()
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(f(served, x), eager(x))
    torch.testing.assert_close(served.buf, eager.buf)
    torch.testing.assert_close(served.acc, eager.acc)
    assert served.in_list[0] is served.buf  # the references are the model's own again


class Shared(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x):
        self.table.add_(x)
        return self.table.sum()


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_tensor_shared_by_two_model_arguments_is_one_input(tmp_path, tracer):
    def fn(a, b, x):
        return a(x) + b(x)

    t = torch.zeros(3)
    f = _capture(tmp_path, fn, Shared(t), Shared(t), torch.ones(3), tracer=tracer)
    s = torch.zeros(3)
    a, b = Shared(s), Shared(s)
    e = torch.zeros(3)
    ea, eb = Shared(e), Shared(e)
    x = torch.randn(3)
    torch.testing.assert_close(f(a, b, x), fn(ea, eb, x))
    torch.testing.assert_close(s, e)


class Unnamed:
    def __init__(self, t):
        self.t = t


pytree.register_pytree_node(Unnamed, lambda o: ([o.t], None), lambda v, _: Unnamed(v[0]))


class Named:
    def __init__(self, t, k):
        self.t, self.k = t, k


pytree.register_pytree_node(
    Named,
    lambda o: ([o.t], o.k),
    lambda v, k: Named(v[0], k),
    serialized_type_name="tests.test_pytree_args.Named",
)


def test_a_class_registered_with_a_serialized_name_goes_in_and_out(tmp_path):
    f = _capture(tmp_path, lambda n: Named(n.t * n.k, n.k + 1), Named(torch.ones(2), 3))
    got = f(Named(torch.ones(2) * 2, 3))
    assert type(got) is Named and got.k == 4
    torch.testing.assert_close(got.t, torch.full((2,), 6.0))
    with pytest.raises(
        CallError, match=r"argument 'n': a Named of another kind: captured 3, got 4"
    ):
        f(Named(torch.ones(2), 4))


def test_a_class_registered_without_a_serialized_name_is_refused(tmp_path):
    with pytest.raises(
        CaptureError,
        match=r"an argument holds a Unnamed, registered with torch.utils._pytree "
        r"without a serialized_type_name.*serialized_type_name='test_pytree_args.Unnamed'",
    ):
        _capture(tmp_path, lambda u: u.t * 2, Unnamed(torch.ones(2)))
