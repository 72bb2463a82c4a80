"""Flip-flop language modelling (Liu et al., 2023, "Exposing Attention Glitches with Flip-Flop
Language Modeling")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathbench import UserError
from pathbench.tasks.base import (
    IGNORE_INDEX,
    MAX_LENGTH,
    TASKS,
    Task,
    option,
)

WRITE, READ, IGNORE, ZERO, ONE = range(5)  # token ids, in the order of VOCAB
VOCAB = ["w", "r", "i", "0", "1"]

# Probability of the ignore instruction in each split: FFL(0.8) for train, val and test, and
# the sparse (0.98) and dense (0.1) evaluation sets of the public release of the task.
P_IGNORE = {"train": 0.8, "val": 0.8, "test": 0.8, "sparse": 0.98, "dense": 0.1}


@dataclass(frozen=True)
class FlipFlopConfig:
    length: int = option(512, "tokens per sequence (instruction, bit pairs, so even)", minimum=4,
                         maximum=MAX_LENGTH)

    def __post_init__(self):
        if self.length % 2:
            raise UserError(f"invalid value {self.length} for 'length'; it must be even")


@TASKS.register("flipflop")
class FlipFlop(Task):
    """Flip-flop language modelling: after each read, output the bit of the most recent write.

    A sequence is ``length / 2`` pairs (instruction, bit). The first instruction is ``w``, the
    last is ``r``, the others are ``i`` with probability p_ignore (per split, see ``P_IGNORE``)
    and ``w`` or ``r`` with (1 - p_ignore) / 2 each. The bit after ``w`` or ``i`` is uniform;
    the bit after ``r`` repeats the most recent ``w``'s bit. Scored: each ``r`` position, whose
    target is the bit that follows it. Metrics: accuracy and error (percent) on those positions.
    Splits: ``train``, ``val`` and ``test`` at p_ignore 0.8, ``sparse`` at 0.98, ``dense`` at
    0.1, all ``length`` tokens; each N of ``eval_lengths`` adds a test split ``test_N`` at
    p_ignore 0.8 of N tokens (length generalisation). Baseline: ``chance`` (0.5, a guessed
    bit).
    """

    name = "flipflop"
    version = "1"
    description = "flip-flop language modelling (Liu et al. 2023): recall the last written bit"
    Config = FlipFlopConfig
    length_setting = "length"
    # The model is PaTH's (Yang et al. 2025, Table 1): one layer, two heads, width 64. The
    # training settings are our choice for a model this small, not taken from the paper.
    run_defaults = {
        "model": {"attention": "path", "layers": 1, "heads": 2, "d_model": 64},
        "train": {
            "steps": 10_000,
            "batch_size": 64,
            "lr": 1e-3,
            "warmup": 500,
            "eval_num": 4096,
            # At 512 tokens a sparse sequence holds about 3.5 reads: 290,000 sequences score
            # about 10^6, so that one error is 0.0001%, the resolution of the paper's Table 1.
            "eval_sizes": {"sparse": 290_000},
            "early_stop": None,  # the rare sparse-split errors are the point; train to the end
        },
    }
    # 128 tokens: the paper's 512 are slow for the torch PaTH attention on a CPU, and 128 still
    # separate PaTH from RoPE (docs/usage.md gives the numbers).
    presets = {"cpu": {
        "task": {"length": 128},
        "train": {"steps": 600, "batch_size": 32, "eval_every": 100, "eval_num": 2048,
                  "eval_sizes": {"sparse": 8192}},  # about 13,000 sparse reads at 128 tokens
    }}

    def __init__(self, overrides=None):
        super().__init__(overrides)
        self.vocab = list(VOCAB)
        self.splits = tuple(P_IGNORE)

    def sample(self, rng, num, split):
        pairs = self.options.length // 2
        p_ignore = P_IGNORE[split]
        # Narrow dtypes until the final int64 arrays: at 100,000 x 512 memory traffic dominates.
        draw = rng.random((num, pairs), dtype=np.float32)
        write_or_read = np.where(draw < (1 + p_ignore) / 2, np.uint8(WRITE), np.uint8(READ))
        instructions = np.where(draw < p_ignore, np.uint8(IGNORE), write_or_read)
        instructions[:, 0] = WRITE
        instructions[:, -1] = READ
        bits = rng.integers(ZERO, ONE + 1, size=(num, pairs), dtype=np.uint8)

        # Index of the most recent write at or before each pair (the first pair is a write).
        pair_index = np.arange(pairs, dtype=np.int32)
        last_write = np.maximum.accumulate(
            np.where(instructions == WRITE, pair_index, np.int32(0)), axis=1
        )
        is_read = instructions == READ
        bits = np.where(is_read, np.take_along_axis(bits, last_write, axis=1), bits)

        inputs = np.empty((num, 2 * pairs), dtype=np.int64)
        inputs[:, 0::2] = instructions
        inputs[:, 1::2] = bits
        targets = np.empty((num, 2 * pairs), dtype=np.int64)
        targets[:, 0::2] = np.where(is_read, bits.astype(np.int8), np.int8(IGNORE_INDEX))
        targets[:, 1::2] = IGNORE_INDEX
        return inputs, targets

    def sample_tensors(self, generator, num, split):
        import torch

        device, pairs = generator.device, self.options.length // 2
        p_ignore = P_IGNORE[split]
        draw = torch.rand((num, pairs), generator=generator, device=device)
        instructions = torch.where(draw < p_ignore, IGNORE,
                                   torch.where(draw < (1 + p_ignore) / 2, WRITE, READ))
        instructions[:, 0] = WRITE
        instructions[:, -1] = READ
        bits = torch.randint(ZERO, ONE + 1, (num, pairs), generator=generator, device=device)
        pair_index = torch.arange(pairs, device=device).expand(num, pairs)
        last_write = torch.where(instructions == WRITE, pair_index, 0).cummax(dim=1).values
        is_read = instructions == READ
        bits = torch.where(is_read, bits.gather(1, last_write), bits)
        inputs = torch.stack([instructions, bits], dim=2).view(num, 2 * pairs)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, 0::2] = torch.where(is_read, bits, IGNORE_INDEX)
        return inputs, targets

    def metrics_from(self, tally, split):
        metrics = super().metrics_from(tally, split)
        metrics["error"] = 100.0 * (1.0 - metrics["accuracy"])
        return metrics

    def baselines(self, dataset, split):
        return {"chance": 0.5}
