"""The one rule by which task, model and training settings read their values."""

from __future__ import annotations

import numpy as np
import pytest

from pathbench import UserError
from pathbench.settings import coerce


@pytest.mark.parametrize("value, annotation, expected", [
    ("4", int, 4), (4.0, int, 4), (np.int64(3), int, 3), (np.float32(2.0), int, 2),
    ("1e-3", float, 1e-3), (3, float, 3.0), (" 0.5 ", float, 0.5),
    ("yes", bool, True), ("0", bool, False), (False, bool, False),
    ("none", int | None, None), ("Null", float | None, None), (None, float | None, None),
    ("7", int | None, 7), ("abc", str, "abc"),
    ("1024, 4096", tuple[int, ...], (1024, 4096)), ([8, 16.0], tuple[int, ...], (8, 16)),
    ("", tuple[int, ...], ()),
])
def test_values_are_read_as_the_declared_type(value, annotation, expected):
    result = coerce("x", value, annotation)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("value, annotation, message", [
    (4.5, int, "x expects int, got 4.5"),
    (True, int, "x expects int, got True"),
    ("two", int, "x expects int, got 'two'"),
    ("4.0", int, "x expects int, got '4.0'"),
    (float("inf"), float, "x expects float, got inf"),
    ("nan", float, "x expects float, got 'nan'"),
    (True, float, "x expects float, got True"),
    (None, int, "x expects int, got None"),
    ("none", int, "x expects int, got 'none'"),
    ("maybe", bool, "x expects bool, got 'maybe'"),
    (1, bool, "x expects bool, got 1"),
    (3, str, "x expects str, got 3"),
    ([1], int | None, "x expects int or none, got [1]"),
    ("8,x", tuple[int, ...], "x[1] expects int, got 'x'"),
    (8, tuple[int, ...], "x expects a list like 1,2,3, got 8"),
])
def test_other_values_are_one_clear_error(value, annotation, message):
    with pytest.raises(UserError) as error:
        coerce("x", value, annotation)
    assert str(error.value) == message
