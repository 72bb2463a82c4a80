"""What every task promises: its attributes, dataset format, determinism, and strict config."""

import pickle
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from pathbench import UserError
from pathbench.tasks import TASKS, Task, make_task, option
from pathbench.tasks.base import resolve_config

BUILT_INS = ["flipflop", "a5", "s5", "a4xz5", "z60", "mqrar"]
WORD_PROBLEMS = ["a5", "s5", "a4xz5", "z60"]
SMALL = {"flipflop": {"length": 32}, "mqrar": {"length": 64, "num_keys": 4}}
TRAIN_KEYS = {"steps", "batch_size", "lr", "warmup", "eval_num", "early_stop"}


def small_task(name):
    return make_task(name, SMALL.get(name, {"length": 8}))


def test_built_ins_are_registered_as_built_in():
    for name in BUILT_INS:
        assert TASKS.origin(name) == "built-in"


@pytest.mark.parametrize("name", BUILT_INS)
def test_task_attributes(name):
    task = make_task(name)
    assert isinstance(task, Task) and task.name == name
    assert task.version and isinstance(task.version, str)
    assert task.description and "\n" not in task.description
    assert task.splits[:3] == ("train", "val", "test")
    assert task.test_splits == task.splits[2:]
    assert task.primary_metric == "accuracy"
    assert task.solved_threshold == (0.9 if name in WORD_PROBLEMS else None)
    assert set(task.run_defaults) == {"model", "train"}
    assert TRAIN_KEYS <= set(task.run_defaults["train"]) <= TRAIN_KEYS | {"eval_sizes"}
    assert {"attention", "layers", "heads", "d_model"} <= set(task.run_defaults["model"])
    assert len(set(task.vocab)) == len(task.vocab)


def test_run_defaults_match_the_paper_where_it_has_a_setting():
    assert make_task("flipflop").run_defaults["model"] == {
        "attention": "path", "layers": 1, "heads": 2, "d_model": 64}
    assert make_task("mqrar").run_defaults["model"] == {
        "attention": "path", "layers": 2, "heads": 2, "d_model": 256}
    task = make_task("flipflop")
    task.run_defaults["model"]["layers"] = 5  # an instance's copy, not the class's
    assert make_task("flipflop").run_defaults["model"]["layers"] == 1


@pytest.mark.parametrize("name", BUILT_INS)
def test_datasets_are_int64_in_the_vocabulary(name):
    task = small_task(name)
    for split in task.splits:
        dataset = task.generate(16, seed=0, split=split)
        assert dataset.inputs.dtype == dataset.targets.dtype == np.int64
        assert dataset.inputs.shape == dataset.targets.shape and len(dataset) == 16
        assert dataset.vocab == task.vocab
        assert 0 <= dataset.inputs.min() and dataset.inputs.max() < len(task.vocab)
        scored = dataset.targets[dataset.targets != -100]
        assert scored.size and 0 <= scored.min() and scored.max() < len(task.vocab)


@pytest.mark.parametrize("name", BUILT_INS)
def test_generation_is_deterministic_per_split_and_seed(name):
    task = small_task(name)
    first = task.generate(32, seed=7, split="train")
    again = small_task(name).generate(32, seed=7, split="train")
    assert np.array_equal(first.inputs, again.inputs)
    assert np.array_equal(first.targets, again.targets)
    other_seed = task.generate(32, seed=8, split="train")
    other_split = task.generate(32, seed=7, split="test")
    assert not np.array_equal(first.inputs, other_seed.inputs)
    assert not np.array_equal(first.inputs, other_split.inputs)


def test_every_registered_task_has_val_right_after_train():
    for name in TASKS.names():
        try:
            task_class = TASKS.get(name)
        except UserError:
            continue  # a plugin of this environment that fails to load
        task = task_class()
        assert task.splits[:2] == ("train", "val"), name


@pytest.mark.parametrize("name", BUILT_INS)
def test_val_has_its_own_stream_and_is_deterministic(name):
    task = small_task(name)
    val = task.generate(32, seed=7, split="val")
    again = small_task(name).generate(32, seed=7, split="val")
    assert np.array_equal(val.inputs, again.inputs)
    assert np.array_equal(val.targets, again.targets)
    for split in ["train", "test"]:
        assert not np.array_equal(val.inputs, task.generate(32, seed=7, split=split).inputs)
    assert not np.array_equal(val.inputs, task.generate(32, seed=8, split="val").inputs)


