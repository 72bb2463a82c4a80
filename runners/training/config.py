"""Resolution of a run's configuration, and the parsing of the options that feed it.

`resolve_run` gives a `Run`: the task (built once, here), the model and training settings, the
seed, preset and device; it travels as it is from the command line or the sweep to training.
Its JSON form, ``Run.config`` (``config.json`` of its run directory), is::

    {"task":  {"name": ..., "version": ..., "config": {...}},
     "model": {...every ModelConfig field...},
     "train": {...every TrainConfig field...},
     "seed": 0, "preset": "paper" | "cpu", "device": "cpu" | "cuda"}

Later sources win, key by key:

    built-in defaults  <  the task's run_defaults  <  the preset  <  command-line options
                       and --set task.KEY=V / model.KEY=V / train.KEY=V

An option and a --set of the same setting (--model and --set model.attention=...) are an error:
one of them would be ignored.

Presets: "paper" is the task's own run_defaults (the paper's setting). "cpu" overlays the task's
``presets["cpu"]``, a smaller setting that trains in minutes on a few CPU cores; a task without
one trains its paper setting there too. Without --preset, the device decides: cuda ->
paper, cpu -> cpu. Everything is strict: an unknown key or a malformed value is a UserError.

The run id is a readable prefix plus a digest of everything that determines the result (task
name, version and config, model, train, seed), so a sweep can tell which runs already exist.
The device and the preset are not part of it: the preset's effect is already in the config.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Iterable

from pathbench import UserError
from pathbench.runners.training.store import canonical_json, config_digest
from pathbench.settings import coerce
from pathbench.tasks import PRESETS

if TYPE_CHECKING:
    from pathbench.models import ModelConfig
    from pathbench.tasks import Task

SECTIONS = ("task", "model", "train")
MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed takes
DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("cosine", "constant", "wsd")  # the learning rate after the warm-up
# Every decision (early stopping, the learning rate a table picks, whether a model solved a task
# for --until-solved) is made on this split; the test splits only report. Records say so.
DECISION_SPLIT = "val"
DECISIONS = {"early_stop": DECISION_SPLIT, "learning_rate": DECISION_SPLIT,
             "until_solved": DECISION_SPLIT, "max_seeds": DECISION_SPLIT,
             "max_steps": DECISION_SPLIT}


@dataclass
class TrainConfig:
    """How a model is trained and evaluated. Tasks override these in run_defaults["train"]."""

    steps: int = 2000  # optimizer steps; early stopping may end the run sooner
    batch_size: int = 32  # sequences per step, freshly generated every step
    lr: float = 1e-3  # peak learning rate of AdamW
    warmup: int = 100  # linear warm-up steps (at most a tenth of `steps`)
    # after the warm-up: "cosine" decay to 0, "constant", or "wsd": constant, then a linear
    # decay to 0 over the last `decay` of the steps, so that a longer budget leaves the steps
    # before its decay as they were
    schedule: str = "cosine"
    decay: float = 0.2  # the fraction of the steps in wsd's final decay
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    grad_clip: float = 1.0  # maximum global gradient norm
    eval_every: int = 200  # steps between validation checks (early stopping, curve points)
    eval_num: int = 1024  # sequences of val and of each test split, unless eval_sizes names it
    eval_sizes: dict[str, int] = field(default_factory=dict)  # split -> sequences evaluated
    early_stop: float | None = 1.0  # stop when validation primary metric >= this; None: never
    # stop after this many validation checks in a row without a new best; None: never
    patience: int | None = None


def _check_train(config: TrainConfig) -> None:
    c = config
    checks = [
        ("steps", c.steps >= 1, ">= 1"),
        ("batch_size", c.batch_size >= 1, ">= 1"),
        ("lr", c.lr > 0 and math.isfinite(c.lr), "a positive number"),
        ("warmup", c.warmup >= 0, ">= 0"),
        ("schedule", c.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
        ("weight_decay", c.weight_decay >= 0, ">= 0"),
        ("grad_clip", c.grad_clip > 0, "> 0"),
        ("eval_every", c.eval_every >= 1, ">= 1"),
        ("eval_num", c.eval_num >= 1, ">= 1"),
        ("eval_sizes", all(size >= 1 for size in c.eval_sizes.values()), "sizes >= 1"),
        ("early_stop", c.early_stop is None or 0 < c.early_stop <= 1, "in (0, 1] or none"),
        ("decay", 0 < c.decay <= 1, "in (0, 1]"),
        ("patience", c.patience is None or c.patience >= 1, ">= 1 or none"),
    ]
    for key, ok, rule in checks:
        if not ok:
            raise UserError(f"train.{key} must be {rule}, got {getattr(config, key)!r}")


def train_config(values: dict) -> TrainConfig:
    """A TrainConfig from a dict of (possibly string) values; strict about keys and types."""
    hints = typing.get_type_hints(TrainConfig)
    typed = {}
    for key, value in values.items():
        if key not in hints:
            raise UserError(
                f"unknown train setting {key!r}; valid settings: {', '.join(hints)}"
            )
        typed[key] = coerce(f"train.{key}", value, hints[key])
    config = TrainConfig(**typed)
    _check_train(config)
    return config


@dataclass(frozen=True, eq=False)
class Run:
    """One run, resolved: its task (built), model and training settings, seed, preset (which
    setting size the values came from) and device. ``config`` is its JSON form, ``run_id`` its
    name."""

    task: Task
    model: ModelConfig
    train: TrainConfig
    seed: int
    preset: str
    device: str

    @cached_property
    def config(self) -> dict:
        return {
            "task": {"name": self.task.name, "version": self.task.version,
                     "config": dict(self.task.config)},
            "model": dataclasses.asdict(self.model),
            "train": dataclasses.asdict(self.train),
            "seed": self.seed,
            "preset": self.preset,
            "device": self.device,
        }

    @cached_property
    def run_id(self) -> str:
        return run_id(self.config)

    def cell_key(self, *, with_layers: bool = True) -> str:
        return cell_key(self.config, with_layers=with_layers)


# --- option parsing -------------------------------------------------------------------------


def parse_sets(items: Iterable[str], option: str = "--set") -> dict[str, dict[str, str]]:
    """``["task.length=64", "train.lr=1e-3"]`` -> ``{"task": {"length": "64"}, ...}``; a key
    given twice is an error (one value would be ignored). ``option`` names the option in
    errors."""
    sets: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or section not in SECTIONS or not name or not value.strip():
            raise UserError(
                f"{option} expects task.KEY=VALUE, model.KEY=VALUE or train.KEY=VALUE, got "
                f"{item!r}")
        if name in sets[section]:
            raise UserError(f"{option} {section}.{name} is given twice ({sets[section][name]} "
                            f"and {value.strip()}); give it once")
        sets[section][name] = value.strip()
    return sets


# The most values an integer list may hold: far above any sweep's, so that a typo such as
# 0-10000000 is an error at once rather than minutes of planning.
MAX_LIST_VALUES = 100_000


def parse_int_list(text: str, option: str) -> list[int]:
    """``"1-6"``, ``"1,2,4"`` or ``"1-3,6"`` -> a sorted list of distinct integers (at most
    MAX_LIST_VALUES)."""
    values: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            if dash:
                first, last = int(low), int(high)
                if first > last:
                    raise ValueError
                if last - first + 1 + len(values) > MAX_LIST_VALUES:
                    raise UserError(f"{option} {text} holds more than {MAX_LIST_VALUES:,} "
                                    f"values")
                values.update(range(first, last + 1))
            else:
                values.add(int(part))
        except ValueError:
            raise UserError(
                f"{option} expects integers and ranges like 1-6 or 0,2,4, got {text!r}"
            ) from None
    return sorted(values)


def parse_float_list(text: str, option: str) -> list[float]:
    try:
        values = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise UserError(f"{option} expects numbers like 1e-3,3e-4, got {text!r}") from None
    if not all(value > 0 and math.isfinite(value) for value in values):
        raise UserError(f"{option} expects positive numbers, got {text!r}")
    return values


# --- resolution -----------------------------------------------------------------------------

def resolve_device(device: str) -> str:
    """auto -> cuda when a GPU is visible, else cpu; cuda without a GPU is a UserError."""
    import torch

    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}; valid choices: {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was given but no CUDA GPU is available; use --device cpu")
    return device


# The command-line options that are shorthands for a setting.
OPTION_SETTINGS = {"model": ("model", "attention"), "layers": ("model", "layers"),
                   "heads": ("model", "heads"), "d_model": ("model", "d_model"),
                   "steps": ("train", "steps"), "batch_size": ("train", "batch_size"),
                   "lr": ("train", "lr")}


def resolve_run(
    task_name: str,
    *,
    options: dict | None = None,
    sets: dict[str, dict] | None = None,
    seed: int = 0,
    device: str = "cpu",
    preset: str | None = None,
) -> Run:
    """One run, resolved (see the module docstring).

    ``options`` holds the command-line options that were given (model, layers, heads, d_model,
    steps, batch_size, lr); ``device`` must already be resolved ("cpu" or "cuda").
    """
    from pathbench.models import ATTENTIONS, model_config
    from pathbench.tasks import TASKS, make_task

    options = {key: value for key, value in (options or {}).items() if value is not None}
    sets = sets or {section: {} for section in SECTIONS}
    for option, (section, key) in OPTION_SETTINGS.items():
        if option in options and key in sets.get(section, {}):
            flag = "--" + option.replace("_", "-")
            raise UserError(f"{flag} {options[option]} and --set {section}.{key}="
                            f"{sets[section][key]} both set {section}.{key}; give one")
    if preset is None:
        preset = "paper" if device == "cuda" else "cpu"
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; valid choices: {', '.join(PRESETS)}")
    task_class = TASKS.get(task_name)
    overlay = task_class.presets.get(preset, {}) if preset != "paper" else {}
    task = make_task(task_name, {**overlay.get("task", {}), **sets.get("task", {})})
    run_defaults = task.run_defaults

    model_options = {
        "attention": options.get("model"),
        "layers": options.get("layers"),
        "heads": options.get("heads"),
        "d_model": options.get("d_model"),
    }
    model_values = {
        **run_defaults.get("model", {}),
        **overlay.get("model", {}),
        **{key: value for key, value in model_options.items() if value is not None},
        **sets.get("model", {}),
    }
    if "vocab_size" in model_values:
        raise UserError("model.vocab_size is set by the task's vocabulary and cannot be changed")
    model = model_config({**model_values, "vocab_size": len(task.vocab)})
    ATTENTIONS.get(model.attention).check_device(model, device)
    if model.backend == "triton" and device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise UserError("model.backend 'triton' needs --device cuda (or TRITON_INTERPRET=1 for "
                        "Triton's CPU interpreter); valid choices on the CPU: auto, torch")

    train_options = {key: options.get(key) for key in ("steps", "batch_size", "lr")}
    train = train_config(
        {
            **run_defaults.get("train", {}),
            **overlay.get("train", {}),
            **{key: value for key, value in train_options.items() if value is not None},
            **sets.get("train", {}),
        }
    )
    unknown = sorted(set(train.eval_sizes) - set(task.splits[1:]))
    if unknown:
        raise UserError(f"train.eval_sizes names split {unknown[0]!r}, which task {task.name!r} "
                        f"does not evaluate; valid splits: {', '.join(task.splits[1:])}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"seed must be an integer from 0 to 2^64 - 1 (what torch's random "
                        f"streams take), got {seed!r}")
    return Run(task, model, train, seed, preset, device)


def cell_key(config: dict, *, with_layers: bool = True) -> str:
    """The identity of a run's cell, from its JSON form (`Run.config`, or a record's "config"):
    its whole config except the seed and learning rate (and, for ``sweep --until-solved``, the
    layer count). Runs of one cell differ only in what a pack lets its members differ in
    (``pathbench.models.pack``)."""
    model = dict(config["model"])
    train = {key: value for key, value in config["train"].items() if key != "lr"}
    if not with_layers:
        model.pop("layers")
    return canonical_json({"task": config["task"], "model": model, "train": train})


def run_id(config: dict) -> str:
    """``flipflop-path-L1-H2-D64-lr0.001-s0-3f2a9c41d0``, from a run's JSON form: readable, and
    unique per config."""
    identity = {key: config[key] for key in ("task", "model", "train", "seed")}
    model, train = config["model"], config["train"]
    return (
        f"{config['task']['name']}-{model['attention']}-L{model['layers']}-H{model['heads']}"
        f"-D{model['d_model']}-lr{train['lr']:g}-s{config['seed']}-{config_digest(identity)[:10]}"
    )
