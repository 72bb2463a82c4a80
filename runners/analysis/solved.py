"""The solved rule: when a cell of runs counts as having solved a task.

A cell (a configuration up to its seed and learning rate) *solves* a task that has a
``solved_threshold`` (0.9 for the word problems) when at least two thirds of its seeds reach the
threshold: two of three, three of four, one of one. It is applied on ``val`` for ``sweep
--until-solved``'s decision to stop adding layers, and on the first test split (the headline)
for what tables report.
"""

from __future__ import annotations

import math

import pandas as pd


def solved(values: pd.Series, seeds: int, threshold) -> bool:
    """Whether at least two thirds of ``seeds`` seeds reach ``threshold`` (``values``: the
    metric of the seeds that finished; None or NaN: the task has no threshold)."""
    if threshold is None or (isinstance(threshold, float) and math.isnan(threshold)):
        return False
    return bool(seeds) and 3 * int((values >= threshold).sum()) >= 2 * seeds
