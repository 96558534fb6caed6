"""The artifact pair of the `frozen` and `eager` engines: what ``NAME.py`` records.

This module is the description of the pair format. A pair is two files:

``NAME.py``, the source half
    A self-contained Python module (torch and the stdlib; precompile-runtime's error
    classes and serving guard where installed). Its ``PRECOMPILE_METADATA = {...}`` is
    a dict literal, readable with ``ast.literal_eval`` without running the file, of the
    shape :class:`PairMetadata` below; its ``load(kernel_dir)`` returns the callable
    (``kernel_dir``: the unpacked blobs of the cache half, or None for the captured ATen
    graph without kernels). The build side writes it: ``capturing/tracing.py`` builds the
    metadata, the engines (``frozen.py``, ``eager.py``) add theirs, ``engines/codegen.py``
    serialises it with the graph, Inductor's wrapper and the driver templates
    (``templates/driver.py`` and the blocks before it), which read it.
``NAME.cache``, the cache half
    An envelope (:mod:`precompile_runtime.envelope`): a header with ``engine``,
    ``code_hash`` (sha256 of the exact bytes of ``NAME.py``), the host ``fingerprint``
    and ``meta``, and the blobs ``kernels[*]["file"]`` name (compiled CPU kernels,
    cubins; none for `eager`).

The metadata's ``format`` is :data:`FORMAT` and its ``version`` an int: a change that an
older driver or loader would misread takes a new :data:`VERSION`, and the runtime
refuses a version outside :data:`READS` (:func:`check_version`) with
:class:`~precompile_runtime.errors.PairFormatError`. The manifest that lists the pairs
is :mod:`precompile_runtime.manifest`. The `torch` engine's pairs are torch's own
format (``torch.compiler.precompile``).

Leaf kinds (``inputs["leaves"]``, ``outputs["leaves"]``), one list per pytree leaf:
``["module"]`` an ``nn.Module`` argument (its parameters and buffers are lifted),
``["tensor"]`` a tensor argument, ``["const", value]`` a value the capture specialised
on (compared on every call); in results ``["tensor", k]`` the k-th graph output,
``["input", j]`` the j-th flat input returned as it is, ``["const", value]``.

The flat inputs of the graph: the lifted parameters and buffers (``params``, named
``param_names``), then the tensor arguments (``tensor_inputs``), then the trace-made
``constants``. Its outputs: ``num_user_outputs`` result tensors, one gradient per
``grad_param_indices`` entry, then the new values of ``reassigned_buffers``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, TypedDict, Union, get_args

from .errors import PairFormatError

FORMAT = "precompile-build.source"
"""``PRECOMPILE_METADATA["format"]`` of every source half of our engines."""
VERSION = 1
"""The version this precompile-build writes."""
READS = (1, 1)
"""The versions (lowest, highest) this precompile-runtime loads."""

Engine = Literal["frozen", "torch", "eager"]
"""The engines a variant is made by: ``frozen`` and ``eager`` write this format, ``torch``
writes torch's own (``torch.compiler.precompile``)."""
SourceEngine = Literal["frozen", "eager"]
"""The engines whose pairs are of this format."""
Device = Literal["cpu", "cuda"]
"""Where a capture's tensors were, and what a variant serves on."""
Tracer = Literal["export", "export-strict", "make_fx"]
"""What traced the call (the `tracer` setting's ``auto`` is resolved to one of these)."""
ENGINES: tuple[Engine, ...] = get_args(Engine)
SOURCE_ENGINES: tuple[SourceEngine, ...] = get_args(SourceEngine)
DEVICES: tuple[Device, ...] = get_args(Device)
TRACERS: tuple[Tracer, ...] = get_args(Tracer)

Dim = Union[int, str]  # an int, or with dynamic dims a symbol / a Python expression of them


class TensorSpec(TypedDict):
    """A flat tensor input as captured: the call's tensors must match it."""

    dtype: str
    """``str(tensor.dtype)``, e.g. ``"torch.float32"``."""
    device_type: str
    """``"cpu"`` or ``"cuda"``."""
    shape: list[Dim]
    """Sizes; with dynamic dims a symbol of ``dynamic["symbols"]`` or an expression."""
    stride: list[Dim]
    """Strides, in elements, like ``shape``."""
    requires_grad: bool
    """The captured tensor's ``requires_grad``."""


