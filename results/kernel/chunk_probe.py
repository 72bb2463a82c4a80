"""fwd+bwd ms and peak MB of the Triton kernel with the backward in one chunk and in chunks of
256, 512, 1024 and 2048 tokens, at every benchmark shape whose head size takes chunks (64 and
128), bfloat16 q/k/v (output: chunk_probe.log).

Run on a GPU from the repository root: `python3 results/kernel/chunk_probe.py > chunk_probe.log`.
Each line: {chunk tokens ("one" = the whole sequence as one chunk): [ms, MB]}, one line per shape
and pass; two passes, so that the spread between them shows. The forward keeps its own rule (one
chunk up to FWD_ONE_CHUNK_TOKENS, beyond that the backward's chunks).
"""
import json
import os

import triton.testing

from pathbench.kernels import triton_path as tp
from kernel_resources import shapes_from_env
from pathbench.kernels.bench_kernel import _fns, _inputs, _peak_mb

SHAPES = shapes_from_env([(128, 768, 2, 32), (64, 1024, 32, 16), (64, 2048, 32, 8), (64, 4096, 32, 4),
                          (64, 8192, 32, 2), (64, 16384, 32, 1), (128, 1024, 16, 16), (128, 2048, 16, 8),
                          (128, 4096, 16, 4), (128, 8192, 16, 2), (128, 16384, 16, 1)])
SIZES = (0, 256, 512, 1024, 2048)  # 0: one chunk
ONE_CHUNK_UP_TO = 4096  # beyond, one chunk is not timed: from 4096 tokens on it is the slowest size
if "SIZES" in os.environ:
    SIZES = tuple(map(int, os.environ["SIZES"].split(",")))

for pass_no in (1, 2):
    for D, T, H, B in SHAPES:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        _, fwd_bwd, leaves = _fns("ours", args, D ** -0.5)
        row = {}
        for tokens in SIZES:
            if tokens == 0 and T > ONE_CHUNK_UP_TO or tokens >= T:
                continue
            tp.ONE_CHUNK_TOKENS = T if tokens == 0 else 0
            tp.CHUNK_TOKENS = tp.LONG_CHUNK_TOKENS = tokens or 512
            tp.LEVEL_CHUNKS = 1 << 20  # one level of chunks
            try:
                fwd_bwd()
                ms = triton.testing.do_bench(fwd_bwd, warmup=25, rep=250, grad_to_none=leaves,
                                             return_mode="median")
                for x in leaves:
                    x.grad = None
                row[tokens or "one"] = (round(ms, 3), round(_peak_mb(fwd_bwd)))
                for x in leaves:
                    x.grad = None
            except Exception as e:
                row[tokens or "one"] = repr(e)[:80]
        print(json.dumps({"pass": pass_no, "D": D, "T": T, "H": H, "B": B, "ms_mb": row}), flush=True)
