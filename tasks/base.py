"""The task interface: `Task`, `Dataset`, strict configuration, and the `TASKS` registry.

A task is a class with a configuration dataclass (``Config``), a vocabulary, named splits and a
``sample`` method that draws sequences with numpy. The base class turns a user's overrides into
a validated configuration and gives every split its own random stream:

    rng = np.random.default_rng(np.random.SeedSequence([split_key(split), seed]))

where ``split_key`` is the CRC-32 of the split's name. The same (configuration, split, seed)
therefore gives identical arrays on any machine, and no two splits share a stream for any seed.

Every task has the splits ``train`` (first), ``val`` (second) and one or more test splits.
``val`` follows the training distribution on a stream of its own; it is the split that decides
(early stopping, the learning rate a sweep picks, whether a model solved the task), and the test
splits only report.
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
PRESETS = ("paper", "cpu")  # setting sizes: the task's run_defaults, or a smaller one
# The longest sequence a built-in task generates: far beyond what attention here trains on, so
# that a typo is an error at once rather than a machine filling its memory.
MAX_LENGTH = 1 << 20


def _with_eval_lengths(task_class: type, length_setting: str) -> type:
    """The task's ``Config`` with the field ``eval_lengths`` added last (the lengths of extra
    test splits ``test_N``), named as the task's attribute so that it pickles."""
    config_class = task_class.Config
    field = option((), f"lengths of extra test splits test_N, N each greater than "
                       f"{length_setting}", minimum=2, maximum=MAX_LENGTH)
    derived = dataclasses.make_dataclass(
        config_class.__name__, [("eval_lengths", tuple[int, ...], field)],
        bases=(config_class,), frozen=config_class.__dataclass_params__.frozen,
        namespace={"__doc__": config_class.__doc__})
    # Python 3.12's make_dataclass sets __module__ to its caller's module (this one), so both
    # names are set afterwards, on every version.
    derived.__module__ = task_class.__module__
    derived.__qualname__ = f"{task_class.__qualname__}.Config"
    return derived


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


def _owner(task_class: type) -> str:
    """A task class as messages name it: its registered name and where it is defined."""
    return (f"task {getattr(task_class, 'name', task_class.__qualname__)!r} "
            f"({task_class.__module__}.{task_class.__qualname__})")


def _check_settings(task_class: type, what: str, value, sections: tuple[str, ...]) -> None:
    if not (isinstance(value, dict) and set(value) <= set(sections)
            and all(isinstance(part, dict) for part in value.values())):
        raise UserError(f"{_owner(task_class)}: {what} must be a dict of settings by section "
                        f"({', '.join(sections)}), got {value!r}")


def _checked_splits(task_class: type, declared) -> tuple[tuple[str, ...], bool]:
    """``declared`` as (splits, whether "val" was added), or a UserError if it breaks the order
    "train", "val", test splits. A missing "val" is added right after "train"."""
    owner = _owner(task_class)
    if isinstance(declared, str) or not all(isinstance(split, str) for split in declared):
        raise UserError(f"{owner}: splits must be a tuple of split names, got {declared!r}")
    splits = tuple(declared)
    if not splits or splits[0] != "train":
        raise UserError(f"{owner}: splits must start with 'train', got {splits!r}")
    if len(set(splits)) != len(splits):
        raise UserError(f"{owner}: splits name a split twice: {splits!r}")
    added = "val" not in splits
    if added:
        splits = ("train", "val", *splits[1:])
    elif splits[1] != "val":
        raise UserError(f"{owner}: 'val' must be the second split, right after 'train', "
                        f"got {splits!r}")
    if len(splits) < 3:
        raise UserError(f"{owner}: splits need at least one test split after 'train' and "
                        f"'val', e.g. ('train', 'val', 'test'); got {tuple(declared)!r}")
    return splits, added


