"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Each file is written to a temporary sibling, flushed to disk and moved into place with
``os.replace``, which is atomic on POSIX. Every layer writes its outputs this way (datasets,
benchmark tables, run records, figures).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from pathbench import UserError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by the owner only; records get the usual permissions.
FILE_MODE = 0o666 & ~_current_umask()


def write_atomic(path: Path, write: Callable) -> None:
    """Write a file through ``write(file_object)`` into a temporary sibling, then rename it. A
    file system that refuses (no permission, read-only, full, a path through a file) is a
    UserError naming the file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def write_text_atomic(path: Path, text: str) -> None:
    data = text.encode()
    write_atomic(path, lambda file: file.write(data))


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def check_writable(directory: Path, what: str = "output directory") -> None:
    """Create ``directory`` if needed and check that a file can be written in it; a UserError
    naming it and the reason otherwise (a read-only file system, a path through a file)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UserError(f"cannot write to {what} {directory}: {exc.strerror or exc}") from None
