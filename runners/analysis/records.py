"""The table every analysis reads: a pandas frame with a row per run, built from run records
(a directory of run directories, a tar archive of them) or read back from a records table, the
CSV that `records_csv` writes (``pathbench results --format records``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from pathbench import UserError
from pathbench.runners.training import store
from pathbench.runners.training.config import (
    DECISION_SPLIT,
    SECTIONS,
    cell_key,
    parse_int_list,
    parse_sets,
)

LIST_COLUMNS = ("splits",)  # list-valued columns, written to a records table as JSON


def record_row(record: dict) -> dict:
    """One run as a flat row: names, every config value, and every scalar metric per split."""
    config = record["config"]
    model, train = config["model"], config["train"]
    row = {
        # a model with set weights (pathbench.models.constructions) goes by its own name
        "task": config["task"]["name"], "model": config.get("construction") or model["attention"],
        "layers": model["layers"],
        "heads": model["heads"], "d_model": model["d_model"], "lr": train["lr"],
        "seed": config["seed"], "status": record["status"], "steps": record["steps"],
        "reason": record.get("reason"),  # why a run failed or diverged
        "wall_time_s": record["provenance"].get("wall_time_s"),
        "budget_limited": budget_limited(record),
        "primary_metric": record.get("primary_metric") or "accuracy",
        "solved_threshold": record.get("solved_threshold"),
        "splits": list(record["metrics"]),  # the test splits
        "cell": cell_key(config), "depth_free_cell": cell_key(config, with_layers=False),
        "run_id": record.get("run_id"), "run_dir": record.get("run_dir"),
    }
    named = {"attention", "layers", "heads", "d_model", "vocab_size"}
    for key, value in config["task"]["config"].items():
        row[f"task.{key}"] = _hashable(value)
    row.update({f"model.{k}": _hashable(v) for k, v in model.items() if k not in named})
    row.update({f"train.{k}": _hashable(v) for k, v in train.items() if k != "lr"})
    for split, metrics in {DECISION_SPLIT: record.get("validation") or {},
                           **record["metrics"]}.items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[f"{split}:{name}"] = float(value)
    for split, rules in (record.get("baselines") or {}).items():
        for name, value in rules.items():
            row[f"baseline:{split}:{name}"] = float(value)
    return row


def budget_limited(record: dict) -> bool | None:
    """Whether the run ended at its step cap with val still improving. Records written before
    runs said so are judged by their curve (given under "curve"): ended at the cap, not early,
    with a new best val primary metric at the last check; None where neither tells."""
    if "budget_limited" in record:
        return record["budget_limited"]
    points = [point for point in record.get("curve") or [] if point.get("validation")]
    if record["status"] != "ok" or not points:
        return None
    if record.get("stopped_early") or record["steps"] < record["config"]["train"]["steps"]:
        return False
    metric = record.get("primary_metric") or "accuracy"
    values = [point["validation"].get(metric, -math.inf) for point in points]
    return len(values) == 1 or values[-1] > max(values[:-1])


def _hashable(value):
    return store.canonical_json(value) if isinstance(value, (list, dict)) else value


def load_frame(root: Path, only: set[str] | None = None, skip=None) -> pd.DataFrame:
    """Every run record under ``root`` (or only the named runs) as a frame, one row a run;
    ``root`` may also be a tar archive of run directories (see ``store.iter_results``, which
    also says what ``skip`` does with a damaged record), or a records table (a .csv file)."""
    if Path(root).suffix == ".csv":
        frame = read_records(Path(root))
        return frame if only is None else frame[frame["run_id"].isin(only)]
    rows = []
    for run_dir, record in store.iter_results(root, only, skip, curves=True):
        record["run_dir"] = str(run_dir)
        rows.append(record_row(record))
    return pd.DataFrame(rows)


def records_csv(frame: pd.DataFrame) -> str:
    """The frame as a records table: CSV, one row a run, every column."""
    frame = frame.assign(**{c: [json.dumps(v) for v in frame[c]] for c in LIST_COLUMNS})
    return frame.to_csv(index=False).rstrip("\n")


def read_records(path: Path) -> pd.DataFrame:
    """A records table as the frame it was written from (`records_csv`)."""
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
        frame = frame.assign(**{c: [json.loads(v) for v in frame[c]] for c in LIST_COLUMNS})
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as exc:
        raise UserError(f"cannot read the records table {path}: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    # configuration values that a record leaves unset (None) read back as missing
    return frame.astype(object).where(frame.notna(), None).infer_objects()


def setting_columns(frame: pd.DataFrame) -> list[str]:
    """The frame's task./model./train. setting columns ("task.length", ...)."""
    return [c for c in frame.columns if c.partition(".")[0] in SECTIONS and "." in c]


