"""`pathbench results`: tables from run records (the figures of `pathbench plot` draw on them).

Everything reads one table: a pandas frame with a row per run (``load_frame``), built from run
records or read back from a CSV of it (``--format records``, `records_csv`). A *cell* is a
configuration up to its seed and learning rate. Validation decides, test reports: a cell is
reported at the learning rate whose runs finished most often without diverging and, among
those, had the highest mean of the primary metric on ``val`` (each record's final validation
metrics). Its value on every test split is then the mean over its seeds at that learning rate
(runs that diverged or failed have no metrics; tables show how many seeds finished "ok"), and
its spread the sample standard deviation over those seeds (n - 1; tables) or their min..max
(figures). A rate measured on N scored positions also has its 95% Wilson interval: per run
(``--runs``), and in a cell's row that of the rate pooled over its seeds' scored positions, which
says how finely the evaluation data resolve the rate (the spread over seeds is the ± beside it).

A cell *solves* a task (one with a ``solved_threshold``, 0.9 for the word problems) when at least
two thirds of its seeds reach the threshold: on ``val`` for ``sweep --until-solved``'s decision
to stop adding layers, on the first test split (the *headline*) for what tables report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import pandas as pd

from pathbench import UserError
from pathbench.runners import store
from pathbench.runners.config import DECISION_SPLIT, cell_key, parse_int_list

# Columns that name a configuration in tables; the rest of the config is in "task.*",
# "model.*" and "train.*" columns, shown only when they vary.
NAME_COLUMNS = ["task", "model", "layers", "heads", "d_model"]
# csv: the table shown, machine-readable; records: every run's full row, which `results` and
# `plot` read back in place of the run records (a file ending in .csv)
FORMATS = ("table", "csv", "markdown", "records")
LIST_COLUMNS = ("splits",)  # list-valued columns, written to a records table as JSON
PERCENT_METRICS = {"error"}  # metrics a task reports in percent; the rest are fractions
RATE_METRICS = {"accuracy", *PERCENT_METRICS}  # rates of scored positions: Wilson intervals


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
    for run_dir, record in store.iter_results(root, only, skip):
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


def varying_config_columns(frame: pd.DataFrame) -> list[str]:
    """The task./model./train. columns whose value differs between the runs shown."""
    columns = [c for c in frame.columns if c.split(".")[0] in ("task", "model", "train")
               and "." in c]
    return [c for c in columns if frame[c].astype(str).nunique() > 1]


def aggregate(frame: pd.DataFrame, metric: str | None = None, best_lr: bool = True
              ) -> pd.DataFrame:
    """One row per cell (and learning rate unless ``best_lr``): seeds, ok runs, and the mean,
    sample standard deviation, min and max of ``metric`` (default: the primary metric) on every
    test split. ``score`` is the mean primary metric on val, which picks the learning rate;
    ``val_solved`` and ``solved`` say whether two thirds of the seeds reach the task's threshold
    on val and on the headline test split. A rate with a count of scored positions also gets
    the 95% Wilson interval of the rate pooled over the seeds (SPLIT_low, SPLIT_high)."""
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
            values = _values(runs, f"{split}:{name}")
            row[split] = values.mean()
            row[f"{split}_std"] = values.std(ddof=1)
            row[f"{split}_min"] = values.min()
            row[f"{split}_max"] = values.max()
            row[f"{split}_low"], row[f"{split}_high"] = _pooled_interval(runs, split, name)
        primary = first["primary_metric"]
        scores = _values(runs, f"{DECISION_SPLIT}:{primary}")
        row["score"] = scores.mean() if len(scores) else -math.inf
        threshold = first["solved_threshold"]
        row["val_solved"] = _solved(scores, len(runs), threshold)
        row["solved"] = _solved(_values(runs, f"{row['headline']}:{primary}"), len(runs),
                                threshold)
        rows.append(row)
    table = pd.DataFrame(rows)
    if best_lr and len(table):
        table = (table.sort_values(["ok", "score"], ascending=False, kind="stable")
                 .drop_duplicates("cell").sort_index())
    return table.reset_index(drop=True)


def _values(runs: pd.DataFrame, column: str) -> pd.Series:
    return runs[column].dropna() if column in runs else pd.Series(dtype=float)


def _pooled_interval(runs: pd.DataFrame, split: str, metric: str) -> tuple[float, float]:
    """The 95% Wilson interval of a rate pooled over the runs' scored positions of ``split``
    (in the metric's unit); NaN where the metric is not a rate with counts."""
    if metric not in RATE_METRICS or f"{split}:scored" not in runs:
        return math.nan, math.nan
    both = runs[[f"{split}:{metric}", f"{split}:scored"]].dropna()
    total = int(both.iloc[:, 1].sum())
    if not total:
        return math.nan, math.nan
    return rate_interval(float((both.iloc[:, 0] * both.iloc[:, 1]).sum()) / total, total, metric)


def rate_interval(value: float, n: int, metric: str) -> tuple[float, float]:
    """The 95% Wilson interval of a rate metric's value measured on n positions, in the
    metric's unit (percent for error)."""
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    low, high = wilson_interval(value / scale, n)
    return low * scale, high * scale


def _solved(values: pd.Series, seeds: int, threshold) -> bool:
    """At least two thirds of the seeds reach the threshold (two of three; one of one)."""
    if threshold is None or (isinstance(threshold, float) and math.isnan(threshold)):
        return False
    return bool(seeds) and 3 * int((values >= threshold).sum()) >= 2 * seeds


def wilson_interval(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial rate observed on n trials."""
    if not n or math.isnan(rate):
        return math.nan, math.nan
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    # at a rate of 0 or 1 the interval ends there exactly (not at a rounding error beside it)
    low = 0.0 if rate <= 0 else max(0.0, centre - half)
    high = 1.0 if rate >= 1 else min(1.0, centre + half)
    return low, high


def solved_cells(frame: pd.DataFrame) -> set[str]:
    """The depth-free cells that val says are solved at some depth in ``frame`` (the decision
    of ``sweep --until-solved``)."""
    if frame.empty:
        return set()
    table = aggregate(frame)
    return set(table.loc[table["val_solved"], "depth_free_cell"])


def min_layers_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and model, the fewest layers at which the cell is solved on test at the learning
    rate val picked (">N": not up to N)."""
    rows = []
    solvable = table[table["solved_threshold"].notna()]
    for (task, model, heads), cells in solvable.groupby(["task", "model", "heads"], sort=False):
        solved = cells[cells["solved"]]
        rows.append({"task": task, "model": model, "heads": heads,
                     "min_layers": str(int(solved["layers"].min())) if len(solved)
                     else f">{int(cells['layers'].max())}"})
    rank = {name: i for i, name in enumerate(model_order(table["model"]))}
    return pd.DataFrame(rows, columns=["task", "model", "heads", "min_layers"]).sort_values(
        ["task", "model", "heads"], key=lambda c: c.map(rank) if c.name == "model" else c,
        kind="stable").reset_index(drop=True)


def min_depth_by_length(frame: pd.DataFrame) -> pd.DataFrame:
    """Per task, model and head count, the fewest layers that solve the task at each sequence
    length of the runs (a column "length=N" each; ">N": not up to N layers)."""
    lengths = frame["task.length"] if "task.length" in frame else pd.Series(None, frame.index)
    found = []
    for length, group in frame.groupby(lengths.fillna(-1), sort=True):
        label = "min_layers" if length == -1 else f"length={tidy(length)}"
        table = min_layers_table(aggregate(group))
        found += [{**row, "column": label} for row in table.to_dict("records")]
    if not found:
        return pd.DataFrame()
    wide = pd.DataFrame(found).pivot(index=["task", "model", "heads"], columns="column",
                                     values="min_layers")
    columns = sorted(wide.columns, key=lambda c: (len(c), c))  # length=8 before length=12
    wide = wide[columns].reset_index().fillna("")
    rank = {name: i for i, name in enumerate(model_order(wide["model"]))}
    return wide.sort_values(["task", "model"], key=lambda c: c.map(rank) if c.name == "model"
                            else c, kind="stable").reset_index(drop=True)


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
    """The columns a reader wants, in order; per test split "mean ± sd [low, high]" text or
    (``as_text`` False, for CSV) numeric columns, SPLIT, SPLIT_std (a sample standard deviation)
    and, for a rate with counts, SPLIT_low and SPLIT_high (its pooled 95% Wilson interval).
    Per run, each rate with a count of scored positions also gets its 95% Wilson interval
    (SPLIT:METRIC 95% CI). A metric in percent (error) has " (%)" in its columns' names."""
    config_columns = [*NAME_COLUMNS, *varying_config_columns(frame), "lr"]
    model_rank = {name: rank for rank, name in enumerate(model_order(table["model"]))}
    table = table.assign(_rank=table["model"].map(model_rank))
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
        return _with_intervals(shown, as_text)
    splits = list(dict.fromkeys(s for split_list in frame["splits"] for s in split_list))
    shown["ok/seeds"] = [f"{ok}/{seeds}" for ok, seeds in zip(table["ok"], table["seeds"])]
    unit = " (%)" if set(table["metric"]) == {"error"} else ""
    headline = splits[0] if splits else None
    for column in [c for c in frame.columns
                   if c.startswith(f"baseline:{headline}:") and frame[c].notna().any()]:
        rule = column.rsplit(":", 1)[1].replace("_", " ")
        means = frame.groupby(["cell", "lr"])[column].mean()
        shown[f"{rule} ({headline})"] = [means.get((cell, lr), math.nan)
                                         for cell, lr in zip(table["cell"], table["lr"])]
    for split in splits:
        if split not in table:
            continue
        if as_text:
            shown[split + unit] = [_mean_std(*values) for values in zip(
                table[split], table[f"{split}_std"], table[f"{split}_low"],
                table[f"{split}_high"])]
        else:
            shown[split + unit] = table[split]
            shown[f"{split}_std{unit}"] = table[f"{split}_std"]
            if table[f"{split}_low"].notna().any():
                shown[f"{split}_low{unit}"] = table[f"{split}_low"]
                shown[f"{split}_high{unit}"] = table[f"{split}_high"]
    return shown


def _with_intervals(shown: pd.DataFrame, as_text: bool) -> pd.DataFrame:
    """Per-run columns with units, and a Wilson interval beside each rate with a count."""
    columns = {}
    for column in shown.columns:
        split, colon, metric = column.partition(":")
        if not colon or split == "baseline":
            columns[column] = shown[column]
            continue
        percent = metric in PERCENT_METRICS
        columns[column + (" (%)" if percent else "")] = shown[column]
        counts = shown.get(f"{split}:scored")
        if metric in RATE_METRICS and counts is not None:
            bounds = [rate_interval(value, int(n), metric) if value == value and n == n
                      else (math.nan, math.nan) for value, n in zip(shown[column], counts)]
            name = f"{column} 95% CI" + (" (%)" if percent else "")
            if as_text:
                columns[name] = ["" if math.isnan(low) else f"[{low:.3g}, {high:.3g}]"
                                 for low, high in bounds]
            else:
                columns[name + " low"] = [low for low, _ in bounds]
                columns[name + " high"] = [high for _, high in bounds]
    return pd.DataFrame(columns)


def builtin_models() -> list[str]:
    """The built-in attention variants in the order they are registered (the paper's)."""
    from pathbench.models import ATTENTIONS  # imports torch: only when a table is drawn
    from pathbench.registry import BUILTIN

    return [name for name, entry in ATTENTIONS.entries().items() if entry.origin == BUILTIN]


def model_order(models) -> list[str]:
    """Built-in models in the registry's order, then any others alphabetically."""
    present = set(models)
    known = [m for m in builtin_models() if m in present]
    return known + sorted(present - set(known))


def tidy(value):
    """3.0 -> 3 (for display); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _mean_std(mean: float, std: float, low: float = math.nan, high: float = math.nan) -> str:
    """"mean ± sd", and "[low, high]" where the rate has a pooled interval."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    text = f"{mean:.4g}" if std is None or math.isnan(std) else f"{mean:.4g} ± {std:.2g}"
    return text if math.isnan(low) else f"{text} [{low:.3g}, {high:.3g}]"


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


def load_filtered(directory: Path, filters: dict) -> pd.DataFrame:
    """The records under ``directory`` that pass the filters; a damaged or incomplete record
    is skipped with a one-line warning naming it."""
    frame = load_frame(directory, skip=lambda message: click.echo(
        f"pathbench: warning: skipped {message}", err=True))
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
    """Print the results table of the runs under DIRECTORY (default results/runs).

    DIRECTORY may also be a tar archive of run directories (ARCHIVE/FOLDER: one folder of it)
    or a records table written by --format records (a .csv file).
    """
    frame = load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status))
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
    sections = []  # one table per task, with the columns that task's runs use
    for name, task_frame in frame.groupby("task", sort=True):
        shown = display_table(table[table["task"] == name], task_frame, per_run)
        heading = f"### {name}\n" if fmt == "markdown" else f"{name}:"
        sections.append(f"{heading}\n{render(shown.drop(columns='task'), fmt)}")
        if not per_run and task_frame["solved_threshold"].notna().any() \
                and task_frame["layers"].nunique() > 1:
            depth = min_depth_by_length(task_frame).drop(columns="task")
            threshold = task_frame["solved_threshold"].dropna().iloc[0]
            sections.append(f"{name}: minimum layers to solve (two thirds of the seeds at "
                            f">= {threshold:g} on test, at the learning rate val picked)\n"
                            f"{render(depth, fmt)}")
    note = ("one row per run; rates with their 95% Wilson interval" if per_run else
            "learning rate picked on val (--all-lrs: every one); test splits: mean ± sample "
            "standard deviation (n - 1) over the seeds that finished ok; [low, high]: the 95% "
            "Wilson interval of the rate pooled over their scored positions")
    click.echo("\n\n".join(sections) + f"\n\n({note})")
