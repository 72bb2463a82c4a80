"""fwd+bwd at D = 64 with the forward and the queries-first scan in pairs under 4-warp settings."""
import json
import torch
from triton.testing import do_bench
from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _inputs

settings = [("default", (128,), (4, 2), (128,), (4, 3)), ("fwd pairs 4,3", (64, 128), (4, 3), (128,), (4, 3)),
            ("fwd pairs 4,3, cross_q pairs 4,3", (64, 128), (4, 3), (64, 128), (4, 3)),
            ("fwd pairs 4,3, cross_q pairs 4,2", (64, 128), (4, 3), (64, 128), (4, 2))]
T = 8192
args = [x.requires_grad_(True) for x in _inputs(16384 // T, T, 32, 64, "cuda")]
do = torch.randn_like(args[0])
ref = None
for name, fp, fl, qp, ql in settings:
    tp.QUERY_PAIRS["fwd"], tp._KERNEL_LAUNCH_64[64]["fwd"] = fp, fl
    tp.QUERY_PAIRS["cross_q"], tp._KERNEL_LAUNCH_64[64]["cross_q"] = qp, ql

    def fn():
        return torch.autograd.grad(tp.path_attention_triton(*args, None, 0.125), args, do)

    gs = fn()
    ref = gs if ref is None else ref
    err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(gs, ref))
    ms = do_bench(fn, warmup=5, rep=40, return_mode="median")
    print(json.dumps({"T": T, "setting": name, "fwd_bwd_ms": round(ms, 3), "max_grad_rel_to_default": float(f"{err:.2e}")}), flush=True)
