"""The forward scan at D = 64 in pairs of query blocks under 4-warp settings, against the kernel in use."""
import json
import torch
from triton.testing import do_bench
from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _inputs

settings = [("default", (128,), (4, 2)), ("pairs 4,2", (64, 128), (4, 2)), ("pairs 4,3", (64, 128), (4, 3)),
            ("pairs 8,2", (64, 128), (8, 2))]
for T in (8192, 4096, 16384):
    q, k, v, w, beta = _inputs(16384 // T, T, 32, 64, "cuda")
    ref = None
    for name, pairs, launch in settings:
        tp.QUERY_PAIRS["fwd"] = pairs
        tp._KERNEL_LAUNCH_64[64]["fwd"] = launch
        with torch.no_grad():
            fn = lambda: tp.path_attention_triton(q, k, v, w, beta, None, 0.125)
            out = fn().float()
            ref = out if ref is None else ref
            err = ((out - ref).norm() / ref.norm()).item()
            ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
        print(json.dumps({"T": T, "setting": name, "fwd_ms": round(ms, 3), "rel_to_default": float(f"{err:.2e}")}), flush=True)
