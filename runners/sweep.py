"""`pathbench sweep`: a grid of runs, resumable, in parallel processes or on Slurm.

A run whose ``result.json`` exists is skipped, unless its status is "failed" (a crash, not an
outcome of training): records are written atomically and only once a run is over, so a sweep
killed at any moment (SIGKILL included) loses nothing written, and running the same command
again finishes the rest and retries the failures.

``--pack N`` trains up to N runs that differ only in seed and learning rate as one model
(``pathbench.models.pack``): a small model's step is hundreds of kernels too small to fill a
GPU, and a pack's kernels do the work of all its runs in less time than they take one by one.
Models large enough to fill the GPU gain nothing and need N times the memory. Every run still
has its own record, exactly as if it had trained alone.

The parts: `pathbench.runners.grid` (grids and sweep files), `pathbench.runners.schedule`
(which pack goes next, --until-solved), `pathbench.runners.executors` (this process, local
worker processes, Slurm); this module resolves the grids and holds the command.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import click
from tqdm import tqdm

from pathbench import UserError
from pathbench.files import check_writable
from pathbench.runners.config import DEVICES, resolve_device, run_id
from pathbench.runners.executors import (
    EXECUTORS,
    LocalPool,
    parse_slurm_params,
    run_here,
    run_slurm,
)
from pathbench.runners.grid import Grid, apply_values, find_sweep_file, load_sweep_file, parse_grid_options
from pathbench.runners.run import shared_options
from pathbench.runners.schedule import Schedule, is_done

# The outcome counted when a sweep training in its own process stops because a failed run left
# that process unable to use the GPU (workers in separate processes are replaced instead).
GPU_LOST = "stopped (GPU lost)"
SKIPPED = "skipped (solved at fewer layers)"
# The order of the outcomes in the closing summary, whatever order the runs ended in.
OUTCOMES = ("ok", "diverged", "failed", "lost", GPU_LOST, SKIPPED, "already done")


def summary_line(counts: Counter) -> str:
    """"N ok, N lost, ..." in the order of OUTCOMES (any other outcome after them, by name)."""
    order = [*OUTCOMES, *sorted(set(counts) - set(OUTCOMES))]
    return ", ".join(f"{counts[key]} {key}" for key in order if counts[key])


def run_grids(grids: list[Grid], *, out: Path, device: str, workers: int, executor: str,
              slurm_params: dict, dry_run: bool = False) -> Counter:
    """Resolve every grid, skip finished runs, run the rest (in packs of up to each grid's
    ``pack`` runs); returns counts by outcome."""
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    device = resolve_device(device) if executor == "local" else device
    if device == "auto":  # on Slurm the compute node decides; presets must then be explicit
        device = "cuda"
    planned = [(grid, grid.configs(device)) for grid in grids]
    if not dry_run:
        check_writable(out)
    total = sum(len(configs) for _, configs in planned)
    counts: Counter = Counter()
    done: set[str] = set()
    for grid, configs in planned:
        done_here = {run_id(config) for config in configs
                     if is_done(out / run_id(config), set_aside=not dry_run)}
        done |= done_here
        counts["already done"] += len(done_here)
        click.echo(f"sweep {grid.task}: {len(configs)} runs, {len(done_here)} already done",
                   err=True)
    if dry_run:
        # what a run would do now: skip a deeper layer count already known to be unnecessary
        dropped: set[str] = set()
        schedule = Schedule(planned, out, lambda configs: dropped.update(map(run_id, configs)),
                            dry_run=True)
        packs = []
        while (pack := schedule.next_pack()) is not None:
            packs.append([run_id(config) for config in pack])
            for config in pack:  # as if it had ended without a record
                schedule.ended(run_id(config))
        for _, configs in planned:
            for config in configs:
                name = run_id(config)
                needless = name in dropped and name not in schedule.handed_out
                mark = "done" if name in done else "skip" if needless else "todo"
                reason = "  (solved at fewer layers)" if mark == "skip" else ""
                click.echo(f"{mark}  {name}{reason}")
        if executor == "slurm":
            click.echo(f"{len(packs)} Slurm jobs, at most {workers} at a time:")
            for number, names in enumerate(packs, 1):
                click.echo(f"job {number}: {', '.join(names)} (pack of {len(names)})")
        return counts

    bar = tqdm(total=total, initial=counts["already done"], desc="sweep", unit="run",
               dynamic_ncols=True)

    def skip(configs: list[dict]) -> None:
        counts[SKIPPED] += len(configs)
        bar.total -= len(configs)
        bar.refresh()

    schedule = Schedule(planned, out, skip)

    def report(name: str, summary: dict | None) -> None:
        status = summary["status"] if summary else "lost"
        counts[status] += 1
        if summary and status != "ok":  # lost runs: the executor says why, once per job
            tqdm.write(f"{name}: {status}: {summary['reason']}", file=sys.stderr)
        bar.update(1)
        bar.set_postfix({key: value for key, value in counts.items() if key != "already done"})
        schedule.ended(name)

    # One worker trains in this process; more are separate processes.
    remaining = total - counts["already done"]
    pool = (LocalPool(min(workers, remaining))
            if executor == "local" and workers > 1 and remaining else None)
    try:
        if pool is not None:
            pool.run(schedule.next_pack, out, report)
        elif executor == "local":
            if not run_here(schedule.next_pack, out, report):
                counts[GPU_LOST] += 1
        else:
            run_slurm(schedule.next_pack, out, workers, slurm_params, report)
    finally:
        if pool is not None:
            pool.close()
        bar.close()
    return counts


@click.command()
@click.argument("task", required=False)
@click.option("--models", default=None, help="Attention variants, comma-separated (path,rope).")
@click.option("--layers", default=None, help="Layer counts: 1-6, 1,2,4 or 1-3,6.")
@click.option("--heads", default=None, help="Head counts, e.g. 1,2.")
@click.option("--lrs", default=None, help="Learning rates, e.g. 1e-3,3e-4.")
@click.option("--seeds", default="0", show_default=True, help="Seeds, e.g. 0-2.")
@click.option("--grid", "grid_options", multiple=True, metavar="SECTION.KEY=V1,V2",
              help="Also sweep any task./model./train. setting (repeatable).")
@click.option("--until-solved", is_flag=True, default=None,
              help="Stop adding layers to a model once it solves the task.")
@shared_options
@click.option("--workers", type=int, default=1, show_default=True,
              help="Runs (or packs) trained at once: local processes, or concurrent Slurm jobs.")
@click.option("--pack", type=int, default=None,
              help="Train up to N runs that differ only in seed and learning rate as one "
                   "batched model (keeps a GPU busy with small models). Default 1.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: worker processes here; slurm: one job per pack through submitit.")
@click.option("--slurm", "slurm_options", multiple=True, metavar="KEY=VALUE",
              help="submitit executor parameter, e.g. slurm_partition=gpu (repeatable).")
@click.option("--file", "sweep_file", default=None,
              help="Run the sweeps a TOML file defines (a path, or a shipped name: paper).")
@click.option("--dry-run", is_flag=True,
              help="List the runs as done, todo or skip (solved at fewer layers), and with "
                   "--executor slurm the jobs they go in; run none.")
@click.pass_context
def sweep(ctx, task, models, layers, heads, lrs, seeds, grid_options, until_solved, d_model,
          steps, batch_size, device, preset, out, sets, workers, pack, executor, slurm_options,
          sweep_file, dry_run):
    """Run a grid of runs over TASK, or the sweeps a --file defines.

    A run whose result.json exists is skipped, so running the same command again resumes an
    interrupted sweep. Exit status 1 if runs were lost: a worker died, or a Slurm job ended,
    before finishing them.
    """

    def given(name):
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    grid_values = dict(models=models, layers=layers, heads=heads, lrs=lrs, d_model=d_model,
                       steps=steps, batch_size=batch_size, preset=preset,
                       grid=parse_grid_options(grid_options) or None,
                       until_solved=until_solved, seeds=seeds, pack=pack)
    if sweep_file is not None:
        if task is not None:
            raise UserError("give either TASK or --file, not both")
        settings, grids = load_sweep_file(find_sweep_file(sweep_file))
        overrides = {key: value for key, value in grid_values.items()
                     if given("grid_options" if key == "grid" else key)}
        for grid in grids:
            apply_values(grid, "--", **overrides)
            grid.sets = [*grid.sets, *sets]
        out = out if given("out") else Path(settings.get("out", out))
        workers = workers if given("workers") else settings.get("workers", workers)
        device = device if given("device") else settings.get("device", device)
        executor = executor if given("executor") else settings.get("executor", executor)
        if device not in DEVICES or executor not in EXECUTORS:
            raise UserError(f"sweep file: device must be one of {', '.join(DEVICES)} and "
                            f"executor one of {', '.join(EXECUTORS)}")
    else:
        if task is None:
            raise UserError("give a TASK to sweep over, or --file NAME")
        grids = [apply_values(Grid(task=task, sets=list(sets)), "--", **grid_values)]

    counts = run_grids(grids, out=out, device=device, workers=workers, executor=executor,
                       slurm_params=parse_slurm_params(slurm_options), dry_run=dry_run)
    if dry_run:
        return
    click.echo(f"sweep finished: {summary_line(counts) or 'nothing to do'}; records in {out}")
    if counts["lost"]:
        click.echo(f"{counts['lost']} runs did not finish; run the same command again to finish "
                   f"them", err=True)
        sys.exit(1)
    if counts[GPU_LOST]:
        click.echo("the sweep stopped: a failed run left this process unable to use the GPU; "
                   "run the same command again to go on", err=True)
        sys.exit(1)
