"""One setting's value as the type its config declares: the rule shared by task, model and
training configs, whether the value comes from the command line (a string), a TOML file or
Python.

- ``int``: an integer, or a float with an integral value (``4.0``, as TOML and JSON may write
  it), or a string of an integer; never a bool.
- ``float``: a finite number (not a bool), or a string of one.
- ``bool``: a bool, or one of the strings true/yes/1 and false/no/0.
- ``str``: a string.
- ``X | None``: also None, or the string none or null.
- ``dict[str, int]``: a mapping of names to integers, or a string like ``sparse:300000,dense:4096``
  (the empty string is the empty mapping).
- ``tuple[int, ...]``: a list of integers, or a string like ``1024,4096`` (the empty string is
  the empty tuple).
"""

from __future__ import annotations

import math
import numbers
import types
import typing
from typing import Any

from pathbench import UserError

TRUE_WORDS, FALSE_WORDS, NONE_WORDS = ("true", "yes", "1"), ("false", "no", "0"), ("none", "null")


def coerce(name: str, value: Any, annotation: Any) -> Any:
    """``value`` as ``annotation`` (see the module docstring), or a UserError
    "NAME expects TYPE, got VALUE"."""
    if typing.get_origin(annotation) is dict:
        return _mapping(name, value, *typing.get_args(annotation))
    if typing.get_origin(annotation) is tuple:
        return _sequence(name, value, typing.get_args(annotation)[0])
    allowed = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        allowed = list(typing.get_args(annotation))
    optional = type(None) in allowed
    target = next(t for t in allowed if t is not type(None))
    text = value.strip() if isinstance(value, str) else None
    if value is None or (optional and text is not None and text.lower() in NONE_WORDS):
        if optional:
            return None
    else:
        converted = _convert(value, text, target)
        if converted is not None:
            return converted
    expected = target.__name__ + (" or none" if optional else "")
    raise UserError(f"{name} expects {expected}, got {value!r}")


def _mapping(name: str, value: Any, key_type: type, value_type: type) -> dict:
    if isinstance(value, str):
        pairs = [item.partition(":") for item in value.split(",") if item.strip()]
        if not all(sep and key.strip() for key, sep, _ in pairs):
            raise UserError(f"{name} expects NAME:VALUE pairs separated by commas, got {value!r}")
        value = {key.strip(): item for key, _, item in pairs}
    if not isinstance(value, dict) or not all(isinstance(key, key_type) for key in value):
        raise UserError(f"{name} expects a mapping like name:value,name:value, got {value!r}")
    return {key: coerce(f"{name}[{key!r}]", item, value_type) for key, item in value.items()}


def _sequence(name: str, value: Any, item_type: type) -> tuple:
    if isinstance(value, str):
        value = [item for item in value.split(",") if item.strip()]
    if not isinstance(value, (list, tuple)):
        raise UserError(f"{name} expects a list like 1,2,3, got {value!r}")
    return tuple(coerce(f"{name}[{number}]", item, item_type)
                 for number, item in enumerate(value))


def _convert(value: Any, text: str | None, target: type) -> Any:
    """value as target, or None when it is not one."""
    if isinstance(value, bool):
        return value if target is bool else None
    if target is bool:
        if text is not None and text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        return None
    if target is str:
        return value if isinstance(value, str) else None
    try:
        if target is int:
            if isinstance(value, numbers.Integral):
                return int(value)
            if isinstance(value, numbers.Real) and float(value).is_integer():
                return int(value)
            return int(text) if text is not None else None
        if target is float:
            number = float(text) if text is not None else (
                float(value) if isinstance(value, numbers.Real) else None)
            return number if number is not None and math.isfinite(number) else None
    except ValueError:
        return None
    raise TypeError(f"settings of type {target!r} are not supported")
