"""Each Triton kernel's registers, spilled bytes, shared memory and launch setting, its time in
one forward+backward, and the call's times and peak memory, at the benchmark's shapes.

Run on a GPU from the repository root: `python3 results/kernel/kernel_resources.py > resources.log`.
Registers and spills come from the compiled kernels (triton's n_regs and n_spills, per thread),
one entry per distinct launch of a kernel (the preprocessing backward's parts, the chunk edges'
two sides); times from the profiler (mean of three calls, all launches of a kernel together,
and the preprocessing backward's part by part).
"""

import json
import os

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import LONG_SHAPES, TRAIN_SHAPES, _fns, _inputs, _peak_mb

NAMES = {"_path_fwd_kernel": "fwd", "_bwd_within_kernel": "within", "_prep_fwd_kernel": "prep_fwd",
         "_prep_bwd_kernel": "prep_bwd", "_bwd_cross_q_kernel": "cross_q", "_bwd_cross_kv_kernel": "cross_kv",
         "_edges_fwd_kernel": "edges_fwd", "_edges_bwd_kernel": "edges_bwd"}
compiled = {}


def shapes_from_env(default):
    """The probes' shapes (D, T, H, B): from a SHAPES environment variable ("D,T,H,B;D,T,H,B"),
    else default."""
    if "SHAPES" not in os.environ:
        return list(default)
    return [tuple(map(int, x.split(","))) for x in os.environ["SHAPES"].split(";")]


class Recorded:
    """A kernel whose launches record the compiled kernel's resources."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **options):
            result = launch(*args, **options)
            part = options.get("PART", options.get("KEYS"))  # the launches of one kernel differ
            compiled.setdefault(NAMES[self.kernel.fn.__name__], {})[str(part)] = dict(
                regs=result.n_regs, spills=result.n_spills, smem=result.metadata.shared,
                launch=(options.get("num_warps"), options.get("num_stages")))
            return result

        return call


def kernel_times(fwd_bwd, leaves):
    """The CUDA time of one fwd+bwd (profiler, mean of three calls): each Triton kernel's ms,
    the preprocessing backward's launches' microseconds in launch order (all three calls), and
    the other work's ms (torch operations)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            for x in leaves:  # as in do_bench: no gradient accumulation among the torch operations
                x.grad = None
            fwd_bwd()
        torch.cuda.synchronize()
    per_kernel, parts, other = {}, [], 0.0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = NAMES.get(e.name)
            if name:
                per_kernel[name] = per_kernel.get(name, 0.0) + e.device_time / 3e3
                if name == "prep_bwd":
                    parts.append(e.device_time)
            else:
                other += e.device_time / 3e3
    return per_kernel, parts, other


def measure(D, T, H, B):
    """fwd and fwd+bwd ms (do_bench medians), peak MB, each kernel's ms and the rest's (torch
    operations) in one fwd+bwd (profiler, mean of three calls) of the Triton kernel."""
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    fwd, fwd_bwd, leaves = _fns("ours", args, D ** -0.5)
    fwd_bwd()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fwd_bwd, warmup=20, rep=100, grad_to_none=leaves)
    ms_fwd = triton.testing.do_bench(fwd, warmup=20, rep=100)
    for x in leaves:
        x.grad = None
    peak = _peak_mb(fwd_bwd)
    for x in leaves:
        x.grad = None
    per_kernel, parts, other = kernel_times(fwd_bwd, leaves)
    n = len(parts) // 3  # the preprocessing backward's launches a call, in part order
    return dict(fwd_ms=round(ms_fwd, 3), fwd_bwd_ms=round(ms, 3), peak_mb=round(peak), torch_ops_ms=round(other, 3),
                prep_bwd_parts_ms=[round(sum(parts[i::n]) / 3e3, 3) for i in range(n)],
                kernel_ms={name: round(t, 3) for name, t in per_kernel.items()})


def main():
    tp._KERNELS = tuple(Recorded(k) for k in tp._kernels())
    for D, T, H, B in TRAIN_SHAPES + LONG_SHAPES:
        compiled.clear()
        row = measure(D, T, H, B)
        kernel_ms = row.pop("kernel_ms")
        kernels = {name: dict(launches=launches, ms=kernel_ms.get(name, 0.0)) for name, launches in compiled.items()}
        print(json.dumps(dict(D=D, T=T, H=H, B=B, **row, kernels=kernels)), flush=True)


if __name__ == "__main__":
    main()
