"""User Triton kernels for tests/test_guards.py (triton.jit needs its kernels in a file)."""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, n: tl.constexpr):
    pass


@triton.jit
def mul_kernel(x_ptr, n: tl.constexpr):
    tl.store(x_ptr, 2)


tuned = triton.autotune(configs=[triton.Config({})], key=[])(add_kernel)
