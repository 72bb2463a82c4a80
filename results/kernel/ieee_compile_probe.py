"""Why spike_probe.py stalled with the kernel's float32 products in IEEE float32: compile time.

Compiles, for the H200 (sm_90) and without a GPU, a kernel of REPS float32 products
[64, D] x [D, D] in a row (unrolled, as the kernels' static loops are), with the products in
three-pass tf32 (what the kernel takes for float32 on the GPU) and in IEEE float32, at D = 64
and 128, and prints each compile's seconds and the PTX's length. Run with triton 3.6, the GPU
machine's (its wheel carries ptxas):

    python3 results/kernel/ieee_compile_probe.py REPS
"""

import atexit
import os
import shutil
import sys
import tempfile
import time

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # every compile from scratch
atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"])
import triton  # noqa: E402  (imported once the cache directory is set)
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


@triton.jit
def _products(X, M, Y, D: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, REPS: tl.constexpr):
    rows = tl.arange(0, BT)
    cols = tl.arange(0, D)
    x = tl.load(X + rows[:, None] * D + cols[None, :])
    for i in tl.static_range(REPS):
        m = tl.load(M + i * D * D + cols[:, None] * D + cols[None, :])
        x = tl.dot(x, m, input_precision=PREC)
    tl.store(Y + rows[:, None] * D + cols[None, :], x)


def main(reps):
    aligned = [["tt.divisibility", 16]]
    print(f"triton {triton.__version__}, sm_90, 4 warps, products in a row: {reps}", flush=True)
    for prec in ("tf32x3", "ieee"):
        for D in (64, 128):
            source = ASTSource(
                fn=_products,
                signature={"X": "*fp32", "M": "*fp32", "Y": "*fp32", "D": "constexpr",
                           "BT": "constexpr", "PREC": "constexpr", "REPS": "constexpr"},
                constexprs={"D": D, "BT": 64, "PREC": prec, "REPS": reps},
                attrs={(0,): aligned, (1,): aligned, (2,): aligned})
            start = time.time()
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 4})
            print(f"{prec:7s} D = {D:3d}: compiled in {time.time() - start:6.1f} s, "
                  f"{compiled.asm['ptx'].count(chr(10))} lines of PTX", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