@pytest.mark.parametrize("name", BUILT_INS)
def test_val_follows_the_training_distribution(name):
    # Same shape, and the same token frequencies as train within sampling noise.
    task = small_task(name)
    train = task.generate(4000, seed=0, split="train")
    val = task.generate(4000, seed=0, split="val")
    assert val.inputs.shape == train.inputs.shape
    assert abs((val.targets != -100).mean() - (train.targets != -100).mean()) < 0.01
    size = len(task.vocab)
    frequencies = [np.bincount(d.inputs.ravel(), minlength=size) / d.inputs.size
                   for d in (train, val)]
    assert np.abs(frequencies[0] - frequencies[1]).max() < 0.01


@dataclass(frozen=True)
class CountConfig:
    length: int = option(6, "tokens per sequence", minimum=1)


class LegacyCount(Task):
    """A task as written before the val split: it declares train and test only, and its test
    split is drawn differently (tokens 2-3 instead of 0-1)."""

    name = "legacy_count"
    version = "1"
    description = "a test task"
    Config = CountConfig
    run_defaults = {"model": {}, "train": {}}

    def __init__(self, overrides=None, splits=("train", "test")):
        super().__init__(overrides)
        self.vocab = ["0", "1", "2", "3"]
        self.splits = splits
        self.asked = []

    def sample(self, rng, num, split):
        self.asked.append(split)
        tokens = rng.integers(0, 2, size=(num, self.options.length)) + (split == "test") * 2
        return tokens, tokens


class MeasuredCount(LegacyCount):
    """LegacyCount that names its length setting: the base class gives it longer test splits."""

    name = "measured_count"
    Config = CountConfig
    length_setting = "length"


def test_a_task_that_names_its_length_gets_longer_test_splits_from_the_base_class():
    task = MeasuredCount({"eval_lengths": "9,12"})
    assert task.config == {"length": 6, "eval_lengths": (9, 12)} and task.length == 6
    assert task.splits == ("train", "val", "test", "test_9", "test_12")
    longer = task.generate(5, seed=1, split="test_12")
    # the first test split at length 12, on a stream of its own; sample never saw "test_12"
    assert longer.inputs.shape == (5, 12) and longer.inputs.min() >= 2
    assert "test_12" not in task.asked and task.asked[-1] == "test"
    assert not np.array_equal(longer.inputs[:, :6], task.generate(5, seed=1, split="test").inputs)
    with pytest.raises(UserError, match="'eval_lengths'; each must be greater than length"):
        MeasuredCount({"eval_lengths": "6"})
    assert "eval_lengths" not in LegacyCount().config  # a task without a length setting


@pytest.mark.parametrize("name", BUILT_INS)
def test_a_tasks_resolved_config_pickles_as_sweep_workers_receive_it(name):
    # A sweep sends each worker its runs, configs included, through a pipe. The config class
    # that adds eval_lengths is made at run time; Python 3.12 gave it the wrong module.
    options = small_task(name).options
    config_class = type(options)  # found where its names say, as pickle looks it up
    found = sys.modules[config_class.__module__]
    for part in config_class.__qualname__.split("."):
        found = getattr(found, part)
    assert found is config_class
    assert pickle.loads(pickle.dumps(options)) == options


def test_a_length_setting_must_be_a_field_and_eval_lengths_is_the_base_classes():
    with pytest.raises(UserError, match="length_setting 'size' is not a field"):
        type("Sized", (LegacyCount,), {"name": "sized", "Config": CountConfig,
                                       "length_setting": "size"})

    @dataclass(frozen=True)
    class OwnEvalLengths:
        length: int = option(6, "tokens")
        eval_lengths: tuple[int, ...] = option((), "its own")

    with pytest.raises(UserError, match="declares 'eval_lengths'"):
        type("Own", (LegacyCount,), {"name": "own", "Config": OwnEvalLengths,
                                     "length_setting": "length"})