class InputsSpec(TypedDict):
    """The arguments ``(args, kwargs)`` as a pytree (capturing/pytree_io.py)."""

    spec: str
    """``torch.utils._pytree.treespec_dumps`` of ``(args, kwargs)``."""
    leaves: list[list[Any]]
    """One leaf kind per pytree leaf (see the module docstring)."""
    types: list[list[str]]
    """``[kind, "module:qualname", serialized name]`` of each type the driver imports (and
    for ``"namedtuple"`` and ``"cache"`` registers) before ``treespec_loads``; kind
    ``"namedtuple"``, ``"cache"`` (templates/pytree_types.py), ``"dataclass"`` or
    ``"registered"``."""
    num_args: int
    """The number of positional arguments."""
    kwarg_names: list[str]
    """The keyword arguments' names, in the captured order."""
    positional_leaves: bool
    """Every argument positional and a model or a tensor: the driver's fast path."""


class OutputsSpec(TypedDict):
    """The result as a pytree."""

    spec: str
    """``treespec_dumps`` of the result."""
    leaves: list[list[Any]]
    """One result leaf kind per leaf (see the module docstring)."""
    types: list[list[str]]
    """As :attr:`InputsSpec.types`."""
    single_tensor: bool
    """The result is the graph's one output: the driver returns it as it is."""


class ConstantSpec(TypedDict):
    """A tensor constant the trace made, passed after the inputs (capturing/graph_attrs.py)."""

    dtype: str
    """``str(tensor.dtype)``."""
    shape: list[int]
    """Sizes."""
    device_type: str
    """``"cpu"``, or ``"cuda"``: placed on the call's CUDA device."""
    data: str
    """base64 of its bytes in C-contiguous order (``""`` when empty)."""


class _CollectivesRequired(TypedDict):
    world_size: int
    """The world size the pair was captured for; checked at load and per call."""
    groups: dict[str, list[int]]
    """``precompile:ranks=...`` group name -> its ranks."""


class Collectives(_CollectivesRequired, total=False):
    """The world of a pair that runs collectives or is sharded (capturing/collectives.py)."""

    backend: str
    """The default group's backend at capture (``gloo``, ``nccl``, ``fake``)."""
    mesh: dict[str, Any]
    """A sharded model's DeviceMesh: ``shape`` and ``dim_names``."""
    mesh_groups: dict[str, int]
    """``precompile:mesh=<dim>`` group name -> the mesh dimension it runs along."""


class Dynamic(TypedDict):
    """Dims marked dynamic at capture (capturing/dynamic_dims.py)."""

    symbols: dict[str, list[Optional[int]]]
    """symbol -> ``[min, max]`` (max None: unbounded), bound from the call's sizes."""
    guards: list[str]
    """Python expressions of the symbols that must hold for every call."""


class DataDependent(TypedDict):
    """Sizes the values decide (``nonzero``, ``x[mask]``, ``.item()``; capturing/unbacked.py)."""

    symbols: list[str]
    """The unbacked symbols the graph binds (``"u0"``), read by the kernels at run time."""
    outputs: dict[str, list[Dim]]
    """Graph output index (as text) -> its traced shape, a size an int or an expression of the symbols."""


class OpLibrary(TypedDict):
    """The custom ops of one namespace the graph calls (capturing/custom_ops.py)."""

    ops: list[str]
    """``"namespace::name"`` of each op."""
    modules: list[str]
    """The modules whose import registers them, imported at load (``"__main__"``: the capture script)."""


class _AmbientRequired(TypedDict):
    autocast: dict[str, str]
    """device type -> autocast dtype, for the capture's device type when autocast was on."""


class Ambient(_AmbientRequired, total=False):
    """The caller's state at capture that the graph has built in."""

    default_dtype: str
    """``str(torch.get_default_dtype())``, where the graph creates a tensor without a dtype."""
    grad_off: bool
    """True where the trace ran under the caller's no_grad/inference_mode and the body did
    not turn grad off itself (capturing/grad_modes.py): a grad-enabled call with an input
    or parameter that requires grad is refused."""
    deterministic: bool
    """True where ``torch.use_deterministic_algorithms(True)`` was on at capture."""


