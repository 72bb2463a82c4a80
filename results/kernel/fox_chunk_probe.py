"""FoX and plain softmax on our kernel (no Householder part): fwd+bwd ms and peak MB with the
backward in one chunk and in chunks of 128 to 1024 tokens, and each chunking's largest relative
gradient difference from the first one timed (one chunk; chunks of 128 tokens at 16384 tokens),
bfloat16 q/k/v, the gate's logs logsigmoid(4 + N(0, 1)).

Run on a GPU from results/kernel: `python3 fox_chunk_probe.py > fox_chunks.log`. Each line:
{chunk tokens ("one" = the whole sequence): [ms, MB, difference]} for one shape and way.
"""
import json

import torch
import triton.testing

from modes_probe import calls, forget_gate_logs
from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _inputs, _peak_mb

SHAPES = [(128, 768, 2, 32), (64, 1024, 32, 16), (128, 1024, 16, 16), (64, 2048, 32, 8),
          (128, 2048, 16, 8), (64, 4096, 32, 4), (128, 4096, 16, 4), (64, 16384, 32, 1), (128, 16384, 16, 1)]
SIZES = (0, 128, 256, 512, 1024)
for D, T, H, B in SHAPES:
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    log_fgate = forget_gate_logs(B, T, H)
    for way in ("softmax", "fox"):
        _, fwd_bwd, leaves = calls(way, args, log_fgate, D ** -0.5)
        row, ref = {}, None
        for tokens in SIZES:
            if tokens >= T or (tokens == 0 and T > 4096):
                continue
            tp.ONE_CHUNK_TOKENS = T if tokens == 0 else 0
            tp.CHUNK_TOKENS = tp.LONG_CHUNK_TOKENS = tokens or 512
            tp.LEVEL_CHUNKS = 1 << 20  # one level of chunks
            try:
                for x in leaves:
                    x.grad = None
                fwd_bwd()
                grads = [x.grad.float().clone() for x in leaves]
                if ref is None:
                    ref = grads
                err = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads, ref))
                ms = triton.testing.do_bench(fwd_bwd, warmup=20, rep=100, grad_to_none=leaves, return_mode="median")
                for x in leaves:
                    x.grad = None
                row[tokens or "one"] = (round(ms, 3), round(_peak_mb(fwd_bwd)), float("%.1e" % err))
            except Exception as e:
                row[tokens or "one"] = repr(e)[:120]
        print(json.dumps({"D": D, "T": T, "H": H, "B": B, "way": way, "ms_mb_err": row}), flush=True)
    del args, log_fgate
    torch.cuda.empty_cache()
