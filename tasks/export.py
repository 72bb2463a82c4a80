"""Dataset files, written by `pathbench data --out`; they are self-describing:

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

import shutil
import textwrap
from pathlib import Path

import numpy as np

from pathbench import UserError
from pathbench.files import write_atomic
from pathbench.tasks.base import IGNORE_INDEX, Dataset, Task

SUFFIXES = (".npz", ".parquet")


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
