"""Sweeps: grids of runs, resumable, trained by an executor (parallel processes, Slurm).

A run whose ``result.json`` exists is skipped, unless its status is "failed" (a crash, not an
outcome of training): records are written atomically and only once a run is over, so a sweep
killed at any moment (SIGKILL included) loses nothing written, and running the same command
again finishes the rest and retries the failures.

``--pack N`` trains up to N runs that differ only in seed and learning rate as one model
(``pathbench.models.pack``): a small model's step is hundreds of kernels too small to fill a
GPU, and a pack's kernels do the work of all its runs in less time than they take one by one.
Models large enough to fill the GPU gain nothing and need N times the memory. Every run still
has its own record, exactly as if it had trained alone.

The parts: `grid` (grids and sweep files), `schedule` (which pack goes next, --until-solved),
`executors` (where packs train); this module resolves the grids, skips what is done, scores the
constructions a sweep file names and counts the outcomes.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import click
from tqdm import tqdm

from pathbench import UserError
from pathbench.files import check_writable
from pathbench.runners.sweep.executors import EXECUTORS, GPU_LOST
from pathbench.runners.sweep.grid import ConstructionEntry, Grid
from pathbench.runners.sweep.schedule import Schedule, is_done
from pathbench.runners.training.config import Run, parse_sets, resolve_device

SKIPPED = "skipped (solved at fewer layers)"
# The order of the outcomes in the closing summary, whatever order the runs ended in.
OUTCOMES = ("ok", "diverged", "failed", "lost", GPU_LOST, SKIPPED, "already done")


def summary_line(counts: Counter) -> str:
    """"N ok, N lost, ..." in the order of OUTCOMES (any other outcome after them, by name)."""
    order = [*OUTCOMES, *sorted(set(counts) - set(OUTCOMES))]
    return ", ".join(f"{counts[key]} {key}" for key in order if counts[key])


def dry_run_summary(planned: list[tuple[Grid, list[Run]]], marks: dict[str, str]) -> str:
    """The work a dry run found, each run counted once: runs to train and their step caps
    summed (an upper bound before early stops; seeds a depth search adds and longer budgets
    come on top), runs skipped and done."""
    runs = {run.run_id: run for _, grid_runs in planned for run in grid_runs}
    todo = [run for name, run in runs.items() if marks[name] == "todo"]
    counted = Counter(marks.values())
    run_steps = sum(run.train.steps for run in todo)
    return (f"dry run: {len(todo)} runs to train, {run_steps:,} run-steps at their step caps "
            f"(early stops end runs sooner; seeds and longer budgets that depth searches add "
            f"come on top), {counted['skip']} to skip, {counted['done']} done")


def run_grids(grids: list[Grid], *, out: Path, device: str, workers: int, executor: str,
              slurm_params: dict, dry_run: bool = False) -> Counter:
    """Resolve every grid, skip finished runs, run the rest with the named executor (in packs
    of up to each grid's ``pack`` runs); returns counts by outcome."""
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    runner = EXECUTORS.get(executor)(workers, slurm_params)
    # a dry run plans for a GPU from anywhere: it trains nothing
    device = device if dry_run and device == "cuda" else runner.device(device)
    planned = [(grid, grid.runs(device)) for grid in grids]
    if not dry_run:
        check_writable(out)
    total = sum(len(runs) for _, runs in planned)
    counts: Counter = Counter()
    done: set[str] = set()
    for grid, runs in planned:
        done_here = {run.run_id for run in runs
                     if is_done(out / run.run_id, set_aside=not dry_run)}
        done |= done_here
        counts["already done"] += len(done_here)
        settings = f" ({', '.join(grid.sets)})" if grid.sets else ""
        click.echo(f"sweep {grid.task}{settings}: {len(runs)} runs, {len(done_here)} already "
                   f"done", err=True)
    if dry_run:
        # what a run would do now: skip a deeper layer count already known to be unnecessary
        dropped: set[str] = set()
        schedule = Schedule(planned, out, lambda runs: dropped.update(run.run_id for run in runs),
                            dry_run=True)
        packs = []
        while (pack := schedule.next_pack()) is not None:
            packs.append([run.run_id for run in pack])
            for run in pack:  # as if it had ended without a record
                schedule.ended(run.run_id)
        marks: dict[str, str] = {}
        for _, runs in planned:
            for run in runs:
                name = run.run_id
                needless = name in dropped and name not in schedule.handed_out
                mark = "done" if name in done else "skip" if needless else "todo"
                reason = "  (solved at fewer layers)" if mark == "skip" else ""
                click.echo(f"{mark}  {name}{reason}")
                marks[name] = mark
        for line in runner.plan(packs):
            click.echo(line)
        click.echo(dry_run_summary(planned, marks), err=True)
        return counts

    bar = tqdm(total=total, initial=counts["already done"], desc="sweep", unit="run",
               dynamic_ncols=True)

    def skip(runs: list[Run]) -> None:
        counts[SKIPPED] += len(runs)
        bar.total -= len(runs)
        bar.refresh()

    def add(runs: list[Run]) -> None:  # seeds added to a depth whose seeds disagree
        bar.total += len(runs)
        bar.refresh()

    schedule = Schedule(planned, out, skip, add=add)

    def report(name: str, summary: dict | None) -> None:
        status = summary["status"] if summary else "lost"
        counts[status] += 1
        if summary and status != "ok":  # lost runs: the executor says why, once per job
            tqdm.write(f"{name}: {status}: {summary['reason']}", file=sys.stderr)
        bar.update(1)
        bar.set_postfix({key: value for key, value in counts.items() if key != "already done"})
        schedule.ended(name)

    try:
        stopped = runner.run(schedule.next_pack, out, report, total - counts["already done"])
    finally:
        bar.close()
    if stopped is not None:
        counts[stopped] += 1
    return counts


def score_constructions(entries: list[ConstructionEntry], *, out: Path, device: str,
                        dry_run: bool = False) -> Counter:
    """Score each construction a sweep file names (`pathbench construct`'s work) unless its
    record exists; with ``dry_run``, list each as done or todo. Counts by outcome."""
    counts: Counter = Counter()
    if not entries:
        return counts
    from pathbench.runners.training.construction import (  # imports torch
        construction_for,
        construction_run,
        record_id,
        score_construction,
    )

    device = device if dry_run and device == "cuda" else resolve_device(device)
    for entry in entries:
        construction = construction_for(entry.task)
        run = construction_run(construction, parse_sets(entry.sets), device, entry.preset)
        name = record_id(construction, run)
        if is_done(out / name, set_aside=not dry_run):
            counts["already done"] += 1
            if dry_run:
                click.echo(f"done  {name}")
            continue
        if dry_run:
            click.echo(f"todo  {name}  (construction: scored, not trained)")
            continue
        click.echo(f"scoring {construction.name} on {entry.task} ({construction.claim})",
                   err=True)
        record = score_construction(construction, run, out)
        counts[record["status"]] += 1
    return counts
