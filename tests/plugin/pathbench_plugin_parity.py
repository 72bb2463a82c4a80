"""A pathbench task defined outside pathbench: running parity, the word problem of Z2.

It declares its ``val`` split. A task that does not (written before pathbench had one) still
works: pathbench adds ``val`` after ``train`` and draws it as ``train`` on its own stream.
"""

from dataclasses import dataclass

import numpy as np

from pathbench.tasks import Task, option


@dataclass(frozen=True)
class ParityConfig:
    length: int = option(32, "bits per sequence", minimum=1)


class Parity(Task):
    """Running parity: after each bit, say whether the number of ones so far is even or odd.

    Vocabulary ``0``, ``1`` (inputs) and ``even``, ``odd`` (targets); every position is scored.
    Splits: ``train``, ``val`` (the same distribution, on its own random stream: pathbench's
    runs decide on it) and ``test``, which only reports. All three draw the same way, so
    ``sample`` need not look at the split's name. Baseline: ``chance`` (0.5).
    """

    name = "parity"
    version = "1"
    description = "running parity of a bit string (the word problem of Z2)"
    Config = ParityConfig
    length_setting = "length"  # so pathbench adds eval_lengths: tests on longer strings
    run_defaults = {
        "model": {"attention": "path", "layers": 1, "heads": 1, "d_model": 32},
        "train": {"steps": 2000, "batch_size": 64, "lr": 1e-3, "warmup": 100,
                  "eval_num": 1024, "early_stop": 0.99},
    }
    # `--preset cpu` (the default without a GPU): shorter strings, fewer steps.
    presets = {"cpu": {"task": {"length": 16}, "train": {"steps": 300, "eval_num": 256}}}

    def __init__(self, overrides=None):
        super().__init__(overrides)
        self.vocab = ["0", "1", "even", "odd"]
        self.splits = ("train", "val", "test")

    def sample(self, rng, num, split):
        bits = rng.integers(0, 2, size=(num, self.options.length))
        parity = np.cumsum(bits, axis=1) % 2
        return bits, parity + self.vocab.index("even")

    def baselines(self, dataset, split):
        return {"chance": 0.5}
