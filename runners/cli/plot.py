"""`pathbench plot`: the paper-style figure of the runs under a directory, an archive or a
records table (`pathbench.runners.analysis.figures`)."""

from __future__ import annotations

from pathlib import Path

import click

from pathbench.files import check_writable
from pathbench.runners.analysis.figures import draw
from pathbench.runners.analysis.records import load_filtered
from pathbench.runners.cli.options import filter_options
from pathbench.runners.cli.results import warn
from pathbench.runners.training import store


@click.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path),
                default=store.DEFAULT_OUT)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Figure path; FILE.png, FILE.pdf and FILE.md (the tables) are written.")
@filter_options
def plot(directory, output, task, model, layers, heads, status, where):
    """Draw paper-style figures of the runs under DIRECTORY (default results/runs)."""
    check_writable(output.parent, "the figure's folder")
    frame = load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status, where=where), warn)
    written, tables = draw(frame, output)
    if tables:
        click.echo(tables)
    for path in written:
        click.echo(f"wrote {path}")
