"""The Triton PaTH kernels compile for a Hopper GPU (sm_90), also on a machine without one.

The CPU tests run the kernels under Triton's interpreter, which executes them as Python: a
construct the interpreter accepts and the compiler rejects (a condition on constexprs written
with `and`, a name bound in one branch only) would pass there and fail only on the GPU. Here
Triton compiles the kernels that one-block sequences and longer ones take, at the head sizes and
flags the GPU uses, down to machine code with the ptxas of Triton's wheel. A fresh interpreter
runs the compilation: kernels defined under TRITON_INTERPRET=1 cannot be compiled.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install -e '.[test]')", allow_module_level=True)

COMPILE = r"""
import itertools
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pathbench.kernels.triton_path.bwd_within import within_scan_kernel
from pathbench.kernels.triton_path.fwd_scan import fwd_scan_kernel
from pathbench.kernels.triton_path.prep_bwd import prep_bwd_kernel
from pathbench.kernels.triton_path.prep_fwd import prep_fwd_kernel

INTS = {"T", "H", "N", "C", "NG", "OS", "VSB", "VST", "VSH", "DOSB", "DOST", "DOSH"}
# bfloat16 data, float16 block products and replayed queries, as for bf16 inputs on the GPU
POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "QT": "*bf16", "KT": "*bf16", "QS": "*bf16",
            "KC": "*bf16", "DO": "*bf16", "O": "*bf16", "DQO": "*bf16", "DKO": "*bf16",
            "MB": "*fp16", "MC": "*fp16", "RS": "*fp16", "SPANS": "*i32"}


def compile_for_hopper(kernel, **constexprs):
    signature = {name: "constexpr" if name in constexprs else "i32" if name in INTS
                 else "fp32" if name == "scale" else POINTERS.get(name, "*fp32")
                 for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    triton.compile(source, target=GPUTarget("cuda", 90, 32))


count = 0
# (D, BT, HALF): the word problems' head size in blocks of 16, and one that takes float16 operands
for (D, BT, half), carried, hh in itertools.product([(32, 16, False), (64, 16, True)], [False, True],
                                                   [True, False]):
    flags = dict(D=D, BT=BT, HAS_HH=hh, HAS_GATE=True, PREC="tf32")
    compile_for_hopper(prep_fwd_kernel, **flags, HPREC="tf32", SAVE_X=True, XPREC="tf32", HALF=half,
                       CARRIED=carried)
    for part in range(3 if hh else 1):
        compile_for_hopper(prep_bwd_kernel, **flags, PART=part, XPREC="tf32", HALF=half,
                           CARRIED=carried)
    count += 1 + (3 if hh else 1)
for (D, QB, adj16), hh in itertools.product([(32, 1, False), (64, 2, False), (128, 2, True)], [True, False]):
    flags = dict(D=D, BT=16, QB=QB, HAS_HH=hh, HAS_GATE=True, PREC="tf32", HH16=True)
    compile_for_hopper(fwd_scan_kernel, **flags)
    compile_for_hopper(within_scan_kernel, **flags, ADJ16=adj16)
    count += 2
print(count)
"""


def test_kernels_compile_for_hopper(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled afresh, not taken from a cache
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["36"]
