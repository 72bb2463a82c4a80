"""The task interface: `Task`, `Dataset`, strict configuration, and the `TASKS` registry.

A task is a class with a configuration dataclass (``Config``), a vocabulary, named splits and a
``sample`` method that draws sequences with numpy. The base class turns a user's overrides into
a validated configuration and gives every split its own random stream:

    rng = np.random.default_rng(np.random.SeedSequence([split_key(split), seed]))

where ``split_key`` is the CRC-32 of the split's name. The same (configuration, split, seed)
therefore gives identical arrays on any machine, and the train and test splits draw from
different streams for every seed.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pathbench import UserError
from pathbench.registry import Registry
from pathbench.settings import coerce


IGNORE_INDEX = -100  # target value of a position that is not scored (torch's cross-entropy default)


@dataclass
class Dataset:
    """A batch of sequences: ``inputs`` and ``targets`` are int64 arrays of shape [num, length].

    ``targets[n, t]`` is the token the model must predict after reading ``inputs[n, :t+1]``,
    or ``IGNORE_INDEX`` (-100) where position t is not scored. Both index into ``vocab``.
    """

    inputs: np.ndarray
    targets: np.ndarray
    vocab: list[str]

    def __len__(self) -> int:
        return len(self.inputs)


def option(default: Any, help: str, *, choices=None, minimum=None, maximum=None):
    """A configuration field: its default, a one-line help, and the values it accepts.

    ``minimum``/``maximum`` are inclusive bounds; ``choices`` is a closed set of values.
    """
    metadata = {"help": help, "choices": choices, "minimum": minimum, "maximum": maximum}
    return dataclasses.field(default=default, metadata=metadata)


def split_key(split: str) -> int:
    """The number that identifies a split's random stream (stable across runs and machines)."""
    return zlib.crc32(split.encode())


class Task:
    """Base class of every task, built-in or plugin.

    A subclass sets the class attributes ``name``, ``version`` (bump it whenever the data for a
    given configuration and seed changes), ``description`` (one line), ``Config`` (a dataclass
    whose fields are declared with `option`), ``run_defaults`` ({"model": {...}, "train":
    {...}}) and, where it differs from the default, ``primary_metric`` and ``solved_threshold``.
    In ``__init__`` (after calling ``super().__init__``) it sets ``vocab`` and ``splits``
    ("train" first). It implements `sample`, and may extend `metrics`.

    Construct a task with `make_task`, which looks the name up in the registry; overrides are
    validated strictly (unknown keys and invalid values raise `pathbench.UserError`). The
    resolved configuration is ``options`` (the ``Config`` instance, for the task's own code)
    and ``config`` (the same as a plain dict, for records and tables).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type]
    run_defaults: dict
    primary_metric: ClassVar[str] = "accuracy"
    solved_threshold: ClassVar[float | None] = None

    vocab: list[str]
    splits: tuple[str, ...]

    def __init__(self, overrides: dict[str, Any] | None = None):
        self.options = resolve_config(self.Config, overrides or {}, owner=f"task {self.name!r}")
        self.config = dataclasses.asdict(self.options)
        # A copy per instance, so that a caller editing its defaults cannot change another task's.
        self.run_defaults = copy.deepcopy(type(self).run_defaults)

    def sample(
        self, rng: np.random.Generator, num: int, split: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``num`` sequences of ``split``: (inputs, targets), integer arrays [num, length]."""
        raise NotImplementedError

    def generate(self, num: int, seed: int, split: str) -> Dataset:
        """``num`` sequences of ``split``; deterministic in (configuration, split, seed).

        Each split draws from its own stream, seeded by (split_key(split), seed).
        """
        if split not in self.splits:
            raise UserError(
                f"task {self.name!r} has no split {split!r}; valid splits: {', '.join(self.splits)}"
            )
        if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
            raise UserError(f"the number of sequences must be a positive integer, got {num!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UserError(f"the seed must be a non-negative integer, got {seed!r}")
        rng = np.random.default_rng(np.random.SeedSequence([split_key(split), int(seed)]))
        inputs, targets = self.sample(rng, int(num), split)
        inputs, targets = inputs.astype(np.int64, copy=False), targets.astype(np.int64, copy=False)
        return Dataset(inputs, targets, list(self.vocab))

    def metrics(self, predictions: np.ndarray, targets: np.ndarray, split: str) -> dict[str, Any]:
        """Scores of argmax predictions [N, L] against targets [N, L] on the scored positions.

        Returns at least {"accuracy": float in [0, 1]}; subclasses add task-specific entries.
        """
        predictions, targets = np.asarray(predictions), np.asarray(targets)
        if predictions.shape != targets.shape:
            raise ValueError(f"predictions {predictions.shape} and targets {targets.shape} differ")
        scored = targets != IGNORE_INDEX
        correct = (predictions == targets) & scored
        accuracy = correct.sum() / scored.sum() if scored.any() else float("nan")
        return {"accuracy": float(accuracy)}


TASKS = Registry("task", "pathbench.tasks", Task)


def make_task(name: str, overrides: dict[str, Any] | None = None) -> Task:
    """The registered task ``name`` with its default configuration updated by ``overrides``.

    Override values may be strings from the command line; they are converted to the key's type.
    """
    return TASKS.get(name)(overrides)


def default_config(config_class: type) -> dict[str, Any]:
    """The defaults of a configuration dataclass, without constructing a task."""
    return {field.name: field.default for field in dataclasses.fields(config_class)}


def resolve_config(config_class: type, overrides: dict[str, Any], owner: str):
    """``config_class`` built from its defaults and ``overrides``, every value checked.

    Raises `pathbench.UserError` naming the key and what it accepts. Cross-field rules live in
    the dataclass's ``__post_init__``, which raises UserError too.
    """
    fields = {field.name: field for field in dataclasses.fields(config_class)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise UserError(
            f"{owner}: unknown config key {unknown[0]!r}; valid keys: {', '.join(fields)}"
        )
    types_by_name = typing.get_type_hints(config_class)
    try:
        values = {
            key: _checked_value(key, value, types_by_name[key], fields[key].metadata)
            for key, value in overrides.items()
        }
        return config_class(**values)
    except UserError as exc:
        raise UserError(f"{owner}: {exc}") from None


def _checked_value(key: str, value: Any, annotation: Any, rules: dict[str, Any]) -> Any:
    value = coerce(repr(key), value, annotation)
    if value is None:
        return value
    choices, minimum, maximum = rules.get("choices"), rules.get("minimum"), rules.get("maximum")
    if choices is not None and value not in choices:
        raise UserError(
            f"invalid value {value!r} for {key!r}; valid values: {', '.join(map(str, choices))}"
        )
    if minimum is not None and value < minimum:
        raise UserError(f"invalid value {value!r} for {key!r}; it must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise UserError(f"invalid value {value!r} for {key!r}; it must be <= {maximum}")
    return value
