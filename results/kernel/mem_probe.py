"""The live CUDA allocations at the peak of one fwd+bwd, grouped by the line that made them,
as the benchmark measures it (beyond the inputs; output: memory_e105714.log).

Run on a GPU from the repository root, one IMPL:D,T,H,B per case (IMPL ours or fla):
`python3 results/kernel/mem_probe.py ours:128,768,2,32 fla:128,768,2,32`.
"""
import gc
import os
import sys
from collections import defaultdict

import torch
from pathbench.kernels.bench_kernel import _fns, _inputs

HERE = ("triton_path", "bench_kernel", "parallel.py", "path_attn")


def where(frames):
    for f in frames:
        name = os.path.basename(f["filename"])
        if any(h in name for h in HERE):
            return f"{name}:{f['line']} {f['name']}"
    return "other:" + ";".join(f"{os.path.basename(f['filename'])}:{f['line']}" for f in frames[:3])


def probe(impl, D, T, H, B):
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    fwd, fwd_bwd, leaves = _fns(impl, args, D ** -0.5)
    fwd_bwd()
    for x in leaves:
        x.grad = None
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, total, best, best_set = {}, 0, -1, {}
    for ev in snap["device_traces"][0]:
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = (ev["size"], where(ev["frames"]))
            total += ev["size"]
            if total > best:
                best, best_set = total, dict(live)
        elif a == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    print(f"{impl} D={D} T={T} H={H} B={B}: peak beyond inputs {peak / 2**20:.1f} MB; traced peak {best / 2**20:.1f} MB", flush=True)
    by = defaultdict(lambda: [0, 0])
    for size, w in best_set.values():
        by[w][0] += size
        by[w][1] += 1
    for w, (size, n) in sorted(by.items(), key=lambda x: -x[1][0]):
        print(f"  {size / 2**20:8.1f} MB  {n:3d}x  {w}")
    for x in leaves:
        x.grad = None


for spec in sys.argv[1:]:
    impl, shape = spec.split(":")
    probe(impl, *map(int, shape.split(",")))