class AssumedState(TypedDict):
    """The Python state the trace read and built in (capturing/assumed_state.py);
    checked per call by the source half's templates/assumed_state.py. Values are
    ``[kind, value]``: ``"="`` a literal, ``"set"`` a set as a sorted list."""

    reads: list[list[Any]]
    """``[model arg, submodule path, [attribute chain], [[attribute, kind, value], ...]]``
    per object whose instance attributes the trace read."""
    hooks: dict[str, list[list[Any]]]
    """``{"modules": [[model arg, path, kind, [hook names]]], "global": [[kind, [names]]]}``."""
    globals: list[list[Any]]
    """``[module, name, kind, value]`` of module-level values the reached code read."""


class _KernelRequired(TypedDict):
    name: str
    """The name Inductor's wrapper calls it by."""
    kind: str
    """``"cpp"`` (a CPython extension module exporting ``kernel``) or ``"triton"``."""
    file: str
    """Its blob in the cache half."""
    sha256: str
    """sha256 hex of the blob."""


class Kernel(_KernelRequired, total=False):
    """A frozen kernel (engines/frozen.py; Triton ones engines/triton_freeze.py). The
    Triton fields are what autotuning chose, for torch's static CUDA launcher."""

    function: str
    """The cubin's entry function."""
    num_warps: int
    """Warps per block."""
    shared: int
    """Dynamic shared memory, bytes."""
    arg_tys: str
    """The launcher's argument type codes."""
    scratch: int
    """Scratch pointer arguments appended to ``arg_tys``."""
    config: str
    """The chosen autotuning config, for messages."""
    launcher: str
    """Inductor's launcher text (grid arithmetic, then ``runner(...)``)."""
    archs: list[dict[str, Any]]
    """With ``cuda-archs``: one binary per architecture (engines/cross_arch.py:
    ``arch``, ``sm``, ``binary``, ``file``, ``sha256``, ``shared``, ``num_warps``, ...)."""


# Why an `eager` pair stands in for another engine: {"from": "frozen", "reason": the
# other engine's failure, as the build reported it} ("from" is a keyword: no class syntax)
Fallback = TypedDict("Fallback", {"from": str, "reason": str})


class _CallRequired(TypedDict):
    target: str
    """The target's name, for messages."""
    device: Device
    """``"cpu"`` or ``"cuda"``: where the capture's tensors were."""
    tracer: Tracer
    """``"export"``, ``"export-strict"`` or ``"make_fx"``: what traced the call."""
    arg_names: list[str]
    """The function's positional parameter names, for messages (may be empty)."""
    inputs: InputsSpec
    """The arguments."""
    outputs: OutputsSpec
    """The result."""
    param_names: list[str]
    """``m<i>.<name>`` of each lifted parameter/buffer of model argument i (tied tensors
    once), parameters then buffers of each model: the order the driver re-derives."""
    params: list[TensorSpec]
    """The lifted tensors, as ``param_names``."""
    tensor_inputs: list[TensorSpec]
    """The tensor arguments' leaves."""
    num_user_outputs: int
    """The graph's result tensors (before the gradients)."""
    grad_param_indices: list[int]
    """The lifted tensors whose gradient the graph returns (a captured ``.backward()``)."""
    mutated_inputs: list[int]
    """The flat inputs the graph writes in place (buffers, KV caches)."""
    reassigned_buffers: list[int]
    """Lifted buffers the call reassigns; the driver copies the graph's trailing outputs
    into them."""
    training: list[list[bool]]
    """``.training`` of each model argument and its submodules, pre-order."""
    module_settings: list[list[str]]
    """Per model argument, ``templates/module_settings.py``'s ``module_settings`` lines: the Python
    settings the trace froze in; compared per call."""
    module_state: list[list[str]]
    """Per model argument, ``"path:attribute"`` the function itself changes (left out of
    ``module_settings``)."""
    constants: list[ConstantSpec]
    """Trace-made tensor constants, appended to the flat inputs."""
    collectives: Optional[Collectives]
    """The collectives' groups, or None."""
    ambient: Ambient
    """Autocast at capture; compared per call."""


