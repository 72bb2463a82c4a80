"""The host's (Python's) time a call against the measured fwd+bwd time, ours and fla-core, at the
training shapes and D = 64, T = 1024; then where our host time goes at D = 128, T = 768
(cProfile; output: host.log). Run on a GPU from the repository root:
`python3 results/kernel/host_probe.py`.
"""
import cProfile
import pstats
import sys
import time

import torch
import triton.testing
from pathbench.kernels.bench_kernel import _fns, _inputs

for D, T, H, B in ((128, 768, 2, 32), (32, 512, 2, 64), (64, 1024, 32, 16)):
    for impl in ("ours", "fla"):
        if impl == "fla" and D == 32:
            continue
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        fwd, fwd_bwd, leaves = _fns(impl, args, D ** -0.5)
        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fwd_bwd, warmup=20, rep=100, grad_to_none=leaves)
        for x in leaves:
            x.grad = None
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # keeps the GPU busy, so that only the host is timed
        t0 = time.perf_counter()
        for _ in range(20):
            fwd_bwd()
            for x in leaves:
                x.grad = None
        host = (time.perf_counter() - t0) / 20 * 1e3
        torch.cuda.synchronize()
        print(f"{impl:5s} D={D} T={T}: fwd+bwd {ms:.3f} ms (do_bench), host {host:.3f} ms a call", flush=True)
        if impl == "ours" and D == 128:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                fwd_bwd()
                for x in leaves:
                    x.grad = None
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
