"""Tables of cells: minimum depths, and the `pathbench results` tables as text, CSV or markdown.

A cell's numbers come from `pathbench.runners.analysis.cells`; the solved rule from
`pathbench.runners.analysis.solved`.
"""

from __future__ import annotations

import math

import pandas as pd

from pathbench.runners.analysis.records import length_column
from pathbench.runners.analysis.cells import (
    NAME_COLUMNS,
    PERCENT_METRICS,
    RATE_METRICS,
    aggregate,
    rate_interval,
    varying_config_columns,
)

# csv: the table shown, machine-readable; records: every run's full row, which `results` and
# `plot` read back in place of the run records (a file ending in .csv)
FORMATS = ("table", "csv", "markdown", "records")


# Shown beside the primary metric in the default table, where a task records them: the word
# problems' final position, the one that needs the whole running product.
SECONDARY_METRICS = ("last_accuracy",)

# The two readings of depth: the fewest layers at which the cell solves the task (two thirds of
# its seeds: it learns it reliably), and at which any seed does (it can express it).
READINGS = {"min_layers": "solved", "min_layers_any": "solved_seeds"}


def min_layers_table(table: pd.DataFrame, settings: list[str] | None = None) -> pd.DataFrame:
    """Per model and head count, the fewest layers at which the cell solves the task on test at
    the learning rate val picked, and at which any of its seeds does (">N": not up to N; ">N?":
    unresolved, for some of the cells' runs were still improving when their budget ended;
    "≤N?": solved with N, but a shallower cell that did not solve is unresolved in that way).

    A row holds cells that differ only in their layer count (and learning rate): runs of
    different lengths or step budgets never share one. ``settings``, the columns that tell
    such rows apart (default: every setting that varies among the cells but the layer count),
    are columns of the result."""
    solvable = table[table["solved_threshold"].notna()]
    if settings is None:
        settings = [c for c in ["d_model", *varying_config_columns(solvable)]
                    if c in solvable and solvable[c].astype(str).nunique() > 1]
    rows = []
    for _, cells in solvable.groupby("depth_free_cell", sort=False):
        first = cells.iloc[0]
        row = {"task": first["task"], "model": first["model"], "heads": first["heads"],
               **{column: tidy(first[column]) for column in settings}}
        cut_short = pd.to_numeric(cells["budget_limited"]).fillna(0).gt(0)
        for reading, column in READINGS.items():
            found = cells[cells[column] > 0]
            if not len(found):
                row[reading] = f">{int(cells['layers'].max())}" + ("?" if cut_short.any() else "")
                continue
            depth = int(found["layers"].min())
            unresolved_below = (cut_short & (cells["layers"] < depth)).any()
            row[reading] = f"≤{depth}?" if unresolved_below else str(depth)
        row["evidence"] = depth_evidence(cells, row["min_layers"])
        rows.append(row)
    rank = {name: i for i, name in enumerate(model_order(table["model"]))}
    return pd.DataFrame(rows, columns=["task", "model", "heads", *settings, *READINGS, "evidence"]
                        ).sort_values(["task", "model", "heads", *settings],
                                      key=lambda c: c.map(rank) if c.name == "model" else c,
                                      kind="stable").reset_index(drop=True)


def solve_rate_text(row, after_count: str = "") -> str:
    """A cell's solve rate, the seeds that solved out of those run, with its 95% Wilson
    interval: "2/3 [0.21, 0.94]" (``after_count`` goes after "2/3")."""
    return (f"{int(row['solved_seeds'])}/{int(row['seeds'])}{after_count} "
            f"[{row['solve_low']:.2f}, {row['solve_high']:.2f}]")


def reading_depth(reading: str) -> int:
    """The layer count a depth reading names: "3", "≤3?", ">3" and ">3?" all name 3."""
    return int(reading.lstrip("≤>").rstrip("?"))


def depth_evidence(cells: pd.DataFrame, reading: str) -> str:
    """The solve rates behind the fewest layers that solve reliably (``reading``: "3", "≤3?",
    ">6"), each with its 95% Wilson interval: at that depth and at one layer fewer ("3: 3/3
    [0.44, 1.00]; 2: 1/3 [0.06, 0.79]"), or at the deepest run where none did."""
    depth = reading_depth(reading)
    by_layers = cells.set_index("layers")
    shown = [depth] if reading.startswith(">") else [depth, depth - 1]
    return "; ".join(f"{layers}: {solve_rate_text(by_layers.loc[layers])}"
                     for layers in shown if layers in by_layers.index)


