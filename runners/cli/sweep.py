"""`pathbench sweep`: a grid of runs, or the grids a sweep file defines
(`pathbench.runners.sweep`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pathbench import UserError
from pathbench.runners.cli.options import shared_options
from pathbench.runners.sweep.executors import EXECUTORS, parse_slurm_params
from pathbench.runners.sweep.grid import (
    Grid,
    apply_values,
    find_sweep_file,
    load_sweep_file,
    parse_grid_options,
)
from pathbench.runners.sweep.orchestrate import (
    GPU_LOST,
    run_grids,
    score_constructions,
    summary_line,
)
from pathbench.runners.training.config import DEVICES


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
@click.option("--max-seeds", type=int, default=None,
              help="With --until-solved: a depth whose seeds disagree on val (some solve, some "
                   "not) gets more seeds, up to this many, before the search goes on.")
@click.option("--max-steps", type=int, default=None,
              help="With --until-solved: a depth not solved while some runs were still "
                   "improving at their step cap trains again with twice the steps, up to this.")
@shared_options
@click.option("--workers", type=int, default=1, show_default=True,
              help="Runs (or packs) trained at once: local processes, or concurrent Slurm jobs.")
@click.option("--pack", default=None, metavar="auto|N", callback=lambda ctx, param, value:
              value if value in (None, "auto") or not value.isdigit() else int(value),
              help="Train up to N runs that differ only in seed and learning rate as one "
                   "batched model (keeps a GPU busy with small models). Default auto: on a "
                   "GPU a cell's runs (seeds x learning rates) together, as memory allows; on "
                   "a CPU 1.")
@click.option("--executor", type=click.Choice(EXECUTORS.names()), default="local", show_default=True,
              help="local: worker processes here; slurm: one job per pack through submitit.")
@click.option("--slurm", "slurm_options", multiple=True, metavar="KEY=VALUE",
              help="submitit executor parameter, e.g. slurm_partition=gpu (repeatable).")
@click.option("--file", "sweep_file", default=None,
              help="Run the sweeps a TOML file defines (a path, or a shipped name: paper).")
@click.option("--dry-run", is_flag=True,
              help="List the runs as done, todo or skip (solved at fewer layers), and with "
                   "--executor slurm the jobs they go in; run none.")
@click.pass_context
def sweep(ctx, task, models, layers, heads, lrs, seeds, grid_options, until_solved, max_seeds,
          max_steps, d_model,
          steps, batch_size, device, preset, out, sets, workers, pack, executor, slurm_options,
          sweep_file, dry_run):
    """Run a grid of runs over TASK, or the sweeps a --file defines.

    A run whose result.json exists is skipped, so running the same command again resumes an
    interrupted sweep. Exit status 1 if runs were lost (a worker died, or a Slurm job ended,
    before finishing them) or every run trained failed.
    """

    def given(name):
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    grid_values = dict(models=models, layers=layers, heads=heads, lrs=lrs, d_model=d_model,
                       steps=steps, batch_size=batch_size, preset=preset,
                       grid=parse_grid_options(grid_options) or None,
                       until_solved=until_solved, max_seeds=max_seeds, max_steps=max_steps,
                       seeds=seeds, pack=pack)
    constructions = []
    if sweep_file is not None:
        if task is not None:
            raise UserError("give either TASK or --file, not both")
        settings, grids = load_sweep_file(find_sweep_file(sweep_file))
        constructions = settings["construct"]
        overrides = {key: value for key, value in grid_values.items()
                     if given("grid_options" if key == "grid" else key)}
        for grid in grids:
            apply_values(grid, "--", **overrides)
            # the command line's --set replaces the file's of the same key
            replaced = {item.partition("=")[0].strip() for item in sets}
            grid.sets = [*(item for item in grid.sets
                           if item.partition("=")[0].strip() not in replaced), *sets]
        out = out if given("out") else Path(settings.get("out", out))
        workers = workers if given("workers") else settings.get("workers", workers)
        device = device if given("device") else settings.get("device", device)
        executor = executor if given("executor") else settings.get("executor", executor)
        if device not in DEVICES or executor not in EXECUTORS.names():
            raise UserError(f"sweep file: device must be one of {', '.join(DEVICES)} and "
                            f"executor one of {', '.join(EXECUTORS.names())}")
    else:
        if task is None:
            raise UserError("give a TASK to sweep over, or --file NAME")
        grids = [apply_values(Grid(task=task, sets=list(sets)), "--", **grid_values)]

    counts = run_grids(grids, out=out, device=device, workers=workers, executor=executor,
                       slurm_params=parse_slurm_params(slurm_options), dry_run=dry_run)
    # models with set weights: scored by this process, on its --device
    counts += score_constructions(constructions, out=out, device=device, dry_run=dry_run)
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
    trained = sum(counts[outcome] for outcome in ("ok", "diverged", "failed"))
    if trained and counts["failed"] == trained:
        click.echo(f"every run of the sweep failed ({counts['failed']}); their records say why "
                   f"(pathbench results --runs)", err=True)
        sys.exit(1)
