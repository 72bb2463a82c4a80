"""The chunked 16-bit backward against float64 per head size, dtype, gate and launch setting
(output: chunk16.log): chunks forced (512 tokens; at D = 16 and 32 too where CHUNKED_HEAD_DIMS
takes them), T = 1100, B = H = 2. One child process per job, several at a time, each with
CUDA_LAUNCH_BLOCKING=1; every kernel launch is synchronised, and the kernels after which a float
argument holds NaN or inf are named with its index (scratch buffers, allocated empty, may hold
garbage). A line gives the largest error, then those of out, dq, dk, dv, dw, dbeta (and
dlog_fgate with the gate).

Run on a GPU from the repository root with JOBS, a job a line: "D dtype gate|nogate SETTING",
SETTING "default" or items "KERNEL=num_warps,num_stages" ("all" for every kernel) joined by "/":
`JOBS="32 float16 nogate default" python3 results/kernel/chunk16_probe.py > chunk16.log`.
"""
import os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor


def child(D, dtype_name, gate, variant):
    import torch
    import torch.nn.functional as F
    from pathbench.kernels import triton_path as tp
    from pathbench.kernels.reference import path_attention_reference
    D, gate = int(D), gate == "gate"
    dtype = getattr(torch, dtype_name)
    tp.ONE_CHUNK_TOKENS = tp.FWD_ONE_CHUNK_TOKENS = 0
    names = ["fwd", "within", "prep_fwd", "prep_bwd", "cross_q", "cross_kv", "edges_fwd", "edges_bwd"]
    over = {}
    if variant != "default":
        for item in variant.split("/"):
            k, val = item.split("=")
            over[k] = tuple(map(int, val.split(",")))
    orig_launch = tp._launch

    def launch(kernel, BT, D_, dt, nw, ns):
        o = orig_launch(kernel, BT, D_, dt, nw, ns)
        if o and (kernel in over or "all" in over):
            o = dict(zip(("num_warps", "num_stages"), over.get(kernel, over.get("all"))))
        return o
    tp._launch = launch
    kernels = list(tp._kernels())
    bad = []

    class Sync:
        def __init__(self, i):
            self.i = i

        def __getitem__(self, grid):
            def run(*a, **kw):
                r = kernels[self.i][grid](*a, **kw)
                torch.cuda.synchronize()
                nf = [j for j, x in enumerate(a) if torch.is_tensor(x) and x.is_floating_point() and x.numel() > 1
                      and not torch.isfinite(x).all()]
                if nf:
                    bad.append(f"{names[self.i]}{nf}")
                return r
            return run
    tp._KERNELS = tuple(Sync(i) for i in range(len(kernels)))
    g = torch.Generator().manual_seed(1)
    B, T, H = 2, 1100, 2
    q, k, v = (torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=g)
    lf = F.logsigmoid(torch.randn(B, T, H, generator=g) + 2) if gate else None
    ins = [x.cuda() if x is not None else None for x in (q, k, v, w, beta, lf)]
    dout = torch.randn(B, T, H, D, generator=g).double().cuda()
    ref_in = [x.double().requires_grad_(True) if x is not None else None for x in ins]
    ref = path_attention_reference(*ref_in)
    rl = [x for x in ref_in if x is not None]
    ref_g = torch.autograd.grad(ref, rl, dout)
    tin = [x.detach().clone().requires_grad_(True) if x is not None else None for x in ins]
    out = tp.path_attention_triton(*tin)
    tl_ = [x for x in tin if x is not None]
    gr = torch.autograd.grad(out, tl_, dout.to(out.dtype))
    rel = lambda x, y: ((x.double() - y).norm() / y.norm().clamp_min(1e-2)).item()
    errs = [rel(out, ref)] + [rel(a, b) for a, b in zip(gr, ref_g)]
    print(f"D={D:<3} {dtype_name:8s} {'gate' if gate else 'nogate':6s} {variant:28s} max={max(errs):.1e}  "
          + " ".join(f"{e:.1e}" for e in errs) + (f"  non-finite after: {' '.join(bad)}" if bad else ""), flush=True)


def run(job):
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    try:
        r = subprocess.run([sys.executable, __file__, *job], capture_output=True, text=True, env=env, timeout=240)
        if r.returncode:
            return f"D={job[0]:<3} {job[1]:8s} {job[2]:6s} {job[3]:28s} FAILED: " + " | ".join(r.stderr.strip().splitlines()[-1:])
        return r.stdout.strip()
    except subprocess.TimeoutExpired:
        return f"{job} timed out"


if __name__ == "__main__":
    if len(sys.argv) == 5:
        child(*sys.argv[1:])
    else:
        jobs = [line.split() for line in os.environ["JOBS"].strip().splitlines()]
        with ThreadPoolExecutor(int(os.environ.get("PARALLEL", "6"))) as ex:
            for line in ex.map(run, jobs):
                print(line, flush=True)