def test_a_task_without_val_gets_val_as_train_on_its_own_stream():
    task = LegacyCount()
    assert task.splits == ("train", "val", "test") and task.test_splits == ("test",)
    val = task.generate(50, seed=3, split="val")
    assert task.asked == ["train"]  # sample never sees the name "val"
    assert val.inputs.max() <= 1  # the train distribution, not test's
    train = task.generate(50, seed=3, split="train")
    assert not np.array_equal(val.inputs, train.inputs)  # its own stream
    assert np.array_equal(val.inputs, LegacyCount().generate(50, seed=3, split="val").inputs)


def test_splits_may_be_a_class_attribute():
    class Declared(LegacyCount):
        splits = ("train", "test", "test_long")

        def __init__(self, overrides=None):
            Task.__init__(self, overrides)
            self.vocab = ["0", "1", "2", "3"]
            self.asked = []

    task = Declared()
    assert task.splits == ("train", "val", "test", "test_long")
    task.generate(2, seed=0, split="val")
    assert task.asked == ["train"]


@pytest.mark.parametrize(
    "splits, words",
    [
        (("test", "train"), ["start with 'train'"]),
        (("train", "test", "val"), ["'val' must be the second split"]),
        (("train", "val", "val", "test"), ["twice"]),
        (("train",), ["at least one test split"]),
        (("train", "val"), ["at least one test split"]),
        ("train", ["tuple of split names"]),
    ],
)
def test_malformed_splits_name_the_task_class(splits, words):
    with pytest.raises(UserError) as error:
        LegacyCount(splits=splits)
    message = str(error.value)
    assert "\n" not in message and "test_tasks_interface.LegacyCount" in message
    assert all(word in message for word in words), message


def test_tasks_have_no_baselines_unless_they_define_them():
    task = LegacyCount()
    assert task.baseline_scores(task.generate(4, seed=0, split="test"), "test") == {}


@pytest.mark.parametrize(
    "name, overrides, inputs",
    [
        ("flipflop", {"length": 8}, [0, 4, 2, 4, 2, 3, 1, 4]),
        ("a5", {"length": 6}, [25, 13, 27, 9, 12, 9]),
        ("mqrar", {"length": 16, "num_keys": 2, "num_values": 3},
         [0, 2, 0, 3, 0, 3, 5, 0, 5, 0, 5, 0, 0, 3, 1, 2]),
    ],
)
def test_drift_known_arrays_of_a_fixed_seed_do_not_change_silently(name, overrides, inputs):
    # A failure means the data for a fixed seed changed (a code change or a numpy release
    # that changed its random streams): bump the task's version, then update these numbers.
    dataset = make_task(name, overrides).generate(1, seed=0, split="train")
    assert dataset.inputs[0].tolist() == inputs


@pytest.mark.parametrize("name", BUILT_INS)
def test_unknown_config_key_names_the_valid_keys(name):
    with pytest.raises(UserError) as error:
        make_task(name, {"lenght": 10})
    assert "'lenght'" in str(error.value) and "length" in str(error.value)


@pytest.mark.parametrize(
    "name, overrides, words",
    [
        ("flipflop", {"length": "abc"}, ["'length'", "int"]),
        ("flipflop", {"length": 2}, ["'length'", ">= 4"]),
        ("flipflop", {"length": 33}, ["'length'", "even"]),
        ("flipflop", {"length": 1.5}, ["'length'", "int"]),
        ("a5", {"eval_lengths": [10]}, ["'eval_lengths'", "greater than length"]),
        ("a5", {"eval_lengths": "40,40"}, ["'eval_lengths'", "twice"]),
        ("a5", {"eval_lengths": "40,x"}, ["'eval_lengths'[1]", "int"]),
        ("mqrar", {"eval_lengths": [1 << 21]}, ["'eval_lengths'", "<= 1048576"]),
        ("flipflop", {"eval_lengths": [1025]}, ["'eval_lengths'", "even"]),
        ("a5", {"length": 0}, ["'length'", ">= 1"]),
        ("mqrar", {"n_back": 0}, ["'n_back'", ">= 1"]),
        ("mqrar", {"query_prob": "1"}, ["'query_prob'", "between 0 and 1"]),
        ("mqrar", {"query_prob": "nan"}, ["'query_prob'", "float"]),
        ("mqrar", {"n_back": 4, "length": 9}, ["'length'", ">= 10"]),
    ],
)
def test_bad_values_are_named(name, overrides, words):
    with pytest.raises(UserError) as error:
        make_task(name, overrides)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_strings_from_the_command_line_are_converted():
    task = make_task("mqrar", {"length": "100", "query_prob": "0.25", "eval_lengths": "200,400"})
    assert task.config["length"] == 100 and task.config["query_prob"] == 0.25
    assert task.config["eval_lengths"] == (200, 400)
    assert make_task("a5", {"eval_lengths": ""}).config["eval_lengths"] == ()