def min_depth_by_length(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per task, model and head count, each reading of depth (`READINGS`, by name) at each
    sequence length of the runs (a column "length=N" each; ">N": not up to N layers), and the
    solve rates behind the first ("evidence", `depth_evidence`). Settings that vary among the
    runs of one length (a step budget, say) are columns, so that a row never mixes them."""
    column = length_column(frame["task"].iloc[0]) if len(frame) else None
    lengths = frame[column] if column in frame else pd.Series(None, frame.index)
    groups = list(frame.groupby(lengths.fillna(-1), sort=True))
    settings = [c for c in ["d_model", *varying_config_columns(frame)]
                if c != column and any(group[c].astype(str).nunique() > 1 for _, group in groups)]
    found = []
    for length, group in groups:
        label = "min_layers" if length == -1 else f"length={tidy(length)}"
        cells = aggregate(group)
        for setting in settings:  # one that varies at other lengths only: constant here
            if setting not in cells:
                cells[setting] = group[setting].iloc[0]
        table = min_layers_table(cells, settings)
        found += [{**row, "column": label} for row in table.to_dict("records")]
    if not found:
        return {reading: pd.DataFrame() for reading in [*READINGS, "evidence"]}
    readings = {}
    for reading in [*READINGS, "evidence"]:
        wide = pd.DataFrame(found).pivot(index=["task", "model", "heads", *settings],
                                         columns="column", values=reading)
        columns = sorted(wide.columns, key=lambda c: (len(c), c))  # length=8 before length=12
        wide = wide[columns].reset_index().fillna("")
        rank = {name: i for i, name in enumerate(model_order(wide["model"]))}
        readings[reading] = wide.sort_values(
            ["task", "model"], key=lambda c: c.map(rank) if c.name == "model" else c,
            kind="stable").reset_index(drop=True)
    return readings


def fixed_settings(task: str, runs: pd.DataFrame) -> list[str]:
    """The sequence length and step budget that all of ``runs`` share, in words ("length 12",
    "10,000 steps"); a table or figure of them names these, since no column shows them."""
    parts = []
    column = length_column(task)
    lengths = runs[column].dropna().unique() if column in runs else []
    if len(lengths) == 1:
        parts.append(f"length {tidy(lengths[0])}")
    steps = runs["train.steps"].dropna().unique() if "train.steps" in runs else []
    if len(steps) == 1:
        parts.append(f"{tidy(steps[0]):,} steps")
    return parts


def both_readings(frame: pd.DataFrame) -> pd.DataFrame:
    """`min_depth_by_length` with both readings in each cell: "reliably (any seed)"."""
    readings = min_depth_by_length(frame)
    reliable, any_seed = readings["min_layers"], readings["min_layers_any"]
    if reliable.empty:
        return reliable
    lengths = [c for c in reliable.columns if c.startswith("length=") or c == "min_layers"]
    for column in lengths:
        reliable[column] = [f"{r} ({a})" if r else "" for r, a in
                            zip(reliable[column], any_seed[column])]
    return reliable


def display_table(table: pd.DataFrame, frame: pd.DataFrame, per_run: bool, as_text: bool = True
                  ) -> pd.DataFrame:
    """The columns a reader wants, in order; a learning rate val picked on an edge of the grid
    it ran is marked "(edge)"; for a task with a solved threshold the seeds that solved it on
    the headline split, with the 95% Wilson interval of that rate; per test split "mean ± sd
    [low, high]" text or (``as_text`` False, for CSV) numeric columns, SPLIT, SPLIT_std (a sample standard deviation)
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
    if not per_run and table["lr_at_edge"].any():  # the pick lies on an edge of the grid
        if as_text:
            shown["lr"] = [f"{lr:g}" + (" (edge)" if edge else "")
                           for lr, edge in zip(shown["lr"], table["lr_at_edge"])]
        else:
            shown["lr_at_edge"] = table["lr_at_edge"]
    if per_run:
        return _with_intervals(shown, as_text)
    splits = list(dict.fromkeys(s for split_list in frame["splits"] for s in split_list))
    shown["ok/seeds"] = [f"{ok}/{seeds}" for ok, seeds in zip(table["ok"], table["seeds"])]
    unit = " (%)" if set(table["metric"]) == {"error"} else ""
    headline = splits[0] if splits else None
    if table["budget_limited"].notna().any():  # runs cut short by their budget
        if as_text:
            shown["budget-limited"] = ["" if pd.isna(count) else f"{int(count)}/{n}"
                                       for count, n in zip(table["budget_limited"],
                                                           table["seeds"])]
        else:
            shown["budget_limited"] = table["budget_limited"]
    if table["solved_threshold"].notna().any():  # seeds that solved, with the rate's interval
        column = f"solved/seeds ({headline})"
        if as_text:
            shown[column] = [solve_rate_text(row) for _, row in table.iterrows()]
        else:
            shown[f"solved_seeds ({headline})"] = table["solved_seeds"]
            shown["solve_low"], shown["solve_high"] = table["solve_low"], table["solve_high"]
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
    for metric in SECONDARY_METRICS:
        column = f"{headline}:{metric}"
        if column not in frame or frame[column].isna().all():
            continue
        finished = frame[frame["status"] == "ok"]
        stats = finished.groupby(["cell", "lr"])[column].agg(["mean", "std"])
        means, sds = zip(*[stats.loc[key] if key in stats.index else (math.nan, math.nan)
                           for key in zip(table["cell"], table["lr"])])
        name = f"{metric.replace('_', ' ')} ({headline})"
        after = list(shown.columns).index(headline + unit) + 1 if headline + unit in shown else 0
        if as_text:
            shown.insert(after, name, [_mean_std(mean, sd) for mean, sd in zip(means, sds)])
        else:
            shown[name], shown[f"{name}_std"] = means, sds
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


def model_family(name: str) -> str | None:
    """The family of a registered model ("attention" or "recurrent"); None for a name that is
    not one (a baseline, a construction, a plugin that is not installed here)."""
    from pathbench import UserError
    from pathbench.models import ATTENTIONS

    if name not in ATTENTIONS.names():
        return None
    try:
        return ATTENTIONS.get(name).family
    except UserError:  # a plugin that fails to load
        return None


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


def results_text(frame: pd.DataFrame, table: pd.DataFrame, per_run: bool, fmt: str) -> str:
    """`pathbench results`' text: per task its table (``table``: the runs, or their cells) and,
    where depth varies on a task with a threshold, its minimum layers to solve, then a note on
    what the numbers are."""
    sections = []  # one table per task, with the columns that task's runs use
    for name, task_frame in frame.groupby("task", sort=True):
        shown = display_table(table[table["task"] == name], task_frame, per_run)
        fixed = fixed_settings(name, task_frame)
        title = f"{name} ({', '.join(fixed)})" if fixed else name
        heading = f"### {title}\n" if fmt == "markdown" else f"{title}:"
        sections.append(f"{heading}\n{render(shown.drop(columns='task'), fmt)}")
        not_ok = task_frame[task_frame["status"] != "ok"]
        if len(not_ok):  # why, run by run: the tables count these runs but show no value
            sections.append(f"{name}: runs that did not end ok\n" + "\n".join(
                f"- {row['run_id']}: {row['status']}: "
                f"{str(row.get('reason') or 'no reason recorded').splitlines()[0]}"
                for _, row in not_ok.iterrows()))
        if not per_run and task_frame["solved_threshold"].notna().any() \
                and task_frame["layers"].nunique() > 1:
            depth = both_readings(task_frame).drop(columns="task")
            threshold = task_frame["solved_threshold"].dropna().iloc[0]
            sections.append(f"{title}: minimum layers to solve: two thirds of the seeds at "
                            f">= {threshold:g} on test (in brackets: any seed), at the learning "
                            f"rate val picked; >N?: unresolved, some runs still improving when "
                            f"their budget ended; ≤N?: solved with N, a shallower depth "
                            f"unresolved in that way\n{render(depth, fmt)}")
    note = ("one row per run; rates with their 95% Wilson interval" if per_run else
            "learning rate picked on val (--all-lrs: every one); test splits: mean ± sample "
            "standard deviation (n - 1) over the seeds that finished ok; [low, high]: the 95% "
            "Wilson interval of the rate pooled over those seeds, each distinct read counted once")
    return "\n\n".join(sections) + f"\n\n({note})"
