"""fwd+bwd ms and peak MB of the Triton kernel at each chunk size, every benchmark shape; then
fwd+bwd ms under each launch setting of the chunk edges' kernels (output: chunk_probe.log).

Run on a GPU from the repository root: `python3 results/kernel/chunk_probe.py > chunk_probe.log`.
Each line: {chunk tokens ("one" = the whole sequence as one chunk): [ms, MB]}, bfloat16 q/k/v.
"""
import json

import triton.testing

from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _fns, _inputs, _peak_mb

shapes = [(32, 512, 2, 64), (128, 768, 2, 32), (64, 1024, 32, 16), (64, 2048, 32, 8), (64, 4096, 32, 4),
          (64, 8192, 32, 2), (64, 16384, 32, 1), (128, 1024, 16, 16), (128, 2048, 16, 8), (128, 4096, 16, 4),
          (128, 8192, 16, 2), (128, 16384, 16, 1)]
for D, T, H, B in shapes:
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    _, fwd_bwd, leaves = _fns("ours", args, D ** -0.5)
    row = {}
    for tokens in (0, 128, 256, 512, 1024):
        if tokens == 0 and T > 4096 or tokens >= T:
            continue
        tp.ONE_CHUNK_TOKENS = tp.FWD_ONE_CHUNK_TOKENS = T if tokens == 0 else 0
        tp.CHUNK_TOKENS = tp.LONG_CHUNK_TOKENS = tokens or 512
        tp.CHUNKED_HEAD_DIMS = (32, 64, 128) if D != 32 else (64, 128)
        try:
            fwd_bwd()
            ms = triton.testing.do_bench(fwd_bwd, warmup=15, rep=60, grad_to_none=leaves)
            for x in leaves:
                x.grad = None
            row[tokens or "one"] = (round(ms, 3), round(_peak_mb(fwd_bwd)))
            for x in leaves:
                x.grad = None
        except Exception as e:
            row[tokens or "one"] = repr(e)[:80]
    print(json.dumps({"D": D, "T": T, "H": H, "B": B, "ms_mb": row}), flush=True)

# launch settings of the split chunk edges' backward (and forward), default chunks
tp.ONE_CHUNK_TOKENS, tp.CHUNK_TOKENS, tp.LONG_CHUNK_TOKENS, tp.CHUNKED_HEAD_DIMS = 1024, 512, 1024, (64, 128)
base = {D: dict(t) for D, t in tp._KERNEL_LAUNCH_64.items()}
for D, T, H, B in [(64, 4096, 32, 4), (128, 4096, 16, 4)]:
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    _, fwd_bwd, leaves = _fns("ours", args, D ** -0.5)
    row = {}
    for kernel in ("edges_bwd", "edges_fwd"):
        for setting in ((4, 1), (4, 2), (8, 1), (8, 2)):
            tp._KERNEL_LAUNCH_64[D] = dict(base[D], **{kernel: setting})
            try:
                fwd_bwd()
                row[f"{kernel} {setting}"] = round(triton.testing.do_bench(fwd_bwd, warmup=15, rep=60, grad_to_none=leaves), 3)
            except Exception as e:
                row[f"{kernel} {setting}"] = repr(e)[:60]
    tp._KERNEL_LAUNCH_64[D] = base[D]
    print(json.dumps({"D": D, "T": T, "launch": row}), flush=True)
