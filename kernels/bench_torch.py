"""`pathbench bench torch`: forward + backward time of the two torch PaTH implementations.

Compares the materialised reference (global T x T triangular solve) with the blockwise
implementation (per-block solves) on the CPU, same random inputs, float32, with gate. Each
time is the fastest of several timed calls after a warm-up call (on a shared machine,
interference only ever adds time), the two implementations taking turns.
"""

from __future__ import annotations

import time

import click
import torch
import torch.nn.functional as F

from pathbench.kernels.blockwise import path_attention_blockwise
from pathbench.kernels.reference import path_attention_reference

IMPLEMENTATIONS = {"reference": path_attention_reference, "blockwise": path_attention_blockwise}


def _int_list(ctx, param, value):
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if any(number < 1 for number in numbers):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return numbers


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


@click.command("torch")
@click.option("--lengths", default="256,512,768", show_default=True, callback=_int_list,
              help="Sequence lengths T, comma-separated.")
@click.option("--dims", default="32,64", show_default=True, callback=_int_list,
              help="Head dimensions D, comma-separated.")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--heads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", type=click.IntRange(min=1),
              help="torch CPU threads (default: torch's own choice).")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per measurement (the fastest is shown).")
def bench_torch(lengths, dims, batch, heads, threads, repeats):
    """Time fwd+bwd of the reference and the blockwise torch PaTH attention on the CPU."""
    if threads is not None:
        torch.set_num_threads(threads)
    click.echo(f"PaTH attention fwd+bwd on the CPU, float32, B={batch} H={heads}, "
               f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
               f"fastest of {repeats}")
    click.echo(f"{'D':>4} {'T':>6} {'reference ms':>13} {'blockwise ms':>13} {'speed-up':>9}")
    for dim in dims:
        for length in lengths:
            inputs = random_inputs(batch, length, heads, dim)
            ms = time_fwd_bwd(inputs, repeats)
            click.echo(f"{dim:>4} {length:>6} {ms['reference']:>13.1f} {ms['blockwise']:>13.1f} "
                       f"{ms['reference'] / ms['blockwise']:>8.1f}x")
