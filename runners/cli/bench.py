"""`pathbench bench`: benchmarks that print tables (speed and memory are measured there, never
asserted in tests). Each command's work is in `pathbench.runners.bench`."""

from __future__ import annotations

import click

from pathbench.runners.bench.kernel import IMPLS


@click.group()
def bench():
    """Benchmarks that print tables (speed and memory are measured here, never asserted)."""


def _int_list(ctx, param, value):
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if any(number < 1 for number in numbers):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return numbers


@bench.command("data")
@click.option("--num", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Sequences per dataset.")
@click.option("--task", "task_names", multiple=True, metavar="TASK",
              help="Task to time (repeat for several); default: every built-in task.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs per task; the fastest is reported.")
def data(num, task_names, repeat):
    """Print a table of dataset generation times (train split, default configs)."""
    from pathbench.runners.bench.data import bench_data

    bench_data(num, task_names, repeat, echo=click.echo)


@bench.command("torch")
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
def torch_path(lengths, dims, batch, heads, threads, repeats):
    """Time fwd+bwd of the reference and the blockwise torch PaTH attention on the CPU."""
    from pathbench.runners.bench.torch_path import bench_torch

    bench_torch(lengths, dims, batch, heads, threads, repeats, echo=click.echo)


@bench.command("kernel")
@click.option("--path", "out_dir", default="results/kernel", show_default=True,
              help="folder for kernel_bench.csv and kernel_bench.png")
@click.option("--impl", "impls", multiple=True, type=click.Choice(IMPLS),
              help="implementations to time (default: all)")
@click.option("--quick", is_flag=True, help="only T=4096 and the training shapes, fewer repetitions")
@click.option("--compile-only", is_flag=True,
              help="call each implementation once per shape (fills Triton's caches), time nothing")
@click.option("--profile", is_flag=True, help="profile one forward+backward of ours at D=64, T=4096 and exit")
@click.option("--seqlens", default=None, help="comma-separated sequence lengths of the 16K-token shapes "
              "(default: 1024,2048,4096,8192,16384)")
def kernel(out_dir, impls, quick, compile_only, profile, seqlens):
    """Time the Triton PaTH kernel against fla-core and torch SDPA (needs a CUDA GPU)."""
    from pathbench.runners.bench.kernel import bench_kernel

    bench_kernel(out_dir, impls, quick, compile_only, profile, seqlens, echo=click.echo)
