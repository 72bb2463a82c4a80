"""The results store: one directory per run, written so that a kill at any moment loses nothing.

A run directory ``OUT/<run_id>/`` holds

- ``config.json``  the fully resolved run configuration (written first),
- ``curve.jsonl``  the training curve, one JSON object a line (``curve.jsonl.partial`` while
                   the run trains),
- ``model.pt``     the final weights (runs that finished with status "ok"),
- ``result.json``  status, metrics per split, config and provenance (written last).

``result.json`` is the completion marker: a run is done exactly when it exists. A run trained
again (``run --force``, or a sweep retrying a failure) leaves the earlier record, weights and
curve as they were until its own are complete; then its curve, weights and record replace them,
the record last. A forced rerun that crashes leaves an earlier finished record in place. Every JSON file
and the weights are written to a temporary file in the same directory and moved into place with
``os.replace``, which is atomic on POSIX, so a reader sees either the old file or the whole new
one, never half of it. A run killed before ``result.json`` is written simply counts as not done
and is run again from the start (its partial curve starts again).

A ``result.json`` that cannot be parsed can only come from outside tampering or a failing disk.
Readers (``results``, ``plot``, ``inspect``) stop with a one-line error naming the file; a sweep
instead moves the bad file aside to ``result.json.corrupt`` (so nothing is lost) and runs that
configuration again.

Finished runs can be shelved as one tar archive of run directories (``.tar``, ``.tar.gz``,
``.tgz`` or ``.tar.xz``, weights left out). ``results`` and ``plot`` read the records in such an
archive in place, without extracting it (``iter_results``); ``ARCHIVE/FOLDER`` reads only the run
directories under FOLDER inside it.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from pathbench import UserError
from pathbench.files import write_atomic, write_json_atomic, write_text_atomic  # noqa: F401  (the store's writers)

CONFIG_FILE = "config.json"
CURVE_FILE = "curve.jsonl"
RESULT_FILE = "result.json"
WEIGHTS_FILE = "model.pt"
CORRUPT_SUFFIX = ".corrupt"
PARTIAL_SUFFIX = ".partial"  # a run's curve while it trains
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz")
RECORD_KEYS = ("status", "metrics", "config", "provenance")
STATUSES = ("ok", "diverged", "failed")  # the outcomes a record can have

DEFAULT_OUT = Path("results/runs")


def canonical_json(obj: Any) -> str:
    """One fixed spelling of a JSON value: the basis of run ids and dataset hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def config_digest(identity: dict) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()


class CorruptRecord(UserError):
    """A record file exists but is not valid JSON (or lacks the keys every record has)."""


def read_json(path: Path) -> dict:
    """Read a JSON record; a damaged file is a UserError naming the file."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    return parse_record(text, path, "; delete it (or its run directory) and rerun the sweep to "
                                    "redo that run")


def parse_record(data: bytes, where, hint: str = "") -> dict:
    """The JSON object in ``data``, read from ``where``; CorruptRecord naming it if damaged."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"{where} is not a valid record ({exc}){hint}") from None
    if not isinstance(obj, dict):
        raise CorruptRecord(f"{where} is not a valid record (expected a JSON object)")
    return obj


def check_result(result: dict, where) -> dict:
    """``result`` if it has the keys every result.json has; else CorruptRecord naming it."""
    missing = [key for key in RECORD_KEYS if key not in result]
    if missing:
        raise CorruptRecord(f"{where} is not a valid record (missing keys: {', '.join(missing)})")
    if result["status"] not in STATUSES:
        raise CorruptRecord(f"{where} is not a valid record (status {result['status']!r} is not "
                            f"one of {', '.join(STATUSES)})")
    metrics = result["metrics"]
    if result["status"] == "ok" and not (isinstance(metrics, dict) and metrics and all(
            isinstance(split, dict) and split for split in metrics.values())):
        raise CorruptRecord(f"{where} is not a complete record (status ok without the metrics "
                            f"of every split)")
    for split, values in (metrics.items() if isinstance(metrics, dict) else ()):
        for name, value in (values.items() if isinstance(values, dict) else ()):
            if not _is_number(value) and not (isinstance(value, list)
                                               and all(map(_is_number, value))):
                raise CorruptRecord(f"{where} is not a valid record (metric {split}:{name} is "
                                    f"{value!r}, not a number)")
    return result


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_result(run_dir: Path) -> dict:
    path = Path(run_dir) / RESULT_FILE
    return check_result(read_json(path), path)


def is_done(run_dir: Path) -> bool:
    """True if the run finished with an outcome of training ("ok" or "diverged"); a run without
    result.json, or one that failed (crashed), is still to do. Raises CorruptRecord for a
    damaged result."""
    if not (Path(run_dir) / RESULT_FILE).exists():
        return False
    return read_result(run_dir)["status"] != "failed"


