"""`pathbench construct`: score a model with set weights, and record it beside trained runs."""

from __future__ import annotations

import click

from pathbench.files import check_writable
from pathbench.runners.cli.options import _folder
from pathbench.runners.cli.run import summary_table
from pathbench.runners.training import store
from pathbench.runners.training.config import DEVICES, PRESETS, parse_sets, resolve_device


@click.command()
@click.argument("task")
@click.option("--device", type=click.Choice(DEVICES), default="auto",
              show_default=True, help="Where to evaluate.")
@click.option("--preset", type=click.Choice(PRESETS), default="paper", show_default=True,
              help="Whose evaluation setting: the paper's, or the smaller cpu one.")
@click.option("--out", type=click.Path(file_okay=False), callback=_folder,
              default=store.DEFAULT_OUT, show_default=True,
              help="Directory that receives the record's directory.")
@click.option("--set", "sets", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a task. or train. setting, e.g. task.eval_lengths=4096,16384 or "
                   "train.eval_num=256 (repeatable).")
def construct(task, device, preset, out, sets):
    """Score TASK's construction (a model with set weights; flipflop: two PaTH layers) on
    every evaluation split, as a trained run of the same config is scored, and record it.

    Its record (0 training steps) is named by the construction, e.g. path_construction, so
    `pathbench results` and `plot` show it beside the trained models. Exit status 1 if it
    errs on any scored position of any split.
    """
    from pathbench.runners.training.construction import (  # imports torch
        construction_for,
        construction_run,
        score_construction,
    )

    construction = construction_for(task)
    run = construction_run(construction, parse_sets(sets), resolve_device(device), preset)
    check_writable(out)
    click.echo(f"{construction.name}: {construction.claim}; {preset} evaluation setting on "
               f"{run.device}", err=True)
    record = score_construction(construction, run, out)
    click.echo(f"scored in {record['provenance']['wall_time_s']:.1f} s: {record['run_dir']}")
    click.echo(summary_table(record))
    splits = {"val": record["validation"], **record["metrics"]}
    if any(metrics["accuracy"] < 1.0 for metrics in splits.values()):
        raise SystemExit(1)
