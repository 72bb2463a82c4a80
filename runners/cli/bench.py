"""`pathbench bench`: benchmarks that print tables (speed and memory are measured there, never
asserted in tests). Each command's work is in `pathbench.runners.bench`."""

from __future__ import annotations

from pathlib import Path

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


def _names(known):
    def parse(ctx, param, value):
        names = [name.strip() for name in value.split(",") if name.strip()]
        unknown = [name for name in names if name not in known()]
        if not names or unknown:
            raise click.BadParameter(f"unknown {unknown[0] if unknown else '(none)'!r}; valid: "
                                     f"{', '.join(known())}")
        return names
    return parse


def _name(known):
    def parse(ctx, param, value):
        if value not in known():
            raise click.BadParameter(f"unknown {value!r}; valid: {', '.join(known())}")
        return value
    return parse


def _shape_names():
    from pathbench.runners.bench.train import SHAPES

    return list(SHAPES)


def _attention_names():
    from pathbench.models import ATTENTIONS

    return ATTENTIONS.names()


@bench.command("train")
@click.option("--shapes", default="a5-12-L4", show_default=True, callback=_names(_shape_names),
              help="Shapes, comma-separated: flipflop-L1, flipflop-L2, a5-12-L1..L6, "
                   "a5-32-L1..L6, mqrar-2, smoke (tiny, for a CPU).")
@click.option("--attentions", default="path,rope", show_default=True,
              callback=_names(_attention_names), help="Attention variants, comma-separated.")
@click.option("--packs", default="1", show_default=True, callback=_int_list,
              help="Pack sizes (runs trained as one model), comma-separated.")
@click.option("--steps", default=600, show_default=True, type=click.IntRange(min=2),
              help="Training steps of each measurement.")
@click.option("--interval", default=200, show_default=True, type=click.IntRange(min=1),
              help="Steps between the validation checks the time is read at.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
@click.option("--against", default=None, metavar="REV",
              help="Also measure the engine of git revision REV (e.g. HEAD~3), or of the "
                   "checkout in folder REV, side by side.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the rows as CSV here.")
def train(shapes, attentions, packs, steps, interval, device, against, out):
    """Run-steps a second of the trainer per shape, attention and pack size, with peak GPU
    memory per run and the model's arithmetic rate as a fraction of the device's matmul rate."""
    from pathbench import UserError
    from pathbench.runners.bench.train import bench_train
    from pathbench.runners.training.config import resolve_device

    if steps < 2 * interval:
        raise UserError(f"--steps must be at least twice --interval ({interval}), got {steps}: "
                        f"the time is read between two validation checks")
    if against is not None and not against.strip():
        raise UserError("--against is empty: give a git revision (e.g. HEAD~3) or the folder "
                        "of a pathbench checkout")
    bench_train(shapes, attentions, packs, steps, interval, resolve_device(device), against,
                out, echo=click.echo)


@bench.command("step")
@click.option("--shape", default="a5-12-L4", show_default=True, callback=_name(_shape_names),
              help="One of bench train's shapes.")
@click.option("--attention", default="path", show_default=True,
              callback=_name(_attention_names))
@click.option("--pack", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1),
              help="Steps timed, after compilation and capture.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
@click.option("--backend", default="auto", show_default=True,
              help="The models' model.backend setting: which implementation computes the "
                   "attention (e.g. torch or triton for path).")
def step(shape, attention, pack, steps, device, backend):
    """Where a training step's time goes: ms a step, the device's busy share of it, and the
    busy time by kind of kernel (matrix products, attention, fused elementwise, ...)."""
    from pathbench.runners.bench.step import bench_step
    from pathbench.runners.training.config import resolve_device

    bench_step(shape, attention, pack, resolve_device(device), steps, backend, echo=click.echo)

