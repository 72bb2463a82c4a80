"""`pathbench results` and `pathbench plot`: tables and paper-style figures from run records.

Everything reads one table: a pandas frame with a row per run (``load_frame``). A *cell* is a
configuration up to its seed and learning rate. By default a cell is reported at its best
learning rate: the one whose runs finished most often without diverging and, among those, had
the highest mean of the primary metric on the first evaluation split (the *headline* split,
e.g. ``test``). The value of a cell is then the mean over its seeds at that learning rate
(runs that diverged or failed have no metrics; tables show how many of the seeds finished
"ok"), and its spread the standard deviation (tables) or the min..max range (figures).

A task is *solved* at a depth when that mean reaches the task's ``solved_threshold`` (0.9 for
the word problems). The same rule decides ``sweep --until-solved``.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
import pandas as pd

from pathbench import UserError
from pathbench.runners import store
from pathbench.runners.config import cell_key, parse_int_list

# Columns that name a configuration in tables; the rest of the config is in "task.*",
# "model.*" and "train.*" columns, shown only when they vary.
NAME_COLUMNS = ["task", "model", "layers", "heads", "d_model"]
FORMATS = ("table", "csv", "markdown")
# Fixed colours, so that a model looks the same in every figure.
MODEL_COLOURS = {"nope": "#7f7f7f", "rope": "#1f77b4", "sba": "#2ca02c", "fox": "#ff7f0e",
                 "path": "#d62728", "path_fox": "#9467bd"}


def record_row(record: dict) -> dict:
    """One run as a flat row: names, every config value, and every scalar metric per split."""
    config = record["config"]
    model, train = config["model"], config["train"]
    row = {
        "task": config["task"]["name"], "model": model["attention"], "layers": model["layers"],
        "heads": model["heads"], "d_model": model["d_model"], "lr": train["lr"],
        "seed": config["seed"], "status": record["status"], "steps": record["steps"],
        "wall_time_s": record["provenance"].get("wall_time_s"),
        "primary_metric": record.get("primary_metric") or "accuracy",
        "solved_threshold": record.get("solved_threshold"),
        "splits": list(record["metrics"]),
        "cell": cell_key(config), "depth_free_cell": cell_key(config, with_layers=False),
        "run_id": record.get("run_id"), "run_dir": record.get("run_dir"),
    }
    named = {"attention", "layers", "heads", "d_model", "vocab_size"}
    for key, value in config["task"]["config"].items():
        row[f"task.{key}"] = _hashable(value)
    row.update({f"model.{k}": _hashable(v) for k, v in model.items() if k not in named})
    row.update({f"train.{k}": _hashable(v) for k, v in train.items() if k != "lr"})
    for split, metrics in record["metrics"].items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[f"{split}:{name}"] = float(value)
    return row


def _hashable(value):
    return store.canonical_json(value) if isinstance(value, (list, dict)) else value


def load_frame(root: Path, only: set[str] | None = None) -> pd.DataFrame:
    """Every run record under ``root`` (or only the named runs) as a frame, one row a run;
    ``root`` may also be a tar archive of run directories (see ``store.iter_results``)."""
    rows = []
    for run_dir, record in store.iter_results(root, only):
        record["run_dir"] = str(run_dir)
        rows.append(record_row(record))
    return pd.DataFrame(rows)


def varying_config_columns(frame: pd.DataFrame) -> list[str]:
    """The task./model./train. columns whose value differs between the runs shown."""
    columns = [c for c in frame.columns if c.split(".")[0] in ("task", "model", "train")
               and "." in c]
    return [c for c in columns if frame[c].astype(str).nunique() > 1]


def aggregate(frame: pd.DataFrame, metric: str | None = None, best_lr: bool = True
              ) -> pd.DataFrame:
    """One row per cell (and learning rate unless ``best_lr``): seeds, ok runs, and the mean,
    standard deviation, min and max of ``metric`` (default: the primary metric) on every
    evaluation split; ``score`` is the mean primary metric on the headline split."""
    shown_config = varying_config_columns(frame)
    rows = []
    for (cell, lr), runs in frame.groupby(["cell", "lr"], sort=False):
        first = runs.iloc[0]
        name = metric or first["primary_metric"]
        splits = next((s for s in runs["splits"] if s), [])  # failed runs have no metrics
        row = {column: first[column] for column in [*NAME_COLUMNS, *shown_config]}
        row.update(cell=cell, depth_free_cell=first["depth_free_cell"], lr=lr,
                   seeds=len(runs), ok=int((runs["status"] == "ok").sum()),
                   solved_threshold=first["solved_threshold"], metric=name,
                   headline=splits[0] if splits else None)
        for split in splits:
            column = f"{split}:{name}"
            values = runs[column].dropna() if column in runs else pd.Series(dtype=float)
            row[split] = values.mean()
            row[f"{split}_std"] = values.std(ddof=0)
            row[f"{split}_min"] = values.min()
            row[f"{split}_max"] = values.max()
        headline = f"{row['headline']}:{first['primary_metric']}"
        scores = runs[headline].dropna() if headline in runs else pd.Series(dtype=float)
        row["score"] = scores.mean() if len(scores) else -math.inf
        rows.append(row)
    table = pd.DataFrame(rows)
    if best_lr and len(table):
        table = (table.sort_values(["ok", "score"], ascending=False, kind="stable")
                 .drop_duplicates("cell").sort_index())
    return table.reset_index(drop=True)


def solved_cells(frame: pd.DataFrame) -> set[str]:
    """The depth-free cells solved at some depth in ``frame`` (see the module docstring)."""
    if frame.empty:
        return set()
    table = aggregate(frame)
    solved = table[table["solved_threshold"].notna()
                   & (table["score"] >= table["solved_threshold"].fillna(math.inf))]
    return set(solved["depth_free_cell"])


def min_layers_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and model, the fewest layers at which the cell is solved (">N": not up to N)."""
    rows = []
    solvable = table[table["solved_threshold"].notna()]
    for (task, model, heads), cells in solvable.groupby(["task", "model", "heads"], sort=False):
        solved = cells[cells["score"] >= cells["solved_threshold"]]
        rows.append({"task": task, "model": model, "heads": heads,
                     "min_layers": str(int(solved["layers"].min())) if len(solved)
                     else f">{int(cells['layers'].max())}"})
    return pd.DataFrame(rows)


