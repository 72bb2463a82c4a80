"""The kernel with and without its Householder part, beside SDPA: how much of the gap to SDPA
the scans' structure and rate make, and how much the Householder work adds.

At the benchmark's long shapes, bfloat16 q/k/v: our kernel as plain causal softmax (no w, beta
or gate), as FoX (gate only), as PaTH and as PaTH-FoX, and torch SDPA causal. Per shape and way:
forward and fwd+bwd medians (do_bench, launched from Python, as `pathbench bench kernel`), and
each kernel's time in one fwd+bwd (profiler, mean of three calls) with the rest as torch
operations. The plain-softmax way runs the same launches as PaTH, less the Householder factors,
the chunk edges and the carries across blocks.

Run on a GPU from the repository root: `python3 results/kernel/modes_probe.py > modes.log`.
SHAPES ("D,T,H,B;D,T,H,B") in the environment replaces the default shapes.
"""
import json

import torch
import triton.testing

from kernel_resources import kernel_times, shapes_from_env
from pathbench.kernels.bench_kernel import LONG_SHAPES, _fns, _inputs
from pathbench.kernels.triton_path import path_attention_triton

SHAPES = shapes_from_env(LONG_SHAPES)
WAYS = ("softmax", "fox", "path", "path_fox", "sdpa")


def calls(way, args, log_fgate, scale):
    """(forward, fwd+bwd, leaves) for one way."""
    if way == "sdpa":
        return _fns("sdpa", args, scale)
    q, k, v, w, beta = args
    hh = way in ("path", "path_fox")
    gate = log_fgate if way in ("fox", "path_fox") else None
    leaves = [q, k, v] + ([w, beta] if hh else []) + ([gate] if gate is not None else [])
    do = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            return path_attention_triton(q, k, v, w if hh else None, beta if hh else None, gate, scale)

    def fwd_bwd():
        path_attention_triton(q, k, v, w if hh else None, beta if hh else None, gate, scale).backward(do)

    return fwd, fwd_bwd, leaves


def forget_gate_logs(B, T, H):
    """log_fgate [B, T, H] (float32, seeded) with gates near 1, as trained FoX models start."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    return torch.nn.functional.logsigmoid(
        4.0 + torch.randn(B, T, H, device="cuda", generator=gen)).requires_grad_(True)


def kernel_ms(fwd_bwd, leaves):
    """Each Triton kernel's ms in one fwd+bwd, and the other CUDA work's as "torch"."""
    ms, _, other = kernel_times(fwd_bwd, leaves)
    if other:
        ms["torch"] = other
    return {name: round(t, 3) for name, t in sorted(ms.items())}


def main():
    for D, T, H, B in SHAPES:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        log_fgate = forget_gate_logs(B, T, H)
        for way in WAYS:
            fwd, fwd_bwd, leaves = calls(way, args, log_fgate, D ** -0.5)
            fwd_bwd()  # compile outside the timings
            row = dict(D=D, T=T, H=H, B=B, way=way,
                       fwd_ms=round(triton.testing.do_bench(fwd, warmup=20, rep=100, return_mode="median"), 3),
                       fwd_bwd_ms=round(triton.testing.do_bench(fwd_bwd, warmup=20, rep=100, grad_to_none=leaves,
                                                                return_mode="median"), 3))
            if way != "sdpa":
                row["kernel_ms"] = kernel_ms(fwd_bwd, leaves)
            print(json.dumps(row), flush=True)
            for x in leaves:
                x.grad = None
        del args, log_fgate
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