class Task:
    """Base class of every task, built-in or plugin.

    A subclass sets the class attributes ``name``, ``version`` (bump it whenever the data for a
    given configuration and seed changes), ``description`` (one line), ``Config`` (a dataclass
    whose fields are declared with `option`), ``run_defaults`` ({"model": {...}, "train":
    {...}}, the paper's or the task's own setting; default: pathbench's defaults), ``presets``
    (smaller settings by name, {"cpu": {"task": {...}, "model": {...}, "train": {...}}}, laid
    over ``run_defaults`` under ``--preset cpu`` and by default on a CPU) and, where it differs
    from the default, ``primary_metric`` and ``solved_threshold``.
    In ``__init__`` (after calling ``super().__init__``) it sets ``vocab`` and ``splits``. It
    implements `sample`, and may extend `metrics` and `baselines`.

    Training data on the device: a task may also implement `sample_tensors`, the same
    distribution drawn with torch on a torch.Generator's device, which `generate_tensors` calls
    (seeded like `generate`); training on a GPU then draws its batches there. Evaluation data
    always come from `sample`, fixed and hashed.

    Length: a task whose sequences have a length set by one ``Config`` field names that field in
    ``length_setting`` ("length" for every built-in; ``length`` reads it). Such a task can also
    be tested on longer sequences: this class adds the setting ``eval_lengths`` (after the
    task's own fields), checks it, and adds a test split ``test_N`` for each N in it, drawn as
    the first test split is, at length N, on a random stream of its own; `sample` never sees
    these splits.

    Splits: ``splits[0]`` is ``"train"`` and ``splits[1]`` is ``"val"``, drawn from the training
    distribution; the rest (`test_splits`) are the test splits, which only report. A task that
    declares ``val`` samples it itself (flip-flop's ``val``, like its ``train``, uses p_ignore
    0.8). A task whose ``splits`` lacks ``val`` (one written before this split existed) gets it
    from this class: ``val`` is inserted after ``train``, and `generate` draws it by calling
    ``sample(rng, num, "train")`` with val's own random stream, so its ``sample`` never sees an
    unknown name. Any other departure from this order (``train`` not first, ``val`` elsewhere
    than second, a name twice, no test split) is a `pathbench.UserError` naming the task's
    class, raised when ``splits`` is set. ``splits`` may also be a class attribute, checked the
    same way when the class is defined.

    Construct a task with `make_task`, which looks the name up in the registry; overrides are
    validated strictly (unknown keys and invalid values raise `pathbench.UserError`). The
    resolved configuration is ``options`` (the ``Config`` instance, for the task's own code)
    and ``config`` (the same as a plain dict, for records and tables).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type]
    run_defaults: dict = {}  # {"model": {...}, "train": {...}}; nothing: the built-in defaults
    presets: ClassVar[dict] = {}  # e.g. {"cpu": {"task": {...}, "train": {...}}}
    primary_metric: ClassVar[str] = "accuracy"
    solved_threshold: ClassVar[float | None] = None
    length_setting: ClassVar[str | None] = None  # the Config field that sets the length

    vocab: list[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _check_settings(cls, "run_defaults", cls.run_defaults, ("model", "train"))
        if not isinstance(cls.presets, dict) or not set(cls.presets) <= set(PRESETS[1:]):
            raise UserError(f"{_owner(cls)}: presets must be a dict with keys among "
                            f"{', '.join(PRESETS[1:])}, got {cls.presets!r}")
        for name, preset in cls.presets.items():
            _check_settings(cls, f"presets[{name!r}]", preset, ("task", "model", "train"))
        config_class = cls.__dict__.get("Config")
        if cls.length_setting is not None and config_class is not None:
            names = [field.name for field in dataclasses.fields(config_class)]
            if cls.length_setting not in names:
                raise UserError(f"{_owner(cls)}: length_setting {cls.length_setting!r} is not "
                                f"a field of its Config; fields: {', '.join(names)}")
            if "eval_lengths" in names:
                raise UserError(f"{_owner(cls)}: its Config declares 'eval_lengths', which "
                                f"the Task base class adds to a task with a length_setting")
            cls.Config = _with_eval_lengths(cls, cls.length_setting)
        declared = cls.__dict__.get("splits")
        if declared is not None and not isinstance(declared, property):
            # A class attribute would hide the property below: check it now, keep it aside.
            delattr(cls, "splits")
            cls._class_splits = _checked_splits(cls, declared)

    @property
    def splits(self) -> tuple[str, ...]:
        """The split names: ``"train"``, ``"val"``, then the test splits (the longer ones
        ``test_N`` last)."""
        return self._declared_splits()[0] + tuple(self._longer_splits())

    @property
    def length(self) -> int | None:
        """The length of the training sequences (None: the task names no ``length_setting``)."""
        return None if self.length_setting is None else getattr(self.options, self.length_setting)

    def _longer_splits(self) -> dict[str, int]:
        """The longer test splits, ``test_N`` -> N."""
        lengths = self.options.eval_lengths if self.length_setting is not None else ()
        return {f"test_{length}": length for length in lengths}

    def at_length(self, length: int) -> "Task":
        """This task with its sequences ``length`` long (its longer test splits dropped)."""
        task = copy.copy(self)
        task.options = dataclasses.replace(self.options, **{self.length_setting: length,
                                                           "eval_lengths": ()})
        task.config = dataclasses.asdict(task.options)
        return task

    @splits.setter
    def splits(self, declared) -> None:
        self._instance_splits = _checked_splits(type(self), declared)

    @property
    def test_splits(self) -> tuple[str, ...]:
        """The splits that only report: every split after ``train`` and ``val``."""
        return self.splits[2:]

    def _declared_splits(self) -> tuple[tuple[str, ...], bool]:
        # (the splits, whether this class supplies "val" as the train distribution)
        checked = self.__dict__.get("_instance_splits") or getattr(self, "_class_splits", None)
        if checked is None:
            raise AttributeError(f"task {self.name!r} has not set its splits")
        return checked

    def __init__(self, overrides: dict[str, Any] | None = None):
        self.options = resolve_config(self.Config, overrides or {}, owner=f"task {self.name!r}")
        self.config = dataclasses.asdict(self.options)
        if self.length_setting is not None:
            self._check_eval_lengths()
        # A copy per instance, so that a caller editing its defaults cannot change another task's.
        self.run_defaults = copy.deepcopy(type(self).run_defaults)

    def _check_eval_lengths(self) -> None:
        """Each longer test length exceeds the training length, appears once, and is a length
        the task takes."""
        owner, lengths = f"task {self.name!r}", self.options.eval_lengths
        for value in lengths:
            if value <= self.length:
                raise UserError(f"{owner}: invalid value {value} in 'eval_lengths'; each must be "
                                f"greater than {self.length_setting} ({self.length})")
            try:
                self.at_length(value)
            except UserError as exc:
                raise UserError(f"{owner}: invalid value {value} in 'eval_lengths': "
                                f"{exc}") from None
        if len(set(lengths)) != len(lengths):
            raise UserError(f"{owner}: 'eval_lengths' names a length twice: "
                            f"{','.join(map(str, lengths))}")

    def sample(
        self, rng: np.random.Generator, num: int, split: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``num`` sequences of ``split``: (inputs, targets), integer arrays [num, length]."""
        raise NotImplementedError

    def sample_tensors(self, generator, num: int, split: str):
        """Draw ``num`` sequences of ``split`` with torch, on ``generator``'s device, in the
        distribution of `sample`: (inputs, targets), int64 tensors [num, length]."""
        raise NotImplementedError

    def device_array(self, array: np.ndarray, device):
        """``array`` as a tensor on ``device``, copied there once per task and device: a copy
        from the host at every draw would wait for the device's queue to empty."""
        import torch

        copies = self.__dict__.setdefault("_device_arrays", {})
        key = (id(array), str(device))
        if key not in copies:
            copies[key] = (array, torch.as_tensor(array, device=device))
        return copies[key][1]

    def __getstate__(self):
        return {key: value for key, value in self.__dict__.items() if key != "_device_arrays"}

    @property
    def samples_on_device(self) -> bool:
        """Whether the task implements `sample_tensors`."""
        return type(self).sample_tensors is not Task.sample_tensors

    def generate_tensors(self, num: int, seed: int, split: str, device):
        """``num`` sequences of ``split`` drawn by `sample_tensors` on ``device``, deterministic
        in (configuration, split, seed, device kind): (inputs, targets) int64 tensors."""
        import torch

        task, distribution = self._distribution(split)
        generator = torch.Generator(device=device)
        generator.manual_seed(int(np.random.SeedSequence([split_key(split), int(seed)])
                                  .generate_state(2, np.uint64)[0] >> np.uint64(1)))
        inputs, targets = task.sample_tensors(generator, int(num), distribution)
        if inputs.shape != targets.shape or inputs.ndim != 2 or len(inputs) != num \
                or inputs.dtype != torch.int64 or targets.dtype != torch.int64:
            raise UserError(f"{_owner(type(self))}: sample_tensors() returned tensors of shape "
                            f"{tuple(inputs.shape)} and {tuple(targets.shape)} ({inputs.dtype}, "
                            f"{targets.dtype}), not two int64 tensors [{num}, length]")
        return inputs, targets

    def _distribution(self, split: str) -> tuple["Task", str]:
        """The task (itself, or itself at a longer length) and the split whose distribution
        ``split`` is drawn from."""
        _, val_is_train = self._declared_splits()
        if split not in self.splits:
            raise UserError(
                f"task {self.name!r} has no split {split!r}; valid splits: {', '.join(self.splits)}"
            )
        if split in self._longer_splits():  # the first test split, longer
            return self.at_length(self._longer_splits()[split]), self.test_splits[0]
        return self, "train" if split == "val" and val_is_train else split

    def generate(self, num: int, seed: int, split: str) -> Dataset:
        """``num`` sequences of ``split``; deterministic in (configuration, split, seed).

        Each split draws from its own stream, seeded by (split_key(split), seed), ``val``
        included when this class supplies it (see the class docstring).
        """
        task, distribution = self._distribution(split)
        if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
            raise UserError(f"the number of sequences must be a positive integer, got {num!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UserError(f"the seed must be a non-negative integer, got {seed!r}")
        rng = np.random.default_rng(np.random.SeedSequence([split_key(split), int(seed)]))
        inputs, targets = task.sample(rng, int(num), distribution)
        inputs, targets = self._checked_sample(inputs, targets, int(num))
        return Dataset(inputs, targets, list(self.vocab))

    def _checked_sample(self, inputs, targets, num: int):
        """``sample``'s arrays as int64, or a UserError naming the task's class and what is
        wrong: the data of a plugin that breaks the contract never reaches a model."""
        inputs, targets = np.asarray(inputs), np.asarray(targets)
        problem = None
        if inputs.ndim != 2 or inputs.shape != targets.shape or len(inputs) != num:
            problem = (f"inputs of shape {inputs.shape} and targets of shape {targets.shape}, "
                       f"not two arrays of shape [{num}, length]")
        elif not (np.issubdtype(inputs.dtype, np.integer)
                  and np.issubdtype(targets.dtype, np.integer)):
            problem = f"arrays of {inputs.dtype} and {targets.dtype}, not integers"
        elif inputs.size and not (0 <= inputs.min() and inputs.max() < len(self.vocab)):
            problem = f"inputs outside the vocabulary's {len(self.vocab)} token ids"
        elif targets.size and not np.all((targets == IGNORE_INDEX)
                                         | ((0 <= targets) & (targets < len(self.vocab)))):
            problem = (f"targets other than {IGNORE_INDEX} (not scored) and the vocabulary's "
                       f"{len(self.vocab)} token ids")
        if problem:
            raise UserError(f"{_owner(type(self))}: sample() returned {problem}")
        return inputs.astype(np.int64, copy=False), targets.astype(np.int64, copy=False)

    def tally(self, predictions: np.ndarray, targets: np.ndarray, split: str
              ) -> dict[str, np.ndarray]:
        """Additive counts of argmax predictions [N, L] against targets [N, L]: what
        `metrics_from` reads. Tallies of two batches add key by key, so that any amount of
        evaluation data is scored a batch at a time in flat memory. The base counts, per
        position, the scored positions and the correct ones ([L] each); a subclass may add
        counts of its own (arrays or numbers that add)."""
        predictions, targets = np.asarray(predictions), np.asarray(targets)
        if predictions.shape != targets.shape:
            raise ValueError(f"predictions {predictions.shape} and targets {targets.shape} differ")
        scored = targets != IGNORE_INDEX
        correct = (predictions == targets) & scored
        return {"correct": correct.sum(axis=0), "scored": scored.sum(axis=0)}

    def metrics_from(self, tally: dict[str, np.ndarray], split: str) -> dict[str, Any]:
        """Scores from a tally summed over a split's evaluation data.

        Returns at least {"accuracy": float in [0, 1], "scored": the number of scored
        positions} (the count gives a rate its binomial interval); subclasses add
        task-specific entries, which must be small and JSON-serialisable (numbers, strings,
        short lists of numbers).
        """
        correct, scored = int(tally["correct"].sum()), int(tally["scored"].sum())
        return {"accuracy": correct / scored if scored else float("nan"), "scored": scored}

    def metrics(self, predictions: np.ndarray, targets: np.ndarray, split: str) -> dict[str, Any]:
        """Scores of argmax predictions [N, L] against targets [N, L] in one go."""
        return self.metrics_from(self.tally(predictions, targets, split), split)

    def baselines(self, dataset: Dataset, split: str) -> dict[str, Any]:
        """Simple rules that need no learning, by name, on ``dataset`` (evaluation data of
        ``split``), so that a model's accuracy can be read against them.

        Each value is the rule's accuracy where it is known exactly (``chance``: guessing
        uniformly among the possible answers), or the rule's predictions [N, L], which are
        scored exactly as a model's are, on the same data. The default is no baselines.
        """
        return {}

    def baseline_scores(self, dataset: Dataset, split: str) -> dict[str, float]:
        """The accuracy of every baseline on ``dataset``."""
        return {name: rule if np.isscalar(rule) else
                self.metrics(rule, dataset.targets, split)["accuracy"]
                for name, rule in self.baselines(dataset, split).items()}


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
    if isinstance(value, tuple):  # the rules hold for every item
        for item in value:
            _check_rules(key, item, rules)
    elif value is not None:
        _check_rules(key, value, rules)
    return value


def _check_rules(key: str, value: Any, rules: dict[str, Any]) -> None:
    choices, minimum, maximum = rules.get("choices"), rules.get("minimum"), rules.get("maximum")
    if choices is not None and value not in choices:
        raise UserError(
            f"invalid value {value!r} for {key!r}; valid values: {', '.join(map(str, choices))}"
        )
    if minimum is not None and value < minimum:
        raise UserError(f"invalid value {value!r} for {key!r}; it must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise UserError(f"invalid value {value!r} for {key!r}; it must be <= {maximum}")
