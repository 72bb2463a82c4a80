"""Forward ms and fwd+bwd ms of the Triton kernel with the forward in one chunk and in chunks (the
backward's sizes), at D = 64 and 128 from 2048 to 8192 tokens, bfloat16 q/k/v (output:
fwd_chunk_probe.log). The backward keeps its own rule in both.

Run on a GPU from the repository root: `python3 results/kernel/fwd_chunk_probe.py > fwd_chunk_probe.log`.
Each line: {"one" or "chunks": [forward ms, fwd+bwd ms]}, one line per shape and pass; two passes,
so that the spread between them shows.
"""
import json

import triton.testing

from pathbench.kernels import triton_path as tp
from kernel_resources import shapes_from_env
from pathbench.kernels.bench_kernel import _fns, _inputs

SHAPES = shapes_from_env([(64, 2048, 32, 8), (64, 4096, 32, 4), (64, 8192, 32, 2),
                          (128, 2048, 16, 8), (128, 4096, 16, 4), (128, 8192, 16, 2)])

for pass_no in (1, 2):
    for D, T, H, B in SHAPES:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        fwd, fwd_bwd, leaves = _fns("ours", args, D ** -0.5)
        row = {}
        for way in ("one", "chunks"):
            tp.FWD_ONE_CHUNK_TOKENS = T if way == "one" else 0
            fwd_bwd()
            ms = [triton.testing.do_bench(fn, warmup=25, rep=250, grad_to_none=leaves, return_mode="median")
                  for fn in (fwd, fwd_bwd)]
            for x in leaves:
                x.grad = None
            row[way] = [round(x, 3) for x in ms]
        print(json.dumps({"pass": pass_no, "D": D, "T": T, "H": H, "B": B, "ms": row}), flush=True)
