"""The solved rule: when a cell of runs counts as having solved a task.

A seed *solves* a task that has a ``solved_threshold`` (0.9 for the word problems) when its
metric reaches the threshold. A cell (a configuration up to its seed and learning rate) has a
solve rate, the seeds that solved out of those run, with its 95% Wilson interval; it *solves*
the task (learns it reliably) when at least two thirds of its seeds do: two of three, three of
four, one of one. One seed that solves shows that the model can express the task at this
budget. The rule is applied on ``val`` for ``sweep --until-solved``'s decision to stop adding
layers, and on the first test split (the headline) for what tables report.
"""

from __future__ import annotations

import math

import pandas as pd


def solved_seeds(values: pd.Series, threshold) -> int:
    """How many of the seeds' metric ``values`` reach ``threshold`` (None or NaN: the task has
    no threshold, and none does)."""
    if threshold is None or (isinstance(threshold, float) and math.isnan(threshold)):
        return 0
    return int((values >= threshold).sum())


def solved(values: pd.Series, seeds: int, threshold) -> bool:
    """Whether at least two thirds of ``seeds`` seeds reach ``threshold`` (``values``: the
    metric of the seeds that finished; None or NaN: the task has no threshold)."""
    return bool(seeds) and 3 * solved_seeds(values, threshold) >= 2 * seeds
