"""Options that several commands share."""

from __future__ import annotations

from pathlib import Path

import click

from pathbench.runners.training import store
from pathbench.runners.training.config import DEVICES, PRESETS


def _folder(ctx, param, value) -> Path:
    if value == "":  # Path("") is the current folder: runs would land among its files
        raise click.BadParameter("must name a folder, got an empty string")
    return Path(value)


def shared_options(command):
    """``run`` and ``sweep`` (the sweep adds its grid options): sizes, device, preset, out,
    --set."""
    options = [
        click.option("--d-model", type=int, default=None, help="Model width (task default)."),
        click.option("--steps", type=int, default=None, help="Training steps (task default)."),
        click.option("--batch-size", type=int, default=None,
                     help="Sequences per step (task default)."),
        click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
                     help="Where to train; auto picks cuda when a GPU is visible."),
        click.option("--preset", type=click.Choice(PRESETS), default=None,
                     help="Setting size: paper, or the smaller cpu one. Default: paper on cuda, "
                          "cpu on cpu."),
        click.option("--out", type=click.Path(file_okay=False), callback=_folder,
                     default=store.DEFAULT_OUT, show_default=True,
                     help="Directory that receives the run directories."),
        click.option("--set", "sets", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="Override any task., model. or train. setting (repeatable)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def filter_options(command):
    """``results`` and ``plot``: which runs to show."""
    options = [
        click.option("--task", default=None, help="Only these tasks (comma-separated)."),
        click.option("--model", default=None, help="Only these models (comma-separated)."),
        click.option("--layers", default=None, help="Only these layer counts (1-6, 1,2)."),
        click.option("--heads", default=None, help="Only these head counts."),
        click.option("--status", default=None, help="Only runs with this status (ok, ...)."),
        click.option("--where", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="Only runs with this setting, e.g. task.length=16 (repeatable)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
