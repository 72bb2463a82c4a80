"""`pathbench ls` (what is installed) and `pathbench data` (export or show a dataset).

Dataset files are self-describing:

- ``.npz``: arrays ``inputs`` and ``targets`` (int64 [num, length], -100 = not scored),
  ``vocab`` (the token strings; ``inputs`` and ``targets`` index into it) and ``metadata`` (a
  JSON string: task, version, config, split, seed, num). Load with ``np.load(path)``.
- ``.parquet``: one row per sequence, list columns ``inputs`` and ``targets``; the vocabulary
  and the metadata are stored in the table's pandas ``attrs`` (``attrs["vocab"]``,
  ``attrs["metadata"]``), which ``pd.read_parquet(path)`` restores.

Files are written to a temporary file in the destination folder and renamed into place, so a
reader never sees a half-written dataset.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import click
import numpy as np

from pathbench import UserError
from pathbench.files import write_atomic
from pathbench.tasks import IGNORE_INDEX, TASKS, Dataset, Task, default_config, make_task

SUFFIXES = (".npz", ".parquet")


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
        "Attention variants (origin: built-in, or the plugin package that provides it), "
        f"parameters at layers={layers} heads={heads} d_model={d_model} vocab_size={vocab_size}:"
    ]
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        size = f"{row['parameters']:>10,}" if row["parameters"] is not None else "error: " + row["error"]
        lines.append(f"  {row['name']:<{width}}  {size}  ({row['origin']})")
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
        ]
    return lines


@click.command()
@click.argument("task_name", metavar="TASK")
@click.option("--split", default="train", show_default=True, help="Which split to draw.")
@click.option("--num", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Number of sequences.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Random seed (each split has its own stream for every seed).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a config value; repeat for several.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the dataset to this .npz or .parquet file.")
@click.option("--show", type=click.IntRange(min=1), metavar="K",
              help="Print the first K sequences as tokens, scored positions as input=>target.")
def data(task_name, split, num, seed, settings, out, show):
    """Generate a dataset of TASK: write it (--out) and/or print examples (--show).

    --show prints the first sequences of the same dataset that --out would write.
    """
    task = make_task(task_name, parse_settings(settings))
    if out is None and show is None:
        raise UserError("nothing to do: give --out FILE, --show K, or both")
    if out is not None and out.suffix not in SUFFIXES:
        raise UserError(
            f"unknown file type {out.suffix or '(none)'!r} for --out; use {' or '.join(SUFFIXES)}"
        )
    dataset = task.generate(num, seed, split)
    if out is not None:
        metadata = {"task": task.name, "version": task.version, "config": task.config,
                    "split": split, "seed": seed, "num": num}
        save_dataset(out, dataset, json.dumps(metadata))
        click.echo(f"wrote {num} sequences of {task.name}/{split} (seed {seed}) to {out}")
    if show is not None:
        click.echo(format_examples(task, dataset, split, seed, show))


def parse_settings(settings: tuple[str, ...]) -> dict[str, str]:
    """``("length=64", ...)`` -> {"length": "64"}; malformed or repeated keys are errors."""
    overrides: dict[str, str] = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        key = key.strip()
        if not equals or not key:
            raise UserError(f"malformed --set {setting!r}; expected KEY=VALUE, e.g. length=64")
        if key in overrides:
            raise UserError(f"--set {key} is given twice")
        overrides[key] = value
    return overrides


def save_dataset(path: Path, dataset: Dataset, metadata: str) -> None:
    """Write ``dataset`` in the format named by the suffix, atomically (a temporary sibling
    renamed into place); a missing folder or an unwritable path is a UserError."""
    write = write_npz if path.suffix == ".npz" else write_parquet
    if not path.parent.is_dir():
        raise UserError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} does not exist")
    write_atomic(path, lambda file: write(file, dataset, metadata))  # refusals: a UserError


def write_npz(file, dataset: Dataset, metadata: str) -> None:
    # A file object, so numpy does not append ".npz" to the name.
    np.savez(file, inputs=dataset.inputs, targets=dataset.targets,
             vocab=np.array(dataset.vocab, dtype=str), metadata=np.array(metadata))


def write_parquet(file, dataset: Dataset, metadata: str) -> None:
    import pandas as pd  # only this format needs pandas

    frame = pd.DataFrame({"inputs": list(dataset.inputs), "targets": list(dataset.targets)})
    frame.attrs = {"vocab": list(dataset.vocab), "metadata": metadata}
    frame.to_parquet(file, engine="pyarrow", index=False)


def format_examples(task: Task, dataset: Dataset, split: str, seed: int, count: int) -> str:
    """The first ``count`` sequences as wrapped token strings, scored ones as input=>target."""
    count = min(count, len(dataset))
    width = min(shutil.get_terminal_size().columns, 120)
    lines = [
        f"{task.name} (version {task.version}) split={split} seed={seed}, "
        f"first {count} of {len(dataset)} sequences of {dataset.inputs.shape[1]} tokens; "
        "scored positions are shown as input=>target",
    ]
    for index in range(count):
        tokens = [
            task.vocab[token] if target == IGNORE_INDEX
            else f"{task.vocab[token]}=>{task.vocab[target]}"
            for token, target in zip(dataset.inputs[index], dataset.targets[index])
        ]
        lines.append(f"[{index}]")
        lines += textwrap.wrap(" ".join(tokens), width=width, initial_indent="    ",
                               subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False)
    return "\n".join(lines)
