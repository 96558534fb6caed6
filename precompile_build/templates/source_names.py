"""Typed stand-ins for the names a serving template reads from the rest of its source half.

codegen.py assembles a source half from blocks (``kernel_loader.py``, ``call_args.py``,
``driver.py``, ...) that share one module namespace with the generated parts
(``PRECOMPILE_METADATA``, ``_graph``, ``_make_call``). Each template imports the names it
takes from the others from here, between ``# stand-ins`` and ``# end stand-ins`` under
``if TYPE_CHECKING:``, so that ruff and type checkers can read it; codegen.py drops that
block when it copies the template, and nothing imports this module at run time. Beside
each name: where the source half defines it.
"""

from __future__ import annotations

import os as _os  # noqa: F401 - kernel_loader.py's, which triton_launcher.py (no imports) uses
import weakref as _weakref  # noqa: F401 - driver.py's
from typing import Any, Callable, Optional

import torch  # noqa: F401 - codegen.py's `import torch` at the top of the file

from precompile_runtime.errors import CallError  # noqa: F401 - driver.py (or its fallback)
from precompile_runtime.pair_format import PairMetadata

from .dict_watch import dict_watcher, watch_models  # noqa: F401 - dict_watch.py, copied in
from .module_settings import module_settings, module_tensors, submodules  # noqa: F401 - copied in
from .pytree_types import register_cache_types  # noqa: F401 - pytree_types.py, copied in
from .state_values import (  # noqa: F401 - state_values.py, copied in
    HOOK_KINDS,
    global_hooks,
    module_hooks,
    state_decoded,
)

# codegen.render: the literal metadata, and the driver's alias of it
PRECOMPILE_METADATA: PairMetadata
_META: PairMetadata

# codegen.graph_source: the captured ATen graph and the object passed as its ``self``
_GRAPH_SELF: Any


def _graph(self: Any, *args: Any) -> Any: ...


# codegen.render (frozen): Inductor's wrapper with the kernels bound
def _make_call(_kernels: dict[str, Any]) -> Callable[[list[Any]], Any]: ...


# kernel_loader.py
def _load_kernels(kernel_dir: str) -> dict[str, Any]: ...
def _serving_guard_on() -> bool: ...


# _arch_rules.py (runtime), copied before the launcher
def _binary_pick(choices: Any, host: Any, force_ptx: bool = False) -> Any: ...
def _binary_force_ptx(value: Optional[str]) -> bool: ...


_FORCE_PTX_ENV: str


# triton_launcher.py
_TritonKernel: Any


# call_args.py
def _flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], list[Any]]: ...
def _tensor_paths(args: tuple, kwargs: dict) -> list[str]: ...
def _rebuild(outs: Any, flat: list[Any]) -> Any: ...


def _check_no_aliases(
    params: list[Any], flat: list[Any], names: Callable[[], list[str]]
) -> None: ...


class _Params(list): ...


_NO_PARAMS: _Params
_N_POS: int
_SIMPLE_ARGS: bool
_MODULE_POS: list[int]
_TENSOR_POS: list[int]
_SINGLE_OUT: bool
_OUT_INPUTS: list[tuple[int, int]]


# op_libraries.py
def _import_op_libraries() -> None: ...


# distributed.py
_DIST: Any
_DTENSORS: dict[int, Any]
_MESH_GROUPS: dict[str, int]


def _check_world() -> Any: ...
def _check_dist() -> None: ...
def _local_params(params: list[Any], names: list[str]) -> tuple[list[Any], Any]: ...
def _use_mesh(params: Any) -> None: ...


# driver.py
_RUNS_BACKWARD: bool


def _check_tensor(t: Any, spec: Any, what: str, check_shape: bool = True) -> None: ...
def _same_strides(t: Any, want: list[int]) -> bool: ...
def _layout_hint(want: list[int], shape: Any) -> str: ...


# dynamic_sizes.py
_DYN: Any


def _check_dynamic(leaves: list[Any]) -> None: ...


# grad_modes.py
_MODES_CHECKED: bool


def _check_modes(params: list[Any], tensors: list[Any]) -> None: ...


# assumed_state.py
_GLOBALS: list[Any]
_HANDLES: Any


def _assumed_full(modules: list[Any]) -> list[Any]: ...
def _assumed_same(watch: list[Any], hook_id: int) -> bool: ...
def _check_globals() -> None: ...
def _state_epoch() -> list[int]: ...
def _arg_label(i: int) -> str: ...
def _param_label(name: str) -> str: ...


# guard_values.py and the generated checks (codegen.guards_code)
from .guard_values import (  # noqa: E402, F401 - guard_values.py, copied in
    _G_ABSENT,
    _g_code_is,
    _g_dataclass_fields,
    _g_holds,
    _g_namedtuple_fields,
    _g_odict_getitem,
    _g_type_dict,
    resolve_roots,
)


def _guards_full(_R: list[Any], *args: Any, **kwargs: Any) -> int: ...
def _guards_call(_R: list[Any], *args: Any, **kwargs: Any) -> int: ...
def _guard_bind(*args: Any, **kwargs: Any) -> dict[str, Any]: ...
def _guards_dicts(_R: list[Any], *args: Any, **kwargs: Any) -> list[Any]: ...
def _guards_watch(_R: list[Any], *args: Any, **kwargs: Any) -> tuple | None: ...
def _guards_slots(_R: list[Any], *args: Any, **kwargs: Any) -> list[Any] | None: ...
def _check_guards(
    args: tuple, kwargs: dict, modules: list[Any], full: bool = False, kinds: Any = None
) -> None: ...


_G_CHECKS: list[Any]

# cuda_graphs.py
_CudaGraphs: Any
