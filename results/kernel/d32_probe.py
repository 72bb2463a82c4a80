"""Where the chunked 16-bit backward at D = 32 breaks (output: d32.log). One child process per
variant (a fault ends its CUDA context), with CUDA_LAUNCH_BLOCKING=1: chunks forced at D = 32,
T = 1100, B = H = 2, bfloat16 q/k/v; every kernel launch is named, synchronised, and followed by
the indices of its float arguments that hold NaN or inf (scratch buffers, allocated empty, may
hold garbage); then the relative errors of out, dq, dk, dv, dw and dbeta against float64.

Run on a GPU from the repository root: `python3 results/kernel/d32_probe.py > d32.log`.
A variant is "default"; "KERNEL=num_warps,num_stages" for one kernel's launch setting ("all" for
every kernel); "f16" (float16 q/k/v); or "B1H1" (one sequence, one head). D32_VARIANTS
("a;b;...") replaces the default list.
"""
import os, subprocess, sys

VARIANTS = os.environ.get("D32_VARIANTS", "default;cross_kv=4,2;cross_kv=8,1;edges_bwd=8,1;all=8,1;f16;B1H1").split(";")


def child(variant):
    import torch
    from pathbench.kernels import triton_path as tp
    from pathbench.kernels.bench_kernel import _inputs
    from pathbench.kernels.reference import path_attention_reference
    D = 32
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tp.ONE_CHUNK_TOKENS = tp.FWD_ONE_CHUNK_TOKENS = 0
    tp.CHUNKED_HEAD_DIMS = (D,)
    names = {0: "fwd", 1: "within", 2: "prep_fwd", 3: "prep_bwd", 4: "cross_q", 5: "cross_kv", 6: "edges_fwd", 7: "edges_bwd"}
    over = {}
    if "=" in variant and not variant.startswith("T="):
        k, val = variant.split("=")
        over[k] = tuple(map(int, val.split(",")))
    orig_launch = tp._launch

    def launch(kernel, BT, D_, dtype, nw, ns):
        o = orig_launch(kernel, BT, D_, dtype, nw, ns)
        if kernel in over or ("all" in over and o):
            o = dict(zip(("num_warps", "num_stages"), over.get(kernel, over.get("all"))))
        return o
    tp._launch = launch
    kernels = list(tp._kernels())

    class Sync:
        def __init__(self, i):
            self.i = i

        def __getitem__(self, grid):
            def run(*a, **kw):
                print(f"  launch {names[self.i]} grid={grid} warps={kw.get('num_warps')} stages={kw.get('num_stages')} "
                      f"part={kw.get('PART', kw.get('KEYS'))}", flush=True)
                r = kernels[self.i][grid](*a, **kw)
                torch.cuda.synchronize() if dev == "cuda" else None
                bad = [j for j, x in enumerate(a) if torch.is_tensor(x) and x.is_floating_point() and x.numel() > 1
                       and not torch.isfinite(x).all()]
                print(f"    ok; non-finite args: {bad}", flush=True)
                return r
            return run
    tp._KERNELS = tuple(Sync(i) for i in range(len(kernels)))
    T, B, H = int(os.environ.get("D32_T", 1100)), 2, 2
    if variant.startswith("T="):
        T = int(variant[2:])
    if variant == "B1H1":
        B, H = 1, 1
    q, k, v, w, beta = _inputs(B, T, H, D, dev, seed=1)
    if variant == "f16":
        q, k, v = (x.half() for x in (q, k, v))
    dout = torch.randn(q.shape, device=dev, dtype=torch.float64)
    ref_in = [x.double().requires_grad_(True) for x in (q, k, v, w, beta)]
    ref = path_attention_reference(*ref_in)
    ref_g = torch.autograd.grad(ref, ref_in, dout)
    ins = [x.detach().clone().requires_grad_(True) for x in (q, k, v, w, beta)]
    out = tp.path_attention_triton(*ins)
    g = torch.autograd.grad(out, ins, dout.to(out.dtype))
    rel = lambda x, y: ((x.double() - y).norm() / y.norm().clamp_min(1e-2)).item()
    errs = [rel(out, ref)] + [rel(a, b) for a, b in zip(g, ref_g)]
    print("  errors out dq dk dv dw dbeta: " + " ".join(f"{e:.2e}" for e in errs), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        child(sys.argv[1])
    else:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        for v in VARIANTS:
            print(f"# {v}", flush=True)
            try:
                r = subprocess.run([sys.executable, __file__, v, "--child"], capture_output=True, text=True, env=env, timeout=90)
                out = r.stdout.splitlines()
                # the launches before the last few are all ok: keep the tail
                print("\n".join(out[-14:]))
                if r.returncode:
                    print("  FAILED:", " | ".join(r.stderr.strip().splitlines()[-2:]))
            except subprocess.TimeoutExpired:
                print("  timed out")
