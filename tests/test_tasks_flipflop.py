"""flipflop: targets re-derived from the token strings, and the instruction statistics per split."""

import math

import numpy as np
import pytest

from pathbench.tasks import make_task

P_IGNORE = {"train": 0.8, "val": 0.8, "test": 0.8, "sparse": 0.98, "dense": 0.1}


def decode(dataset, row):
    return [dataset.vocab[token] for token in dataset.inputs[row]]


def test_vocabulary_and_splits_are_the_documented_ones():
    task = make_task("flipflop")
    assert task.vocab == ["w", "r", "i", "0", "1"]
    assert task.splits == ("train", "val", "test", "sparse", "dense")
    assert task.test_splits == ("test", "sparse", "dense")
    assert task.config == {"length": 512, "eval_lengths": ()}


def test_longer_test_splits_are_test_distributed_at_their_length():
    task = make_task("flipflop", {"length": 64, "eval_lengths": "128,512"})
    assert task.test_splits == ("test", "sparse", "dense", "test_128", "test_512")
    for split, length in [("test", 64), ("test_128", 128), ("test_512", 512)]:
        dataset = task.generate(3000, seed=1, split=split)
        assert dataset.inputs.shape == (3000, length)
        instructions = np.array(dataset.vocab)[dataset.inputs[:, 2:-2:2]]
        p, draws = P_IGNORE["test"], instructions.size
        assert abs((instructions == "i").mean() - p) < 6 * math.sqrt(p * (1 - p) / draws)
    short, long = (task.generate(5, seed=1, split=split).inputs for split in ("test", "test_128"))
    assert not np.array_equal(short, long[:, :64])  # a stream of its own


@pytest.mark.parametrize("split", list(P_IGNORE))
@pytest.mark.parametrize("length", [4, 64, 512])
def test_targets_follow_from_the_tokens(split, length):
    dataset = make_task("flipflop", {"length": length}).generate(100, seed=3, split=split)
    assert dataset.inputs.shape == dataset.targets.shape == (100, length)
    for row in range(100):
        tokens = decode(dataset, row)
        instructions, bits = tokens[0::2], tokens[1::2]
        assert instructions[0] == "w" and instructions[-1] == "r"
        assert set(instructions) <= {"w", "r", "i"} and set(bits) <= {"0", "1"}
        expected = []
        last_written = None
        for instruction, bit in zip(instructions, bits):
            if instruction == "w":
                last_written = bit
            if instruction == "r":
                assert bit == last_written
                expected += [bit, None]
            else:
                expected += [None, None]
        scored = [None if t == -100 else dataset.vocab[t] for t in dataset.targets[row]]
        assert scored == expected


@pytest.mark.parametrize("split", list(P_IGNORE))
def test_instruction_frequencies_match_the_split(split):
    dataset = make_task("flipflop").generate(2000, seed=0, split=split)
    vocab = np.array(dataset.vocab)
    instructions = vocab[dataset.inputs[:, 2:-2:2]]  # all but the fixed first and last
    draws = instructions.size
    p = P_IGNORE[split]
    ignore = (instructions == "i").mean()
    # Six standard deviations: a failure by chance is out of the question.
    assert abs(ignore - p) < 6 * math.sqrt(p * (1 - p) / draws)
    writes = (instructions == "w").sum()
    not_ignored = draws - (instructions == "i").sum()
    assert abs(writes / not_ignored - 0.5) < 6 * math.sqrt(0.25 / not_ignored)


def test_written_bits_are_uniform():
    dataset = make_task("flipflop").generate(500, seed=1, split="train")
    vocab = np.array(dataset.vocab)
    instructions, bits = vocab[dataset.inputs[:, 0::2]], vocab[dataset.inputs[:, 1::2]]
    written = bits[instructions == "w"]
    assert abs((written == "1").mean() - 0.5) < 6 * math.sqrt(0.25 / written.size)


def test_error_is_the_percentage_of_wrong_reads():
    task = make_task("flipflop", {"length": 16})
    dataset = task.generate(10, seed=0, split="test")
    predictions = dataset.targets.copy()
    scored = np.argwhere(dataset.targets != -100)
    row, column = scored[0]
    zero, one = task.vocab.index("0"), task.vocab.index("1")
    predictions[row, column] = {zero: one, one: zero}[predictions[row, column]]
    predictions[dataset.targets == -100] = 0  # unscored positions do not count
    metrics = task.metrics(predictions, dataset.targets, "test")
    assert metrics["accuracy"] == pytest.approx(1 - 1 / len(scored))
    assert metrics["error"] == pytest.approx(100 / len(scored))


def test_chance_baseline_is_a_guessed_bit():
    task = make_task("flipflop", {"length": 16})
    assert task.baseline_scores(task.generate(10, seed=0, split="val"), "val") == {"chance": 0.5}
