"""`pathbench ls` (what is installed) and `pathbench data` (export or show a dataset; the file
formats are described in `pathbench.tasks.export`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pathbench import UserError
from pathbench.runners.training.config import MAX_SEED, parse_sets
from pathbench.tasks import TASKS, default_config, make_task
from pathbench.tasks.export import SUFFIXES, format_examples, save_dataset

MAX_DATA_TOKENS = 1 << 28  # tokens `data` generates at once


@click.command()
@click.option("--models", is_flag=True,
              help="List the attention variants and their parameter counts instead of the tasks.")
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Model size for --models.")
@click.option("--heads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Model size for --models.")
@click.option("--d-model", type=click.IntRange(min=1), default=64, show_default=True,
              help="Model size for --models.")
@click.option("--vocab-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Model size for --models.")
def ls(models, layers, heads, d_model, vocab_size):
    """List the registered tasks: origin, version, description and default config.

    With --models, list the attention variants instead, with the parameter count of a whole
    model of the given size.
    """
    if models:
        click.echo("\n".join(model_listing(layers, heads, d_model, vocab_size)))
    else:
        click.echo("\n".join(task_listing()))


def model_listing(layers: int, heads: int, d_model: int, vocab_size: int) -> list[str]:
    """One line per attention variant; a plugin that fails to load is listed with its error."""
    from pathbench.models import describe_models  # imports torch: only when asked

    rows = describe_models(layers, heads, d_model, vocab_size)
    lines = [
        "Token mixers (origin: built-in, or the plugin package that provides it), parameters "
        f"and recurrent state per sequence at layers={layers} heads={heads} d_model={d_model} "
        f"vocab_size={vocab_size}:"
    ]
    width = max(len(row["name"]) for row in rows)
    for family in dict.fromkeys(row["family"] for row in rows):
        lines.append(f" {family or 'not loaded'}:")
        for row in (row for row in rows if row["family"] == family):
            if row["parameters"] is None:
                lines.append(f"  {row['name']:<{width}}  error: {row['error']}  ({row['origin']})")
                continue
            state = ("grows with length" if row["state_size"] is None
                     else f"{row['state_size']:,} numbers")
            lines.append(f"  {row['name']:<{width}}  {row['parameters']:>10,}  state: {state}  "
                         f"({row['origin']})")
    return lines


def task_listing() -> list[str]:
    """One block per task; a plugin that fails to load is listed with its error."""
    lines = ["Tasks (origin: built-in, or the plugin package that provides the task):"]
    for name, entry in TASKS.entries().items():
        try:
            task_class = TASKS.get(name)
            version, description = task_class.version, task_class.description
            config = " ".join(f"{k}={v}" for k, v in default_config(task_class.Config).items())
        except Exception as exc:  # a broken plugin must not hide the others
            message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            lines += [f"  {name}  ({entry.origin})", f"      error: {message}"]
            continue
        lines += [
            f"  {name}  ({entry.origin}, version {version})",
            f"      {description}",
            f"      defaults: {config}",
            *(f"      {preset} preset: " + " ".join(
                f"{section}.{key}={_as_set(value)}" for section, values in settings.items()
                for key, value in values.items())
              for preset, settings in task_class.presets.items()),
        ]
    return lines


def _as_set(value) -> str:
    """A setting's value as --set writes it: {"sparse": 8192} -> sparse:8192."""
    if isinstance(value, dict):
        return ",".join(f"{key}:{item}" for key, item in value.items())
    return str(value)


@click.command()
@click.argument("task_name", metavar="TASK")
@click.option("--split", default="train", show_default=True, help="Which split to draw.")
@click.option("--num", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Number of sequences.")
@click.option("--seed", type=click.IntRange(min=0, max=MAX_SEED), default=0, show_default=True,
              help="Random seed (each split has its own stream for every seed).")
@click.option("--set", "settings", multiple=True, metavar="task.KEY=VALUE",
              help="Override a task setting (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the dataset to this .npz or .parquet file.")
@click.option("--show", type=click.IntRange(min=1), metavar="K",
              help="Print the first K sequences as tokens, scored positions as input=>target.")
def data(task_name, split, num, seed, settings, out, show):
    """Generate a dataset of TASK: write it (--out) and/or print examples (--show).

    --show prints the first sequences of the same dataset that --out would write.
    """
    keys = [item.partition("=")[0].strip() for item in settings]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise UserError(f"--set {twice} is given twice")
    sets = parse_sets(settings)
    if sets["model"] or sets["train"]:
        section = "model" if sets["model"] else "train"
        raise UserError(f"data takes task settings only (--set task.KEY=VALUE), got "
                        f"--set {section}.{next(iter(sets[section]))}=...")
    task = make_task(task_name, sets["task"])
    if out is None and show is None:
        raise UserError("nothing to do: give --out FILE, --show K, or both")
    if out is not None and out.suffix not in SUFFIXES:
        raise UserError(
            f"unknown file type {out.suffix or '(none)'!r} for --out; use {' or '.join(SUFFIXES)}"
        )
    length = task.generate(1, seed, split).inputs.shape[1]
    if num * length > MAX_DATA_TOKENS:  # inputs and targets, int64: 16 bytes a token
        raise UserError(f"--num {num:,} sequences of {length:,} tokens are {num * length:,} "
                        f"tokens; at most {MAX_DATA_TOKENS:,} (4 GiB of arrays) at a time")
    dataset = task.generate(num, seed, split)
    if out is not None:
        metadata = {"task": task.name, "version": task.version, "config": task.config,
                    "split": split, "seed": seed, "num": num}
        save_dataset(out, dataset, json.dumps(metadata))
        click.echo(f"wrote {num} sequences of {task.name}/{split} (seed {seed}) to {out}")
    if show is not None:
        click.echo(format_examples(task, dataset, split, seed, show))