class CallConvention(_CallRequired, total=False):
    """What the trace records of a call (capturing/tracing.py): the metadata less what
    the engine and codegen add."""

    dynamic: Dynamic
    """Present when dims were marked dynamic."""
    op_libraries: dict[str, OpLibrary]
    """Op namespace -> the custom ops the graph calls and the modules to import at load."""
    dtensors: list[dict[str, Any]]
    """Per sharded (DTensor) parameter: its index, mesh and placements (capturing/dtensors.py)."""
    assumed: AssumedState
    """The Python state the trace assumed (absent in pairs before it was recorded)."""
    guards: dict[str, Any]
    """The guards TorchDynamo built for the captured call, as checks the source half runs
    per call (precompile_build/capturing/dynamo_guards.py; absent with ``guards =
    "recorded"``): ``params`` (the parameter list), ``roots``, ``checks`` ([label, kind,
    expression, expected, per call, file:line]), ``watched``, ``left``."""


class _PairRequired(CallConvention):
    format: str
    """:data:`FORMAT`."""
    version: int
    """The pair format version, checked at load against :data:`READS`."""
    engine: SourceEngine
    """``"frozen"`` or ``"eager"``; the cache half's envelope says the same."""
    kernels: list[Kernel]
    """The frozen kernels (``[]`` for `eager`)."""


class PairMetadata(_PairRequired, total=False):
    """``PRECOMPILE_METADATA`` of a source half. Keys not listed here are not part of
    the format; a reader must not depend on them."""

    data_dependent: DataDependent
    """Present (frozen engine) when the values decide sizes; CUDA graphs are refused then."""
    cuda_graphs: bool
    """The frozen CUDA kernels replay through CUDA graphs (templates/cuda_graphs.py)."""
    cuda_archs: dict[str, Any]
    """With ``cuda-archs``: ``tuned_on``, ``validated_on``, ``compiled_for``,
    ``binaries``, ``left_out``, ``replaced`` (engines/cross_arch.py)."""
    validation: dict[str, Any]
    """The capture's validation report (validation/validate.py); nothing that runs reads it."""
    fallback: Fallback
    """An `eager` pair written because the frozen engine's compiler failed."""


def version_problem(meta: Any) -> tuple[str, str] | None:
    """The one rule of which source halves this precompile-runtime reads.

    Args:
        meta: a source half's ``PRECOMPILE_METADATA`` (anything: it may be no dict).
    Returns:
        None when ``format`` is :data:`FORMAT` and ``version`` an int (not a bool)
        within :data:`READS`; else ``(finding, advice)``: what is wrong, and which side
        to upgrade or rebuild.
    """
    from ._version import __version__

    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt != FORMAT:
        return (
            f"not a precompile-build source half (PRECOMPILE_METADATA format {fmt!r}, "
            f"not {FORMAT!r})",
            "rebuild the wheel",
        )
    version = meta.get("version")
    low, high = READS
    is_int = isinstance(version, int) and not isinstance(version, bool)
    if is_int and low <= version <= high:
        return None
    reads = f"version {low}" if low == high else f"versions {low} to {high}"
    if is_int and version > high:
        todo = "upgrade precompile-runtime (pip install -U precompile-runtime) to load it"
    else:
        todo = "rebuild the wheel with a current precompile-build"
    return (
        f"the pair is of format version {version!r}, and precompile-runtime "
        f"{__version__} reads {reads}",
        todo,
    )


def check_version(meta: Any, *, where: str) -> None:
    """Refuse a source half this precompile-runtime does not read (:func:`version_problem`).

    Args:
        meta: the source's ``PRECOMPILE_METADATA``.
        where: the package, target and file, for the message.
    Raises:
        PairFormatError: ``format`` is not :data:`FORMAT`, or ``version`` is not an int
            within :data:`READS`; its ``finding`` says which, its ``advice`` which side
            to upgrade or rebuild.
    """
    problem = version_problem(meta)
    if problem is not None:
        raise PairFormatError(problem[0], where=where, advice=problem[1])
