"""A kernel module written the way Inductor writes them (torch 2.11-2.13 header and
decorators): the cross-compile worker imports such files in a process without a GPU."""

import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.hints import AutotuneHint, DeviceProperties, ReductionHint, TileHint  # noqa: F401
from torch._inductor.runtime.triton_helpers import libdevice  # noqa: F401

triton_helpers.set_driver_to_gpu()


@triton_heuristics.pointwise(
    size_hints={"x": 1024},
    filename=__file__,
    triton_meta={
        "signature": {
            "in_ptr0": "*fp32",
            "out_ptr0": "*fp32",
            "xnumel": "i32",
            "XBLOCK": "constexpr",
        },
        "device": DeviceProperties(
            type="cuda",
            index=0,
            multi_processor_count=132,
            cc=90,
            major=9,
            regs_per_multiprocessor=65536,
            max_threads_per_multi_processor=2048,
            warp_size=32,
        ),
        "constants": {},
        "configs": [{(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}],
    },
    inductor_meta={
        "grid_type": "Grid1D",
        "autotune_hints": set(),
        "kernel_name": "triton_poi_fused_gelu_0",
        "mutated_arg_names": [],
        "optimize_mem": True,
        "no_x_dim": False,
        "num_load": 1,
        "num_reduction": 0,
    },
    min_elem_per_thread=0,
)
@triton.jit
def triton_poi_fused_gelu_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = 0.5 * tmp0 * (1.0 + libdevice.erf(tmp0 * 0.7071067811865476))
    tl.store(out_ptr0 + (x0), tmp1, xmask)
