"""Cells: the runs of one configuration up to their seed and learning rate, summarised.

Validation decides, test reports: a cell is reported at the learning rate whose runs finished
most often without diverging and, among those, had the highest mean of the primary metric on
``val`` (each record's final validation metrics). Its value on every test split is then the
mean over its seeds at that learning rate (runs that diverged or failed have no metrics), and
its spread the sample standard deviation over those seeds (n - 1) or their min..max. A rate
measured on N scored positions also has its 95% Wilson interval: per run, and in a cell's row
that of the rate pooled over its seeds, with each distinct read counted once (the seeds read
the same evaluation sequences), which says how finely the evaluation data resolve the rate
(the spread over seeds is beside it). Whether a cell solved its task is
`pathbench.runners.analysis.solved`'s rule.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pathbench.runners.analysis.records import setting_columns
from pathbench.runners.analysis.solved import solved, solved_seeds
from pathbench.runners.training.config import DECISION_SPLIT

# Columns that name a configuration in tables; the rest of the config is in "task.*",
# "model.*" and "train.*" columns, shown only when they vary.
NAME_COLUMNS = ["task", "model", "layers", "heads", "d_model"]
PERCENT_METRICS = {"error"}  # metrics a task reports in percent; the rest are fractions
RATE_METRICS = {"accuracy", *PERCENT_METRICS}  # rates of scored positions: Wilson intervals


def varying_config_columns(frame: pd.DataFrame) -> list[str]:
    """The task./model./train. columns whose value differs between the runs shown."""
    return [c for c in setting_columns(frame) if frame[c].astype(str).nunique() > 1]


def aggregate(frame: pd.DataFrame, metric: str | None = None, best_lr: bool = True
              ) -> pd.DataFrame:
    """One row per cell (and learning rate unless ``best_lr``): seeds, ok runs, and the mean,
    sample standard deviation, min and max of ``metric`` (default: the primary metric) on every
    test split. ``score`` is the mean primary metric on val, which picks the learning rate;
    ``val_solved`` and ``solved`` say whether two thirds of the seeds reach the task's threshold
    on val and on the headline test split, ``val_solved_seeds`` how many reach it on val; ``solved_seeds`` counts the seeds that reach it on
    the headline split, with the 95% Wilson interval of that solve rate (solve_low,
    solve_high); ``budget_limited`` counts the runs that ended at their step cap with val still
    improving (None where the records do not say). ``lr_at_edge``: the learning rate is the
    lowest or the highest of two or more the cell ran, and beats every other one on val (a
    rate tied with another says nothing of what lies beyond the grid). Of tied learning rates
    the smallest is picked. A rate with a count of scored positions also gets the 95% Wilson interval of
    the rate pooled over the seeds (SPLIT_low, SPLIT_high)."""
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
            # equal values: exactly 0, not the float residue that std's two passes leave
            row[f"{split}_std"] = 0.0 if values.nunique() == 1 and len(values) > 1 \
                else values.std(ddof=1)
            row[f"{split}_min"] = values.min()
            row[f"{split}_max"] = values.max()
            row[f"{split}_low"], row[f"{split}_high"] = _pooled_interval(runs, split, name)
        primary = first["primary_metric"]
        scores = _values(runs, f"{DECISION_SPLIT}:{primary}")
        row["score"] = scores.mean() if len(scores) else -math.inf
        threshold = first["solved_threshold"]
        row["val_solved"] = solved(scores, len(runs), threshold)
        row["val_solved_seeds"] = solved_seeds(scores, threshold)
        headline = _values(runs, f"{row['headline']}:{primary}")
        row["solved"] = solved(headline, len(runs), threshold)
        row["solved_seeds"] = solved_seeds(headline, threshold)
        row["solve_low"], row["solve_high"] = wilson_interval(row["solved_seeds"] / len(runs),
                                                              len(runs))
        known = runs["budget_limited"].dropna() if "budget_limited" in runs else []
        row["budget_limited"] = int((known == True).sum()) if len(known) else None  # noqa: E712
        rows.append(row)
    table = pd.DataFrame(rows)
    if len(table):  # a pick on the edge of a grid of learning rates may lie beyond it
        grids = table.groupby("cell")["lr"].agg(["min", "max", "nunique"])
        bounds = grids.loc[table["cell"]]
        on_edge = ((bounds["nunique"].to_numpy() > 1)
                   & ((table["lr"].to_numpy() == bounds["min"].to_numpy())
                      | (table["lr"].to_numpy() == bounds["max"].to_numpy())))
        rank = list(zip(table["ok"], table["score"]))
        table["lr_at_edge"] = on_edge & np.array(
            [all(rank[i] > rank[j] for j in np.flatnonzero(table["cell"] == cell) if j != i)
             for i, cell in enumerate(table["cell"])], dtype=bool)
    if best_lr and len(table):
        table = (table.sort_values(["ok", "score", "lr"], ascending=[False, False, True],
                                   kind="stable")
                 .drop_duplicates("cell").sort_index())
    return table.reset_index(drop=True)


def _values(runs: pd.DataFrame, column: str) -> pd.Series:
    return runs[column].dropna() if column in runs else pd.Series(dtype=float)


def _pooled_interval(runs: pd.DataFrame, split: str, metric: str) -> tuple[float, float]:
    """The 95% Wilson interval of the rate pooled over the runs' scored positions of ``split``
    (in the metric's unit), counting each distinct read once: a cell's seeds are scored on the
    same evaluation sequences, so the reads behind the pooled rate are those of one run (the
    most any run scored). NaN where the metric is not a rate with counts."""
    if metric not in RATE_METRICS or f"{split}:scored" not in runs:
        return math.nan, math.nan
    both = runs[[f"{split}:{metric}", f"{split}:scored"]].dropna()
    total = int(both.iloc[:, 1].sum())
    if not total:
        return math.nan, math.nan
    rate = float((both.iloc[:, 0] * both.iloc[:, 1]).sum()) / total
    return rate_interval(rate, int(both.iloc[:, 1].max()), metric)


def rate_interval(value: float, n: int, metric: str) -> tuple[float, float]:
    """The 95% Wilson interval of a rate metric's value measured on n positions, in the
    metric's unit (percent for error)."""
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    low, high = wilson_interval(value / scale, n)
    return low * scale, high * scale


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
