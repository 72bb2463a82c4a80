"""`pathbench results`: the tables of the runs under a directory, an archive or a records
table (`pathbench.runners.analysis`)."""

from __future__ import annotations

from pathlib import Path

import click

from pathbench import UserError
from pathbench.runners.analysis.cells import aggregate
from pathbench.runners.analysis.records import load_filtered, records_csv
from pathbench.runners.analysis.tables import FORMATS, display_table, render, results_text
from pathbench.runners.cli.options import filter_options
from pathbench.runners.training import store


def warn(message: str) -> None:
    """One line on stderr: a record skipped, a value left out, runs not finished."""
    click.echo(f"pathbench: warning: {message}", err=True)


@click.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path),
                default=store.DEFAULT_OUT)
@filter_options
@click.option("--metric", default=None, help="Metric to show (default: the primary metric; "
                                             "flipflop also has error).")
@click.option("--all-lrs", is_flag=True, help="A row per learning rate instead of the best.")
@click.option("--runs", "per_run", is_flag=True, help="A row per run, no aggregation.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def results(directory, task, model, layers, heads, status, where, metric, all_lrs, per_run, fmt):
    """Print the results table of the runs under DIRECTORY (default results/runs).

    DIRECTORY may also be a tar archive of run directories (ARCHIVE/FOLDER: one folder of it)
    or a records table written by --format records (a .csv file).
    """
    frame = load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status, where=where), warn)
    if metric is not None and not any(c.endswith(f":{metric}") for c in frame.columns):
        available = sorted({c.split(":", 1)[1] for c in frame.columns if ":" in c})
        raise UserError(f"no metric {metric!r} in these runs; available: {', '.join(available)}")
    if fmt == "records":
        click.echo(records_csv(frame))
        return
    table = frame if per_run else aggregate(frame, metric, best_lr=not all_lrs)
    if fmt == "csv":  # one machine-readable table
        click.echo(render(display_table(table, frame, per_run, as_text=False), fmt))
        return
    click.echo(results_text(frame, table, per_run, fmt))