def apply_filters(frame: pd.DataFrame, *, task=None, model=None, layers=None, heads=None,
                  status=None) -> pd.DataFrame:
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
    return frame


def display_table(table: pd.DataFrame, frame: pd.DataFrame, per_run: bool, as_text: bool = True
                  ) -> pd.DataFrame:
    """The columns a reader wants, in order; per split "mean ± std" text or (``as_text``
    False, for CSV) two numeric columns, SPLIT and SPLIT_std."""
    config_columns = [*NAME_COLUMNS, *varying_config_columns(frame), "lr"]
    model_rank = {name: rank for rank, name in enumerate(MODEL_COLOURS)}  # the paper's order
    table = table.assign(_rank=table["model"].map(model_rank).fillna(len(model_rank)))
    table = table.sort_values(["task", "_rank", "model", *config_columns[2:],
                               *(["seed"] if per_run else [])], kind="stable")
    if per_run:
        metric_columns = [c for c in frame.columns if ":" in c and frame[c].notna().any()]
        shown = table[[*config_columns, "seed", "status", "steps", *metric_columns]].copy()
    else:
        shown = table[[*config_columns, "metric"]].copy()
    for column in config_columns[:-1]:  # integers that pandas turned into floats beside NaN
        shown[column] = [tidy(value) for value in shown[column]]
    if per_run:
        return shown
    splits = list(dict.fromkeys(s for split_list in frame["splits"] for s in split_list))
    shown["ok/seeds"] = [f"{ok}/{seeds}" for ok, seeds in zip(table["ok"], table["seeds"])]
    for split in splits:
        if split not in table:
            continue
        if as_text:
            shown[split] = [_mean_std(m, s) for m, s in zip(table[split], table[f"{split}_std"])]
        else:
            shown[split], shown[f"{split}_std"] = table[split], table[f"{split}_std"]
    return shown


def tidy(value):
    """3.0 -> 3 (for display); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _mean_std(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    return f"{mean:.4g} ± {std:.2g}"


def to_markdown(frame: pd.DataFrame) -> str:
    def cell(value):
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.4g}"
        return "" if value is None else str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(value) for value in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def render(frame: pd.DataFrame, fmt: str) -> str:
    if fmt == "csv":
        return frame.to_csv(index=False).rstrip("\n")
    if fmt == "markdown":
        return to_markdown(frame)
    return frame.to_string(index=False, na_rep="", float_format=lambda value: f"{value:.4g}")


def _load_filtered(directory: Path, filters: dict) -> pd.DataFrame:
    frame = load_frame(directory)
    if frame.empty:
        raise UserError(f"no run records (result.json) under {directory}")
    frame = apply_filters(frame, **filters)
    if frame.empty:
        raise UserError(f"no runs under {directory} match the filters")
    return frame


def filter_options(command):
    options = [
        click.option("--task", default=None, help="Only these tasks (comma-separated)."),
        click.option("--model", default=None, help="Only these models (comma-separated)."),
        click.option("--layers", default=None, help="Only these layer counts (1-6, 1,2)."),
        click.option("--heads", default=None, help="Only these head counts."),
        click.option("--status", default=None, help="Only runs with this status (ok, ...)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path),
                default=store.DEFAULT_OUT)
@filter_options
@click.option("--metric", default=None, help="Metric to show (default: the primary metric; "
                                             "flipflop also has error).")
@click.option("--all-lrs", is_flag=True, help="A row per learning rate instead of the best.")
@click.option("--runs", "per_run", is_flag=True, help="A row per run, no aggregation.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def results(directory, task, model, layers, heads, status, metric, all_lrs, per_run, fmt):
    """Print the results table of the runs under DIRECTORY (default results/runs)."""
    frame = _load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status))
    if metric is not None and not any(c.endswith(f":{metric}") for c in frame.columns):
        available = sorted({c.split(":", 1)[1] for c in frame.columns if ":" in c})
        raise UserError(f"no metric {metric!r} in these runs; available: {', '.join(available)}")
    table = frame if per_run else aggregate(frame, metric, best_lr=not all_lrs)
    if fmt == "csv":  # one machine-readable table
        click.echo(render(display_table(table, frame, per_run, as_text=False), fmt))
        return
    sections = []  # one table per task, with the columns that task's runs use
    for name, task_frame in frame.groupby("task", sort=True):
        shown = display_table(table[table["task"] == name], task_frame, per_run)
        heading = f"### {name}\n" if fmt == "markdown" else f"{name}:"
        sections.append(f"{heading}\n{render(shown.drop(columns='task'), fmt)}")
    click.echo("\n\n".join(sections))


@click.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path),
                default=store.DEFAULT_OUT)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Figure path; FILE.png, FILE.pdf and FILE.md (the tables) are written.")
@filter_options
def plot(directory, output, task, model, layers, heads, status):
    """Draw paper-style figures of the runs under DIRECTORY (default results/runs)."""
    from pathbench.runners.figures import draw

    frame = _load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status))
    written, tables = draw(frame, output)
    if tables:
        click.echo(tables)
    for path in written:
        click.echo(f"wrote {path}")