def test_unknown_task_and_unknown_split_name_the_choices():
    with pytest.raises(UserError, match="valid choices: .*flipflop"):
        make_task("flip-flop")
    with pytest.raises(UserError, match="valid splits: train, val, test, sparse, dense"):
        make_task("flipflop").generate(1, seed=0, split="validation")
    with pytest.raises(UserError, match="seed"):
        make_task("flipflop").generate(1, seed=-1, split="train")


@dataclass(frozen=True)
class ExampleConfig:
    mode: str = option("fast", "how to run", choices=("fast", "exact"))
    verbose: bool = option(False, "print more")
    limit: int | None = option(None, "an optional bound", minimum=0, maximum=10)


def test_choices_booleans_and_optional_values():
    config = resolve_config(ExampleConfig, {"mode": "exact", "verbose": "yes", "limit": "3"}, "x")
    assert (config.mode, config.verbose, config.limit) == ("exact", True, 3)
    with pytest.raises(UserError, match="'mode'; valid values: fast, exact"):
        resolve_config(ExampleConfig, {"mode": "slow"}, "x")
    with pytest.raises(UserError, match="x: 'verbose' expects bool, got 'maybe'"):
        resolve_config(ExampleConfig, {"verbose": "maybe"}, "x")
    with pytest.raises(UserError, match="'limit'; it must be <= 10"):
        resolve_config(ExampleConfig, {"limit": 11}, "x")
    assert resolve_config(ExampleConfig, {"limit": "None"}, "x").limit is None


class Broken(LegacyCount):
    """A task whose sample breaks the contract in the way ``returned`` says."""

    def __init__(self, returned):
        super().__init__(splits=("train", "val", "test"))
        self.returned = returned

    def sample(self, rng, num, split):
        tokens = np.zeros((num, 6), dtype=np.int64)
        return {"short": (tokens[:-1], tokens[:-1]), "ragged": (tokens, tokens[:, :3]),
                "floats": (tokens.astype(float), tokens), "out of vocab": (tokens + 9, tokens),
                "bad target": (tokens, tokens - 5)}[self.returned]


@pytest.mark.parametrize("returned, words", [
    ("short", "not two arrays of shape [4, length]"),
    ("ragged", "targets of shape (4, 3)"),
    ("floats", "not integers"),
    ("out of vocab", "inputs outside the vocabulary's 4 token ids"),
    ("bad target", "targets other than -100 (not scored) and the vocabulary's 4 token ids"),
])
def test_a_sample_that_breaks_the_contract_is_a_one_line_error_naming_the_class(returned, words):
    with pytest.raises(UserError, match="legacy_count.*test_tasks_interface.Broken.*sample") as caught:
        Broken(returned).generate(4, seed=0, split="train")
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_run_defaults_and_presets_are_checked_when_the_class_is_defined():
    class NoDefaults(LegacyCount):  # no run_defaults of its own: pathbench's defaults
        run_defaults = {}

    assert NoDefaults().run_defaults == {}
    with pytest.raises(UserError, match="run_defaults must be a dict of settings by section"):
        type("BadDefaults", (LegacyCount,), {"run_defaults": {"optimizer": {}}})
    with pytest.raises(UserError, match="presets must be a dict with keys among cpu"):
        type("BadPreset", (LegacyCount,), {"presets": {"laptop": {}}})
    with pytest.raises(UserError, match=r"presets\['cpu'\] must be a dict of settings"):
        type("BadPresetSections", (LegacyCount,), {"presets": {"cpu": {"data": {}}}})
