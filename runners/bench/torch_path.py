"""`pathbench bench torch`: forward + backward time of the two torch PaTH implementations.

Compares the materialised reference (global T x T triangular solve) with the blockwise
implementation (per-block solves) on the CPU, same random inputs, float32, with gate. Each
time is the fastest of several timed calls after a warm-up call (on a shared machine,
interference only ever adds time), the two implementations taking turns.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from pathbench.kernels.blockwise import path_attention_blockwise
from pathbench.kernels.reference import path_attention_reference

IMPLEMENTATIONS = {"reference": path_attention_reference, "blockwise": path_attention_blockwise}


def time_fwd_bwd(inputs, repeats: int) -> dict[str, float]:
    """Fastest milliseconds of each implementation's forward plus backward to every input.

    The implementations take turns within each repeat, so that a change in the machine's load
    affects them alike.
    """
    times = {name: [] for name in IMPLEMENTATIONS}
    for repeat in range(repeats + 1):  # the first round warms up
        for name, attention in IMPLEMENTATIONS.items():
            leaves = [x.detach().requires_grad_() for x in inputs]
            start = time.perf_counter()
            attention(*leaves).sum().backward()
            if repeat > 0:
                times[name].append(time.perf_counter() - start)
    return {name: 1000 * min(values) for name, values in times.items()}


def random_inputs(batch, length, heads, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, length, heads, dim)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    w = F.normalize(torch.randn(shape, generator=generator), dim=-1)
    beta = 2 * torch.rand(shape[:3], generator=generator)
    log_fgate = F.logsigmoid(torch.randn(shape[:3], generator=generator) + 3)
    return q, k, v, w, beta, log_fgate


def bench_torch(lengths, dims, batch, heads, threads, repeats, echo=print):
    """Time fwd+bwd of the reference and the blockwise torch PaTH attention on the CPU."""
    if threads is not None:
        torch.set_num_threads(threads)
    echo(f"PaTH attention fwd+bwd on the CPU, float32, B={batch} H={heads}, "
               f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
               f"fastest of {repeats}")
    echo(f"{'D':>4} {'T':>6} {'reference ms':>13} {'blockwise ms':>13} {'speed-up':>9}")
    for dim in dims:
        for length in lengths:
            inputs = random_inputs(batch, length, heads, dim)
            ms = time_fwd_bwd(inputs, repeats)
            echo(f"{dim:>4} {length:>6} {ms['reference']:>13.1f} {ms['blockwise']:>13.1f} "
                       f"{ms['reference'] / ms['blockwise']:>8.1f}x")