def _setting_text(value) -> str:
    """A setting's value as a user writes it: 16 for 16.0 (a column with gaps reads as float),
    "" for unset."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_setting_text(item) for item in value)
    return str(value)


def apply_filters(frame: pd.DataFrame, *, task=None, model=None, layers=None, heads=None,
                  status=None, where=()) -> pd.DataFrame:
    """The runs that pass every filter; ``where``: "SECTION.KEY=VALUE" items, each keeping the
    runs whose setting has that value."""
    def names(text):
        return [part.strip() for part in text.split(",") if part.strip()]

    if task:
        frame = frame[frame["task"].isin(names(task))]
    if model:
        frame = frame[frame["model"].isin(names(model))]
    if layers:
        frame = frame[frame["layers"].isin(parse_int_list(layers, "--layers"))]
    if heads:
        frame = frame[frame["heads"].isin(parse_int_list(heads, "--heads"))]
    if status:
        frame = frame[frame["status"].isin(names(status))]
    for section, settings in parse_sets(where, "--where").items():
        for name, value in settings.items():
            column = f"{section}.{name}"
            if column not in frame:
                raise UserError(f"--where: no setting {column} in these runs; they have "
                                f"{', '.join(sorted(setting_columns(frame)))}")
            texts = frame[column].map(_setting_text)
            if len(frame) and not (texts == value).any():
                values = sorted(set(texts) - {""}, key=lambda text: (len(text), text))
                raise UserError(f"--where {column}={value}: no run has it; these runs have "
                                f"{', '.join(values)}")
            frame = frame[texts == value]
    return frame


def load_filtered(directory: Path, filters: dict, warn) -> pd.DataFrame:
    """The records under ``directory`` that pass the filters (`apply_filters`'s), after
    ``warn(message)`` for each record skipped as damaged or incomplete, each finished run whose
    primary metric is missing or NaN on a split (left out of means and figures), and the runs
    that have started but not finished (a run directory without result.json)."""
    frame = load_frame(directory, skip=lambda message: warn(f"skipped {message}"))
    unfinished = store.unfinished_runs(directory) if Path(directory).is_dir() else []
    if unfinished:
        names = ", ".join(path.name for path in unfinished[:3])
        more = f" and {len(unfinished) - 3} more" if len(unfinished) > 3 else ""
        warn(f"{len(unfinished)} runs under {directory} have not finished (no result.json): "
             f"{names}{more}")
    if frame.empty:
        raise UserError(f"no run records (result.json) under {directory}")
    frame = apply_filters(frame, **filters)
    if frame.empty:
        raise UserError(f"no runs under {directory} match the filters")
    for message in missing_values(frame):
        warn(message)
    return frame


def missing_values(frame: pd.DataFrame) -> list[str]:
    """One line per finished run ("ok") whose primary metric is missing or NaN on a split that
    other runs of its cell report (runs of other lengths have other splits): such a value is
    left out of every mean and figure."""
    lines = []
    for _, runs in frame.groupby("cell", sort=True):
        splits = list(dict.fromkeys(s for split_list in runs["splits"] for s in split_list))
        for _, row in runs[runs["status"] == "ok"].iterrows():
            for split in [DECISION_SPLIT, *splits]:
                column = f"{split}:{row['primary_metric']}"
                if pd.isna(row.get(column)):
                    lines.append(f"{row.get('run_dir') or row.get('run_id')}: {column} is "
                                 f"missing or NaN; left out of means and figures")
    return lines


def length_column(task: str) -> str | None:
    """The column of ``task``'s length setting ("task.length"); None if it declares none, or is
    a plugin that is not installed here."""
    from pathbench.tasks import TASKS

    try:
        setting = TASKS.get(task).length_setting
    except UserError:
        return None
    return None if setting is None else f"task.{setting}"