def set_aside_corrupt(run_dir: Path) -> Path:
    """Move a damaged result.json to result.json.corrupt (kept for a look) so the run can redo."""
    path = Path(run_dir) / RESULT_FILE
    aside = path.with_name(RESULT_FILE + CORRUPT_SUFFIX)
    os.replace(path, aside)
    return aside


def find_run_dirs(root: Path) -> list[Path]:
    """Every run directory (one holding a result.json) under ``root``, in a stable order."""
    root = Path(root)
    if not root.exists():
        raise UserError(f"results directory {root} does not exist")
    if (root / RESULT_FILE).exists():
        return [root]
    return sorted(path.parent for path in root.rglob(RESULT_FILE))


def unfinished_runs(root: Path) -> list[Path]:
    """The run directories under ``root`` that a run has started (config.json written) and not
    finished (no result.json): running, or interrupted and still to do."""
    root = Path(root)
    configs = [root / CONFIG_FILE] if (root / CONFIG_FILE).exists() else root.rglob(CONFIG_FILE)
    return sorted(path.parent for path in configs if not (path.parent / RESULT_FILE).exists())


def split_archive_path(path: Path) -> tuple[Path, PurePosixPath] | None:
    """(archive, folder inside it) when ``path`` names a tar archive of run directories or a
    folder inside one (``runs.tar.xz/paper``); None for anything else."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.name.endswith(ARCHIVE_SUFFIXES) and candidate.is_file():
            return candidate, PurePosixPath(path.relative_to(candidate).as_posix())
        if candidate.exists():
            return None
    return None


def iter_results(root: Path, only: set[str] | None = None, skip=None, curves: bool = False
                 ) -> Iterator[tuple[Path, dict]]:
    """(run directory, record) for every run under ``root`` that has a result.json, in a stable
    order: ``root`` is a directory of run directories (or one run directory), a tar archive of
    them, or a folder inside such an archive. An archive is read in place, never extracted.
    ``only``: just the runs of these names (directory names). A damaged or incomplete record is
    a CorruptRecord naming it, as for read_result, or, given ``skip``, is passed over after
    ``skip(message)``. With ``curves``, each record also holds its run's training curve under
    "curve" (a list of points; empty where the run has none)."""
    def checked(read, *args):
        try:
            return read(*args)
        except CorruptRecord as exc:
            if skip is None:
                raise
            skip(str(exc))
            return None

    archive = split_archive_path(root)
    if archive is None:
        for run_dir in find_run_dirs(root):
            if only is None or run_dir.name in only:
                record = checked(read_result, run_dir)
                if record is not None:
                    if curves:
                        curve = run_dir / CURVE_FILE
                        record["curve"] = parse_curve(curve.read_bytes() if curve.exists()
                                                      else b"")
                    yield run_dir, record
        return
    path, folder = archive
    records, curve_data = [], {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:  # one pass, in archive order (a stream: no seeking)
                name = PurePosixPath(member.name.removeprefix("./"))
                run_dir = name.parent
                if curves and member.isfile() and name.name == CURVE_FILE:
                    curve_data[run_dir] = tar.extractfile(member).read()
                wanted = (member.isfile() and name.name == RESULT_FILE
                          and (run_dir == folder or folder in run_dir.parents)
                          and (only is None or run_dir.name in only))
                if not wanted:
                    continue
                where = f"{path}/{name}"
                data = tar.extractfile(member).read()
                record = checked(lambda: check_result(parse_record(data, where), where))
                if record is not None:
                    records.append((run_dir, record))
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
        raise UserError(f"cannot read the archive {path}: {exc}") from None
    for run_dir, record in sorted(records, key=lambda item: item[0].parts):
        if curves:
            record["curve"] = parse_curve(curve_data.get(run_dir, b""))
        yield path / run_dir, record


def parse_curve(data: bytes) -> list[dict]:
    """The points of a curve.jsonl; a line cut short by a kill ends it."""
    points = []
    for line in data.decode().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return points


class CurveWriter:
    """Appends training-curve points to ``curve.jsonl.partial``, which a new run starts empty;
    `keep` moves it into place as ``curve.jsonl`` once the run's record is to be written, and
    `drop` deletes it."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / CURVE_FILE
        self.partial = self.path.with_name(CURVE_FILE + PARTIAL_SUFFIX)
        self.file = open(self.partial, "w")

    def append(self, point: dict) -> None:
        self.file.write(json.dumps(point) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def keep(self) -> None:
        os.replace(self.partial, self.path)

    def drop(self) -> None:
        self.partial.unlink(missing_ok=True)
