"""mqrar: every sequence parsed from its token strings and its queries answered here."""

import pytest

from pathbench.tasks import make_task


def check_sequence(tokens, targets, n_back):
    """Parse one sequence; assert its format and answers. Returns (assignments, queries)."""
    history: dict[str, list[str]] = {}
    expected_targets = [None] * len(tokens)
    position = assignments = queries = 0
    while position < len(tokens) and tokens[position] != ".":
        if tokens[position] == "?":
            key, value = tokens[position + 1], tokens[position + 2]
            assert key.startswith("K") and value.startswith("V")
            assert len(history.get(key, [])) >= n_back, "a key queried too early"
            assert value == history[key][-n_back]
            expected_targets[position + 1] = value
            position, queries = position + 3, queries + 1
        else:
            key, value = tokens[position], tokens[position + 1]
            assert key.startswith("K") and value.startswith("V")
            history.setdefault(key, []).append(value)
            position, assignments = position + 2, assignments + 1
    padding = tokens[position:]
    assert set(padding) <= {"."} and len(padding) < 3  # the stream stops when an item won't fit
    assert targets == expected_targets
    return assignments, queries


def decode(dataset, row):
    tokens = [dataset.vocab[t] for t in dataset.inputs[row]]
    targets = [None if t == -100 else dataset.vocab[t] for t in dataset.targets[row]]
    return tokens, targets


def test_vocabulary_is_keys_values_query_pad():
    task = make_task("mqrar", {"num_keys": 3, "num_values": 2})
    assert task.vocab == ["K0", "K1", "K2", "V0", "V1", "?", "."]
    assert make_task("mqrar").config == {
        "num_keys": 32, "num_values": 32, "n_back": 2, "query_prob": 0.5,
        "length": 768, "eval_length": None,
    }


@pytest.mark.parametrize("n_back", [1, 2, 3, 4])
def test_queries_are_answerable_and_answered(n_back):
    task = make_task("mqrar", {"n_back": n_back, "num_keys": 8, "num_values": 8, "length": 120})
    dataset = task.generate(300, seed=n_back, split="train")
    total_queries = 0
    for row in range(300):
        _, queries = check_sequence(*decode(dataset, row), n_back)
        total_queries += queries
    assert total_queries > 300 * 5  # queries are common, not an edge case


def test_paper_setting_and_long_evaluation_split():
    task = make_task("mqrar", {"eval_length": 1024})
    assert task.splits == ("train", "val", "test", "test_long")
    assert task.test_splits == ("test", "test_long")
    for split, length in [("val", 768), ("test", 768), ("test_long", 1024)]:
        dataset = task.generate(20, seed=0, split=split)
        assert dataset.inputs.shape == dataset.targets.shape == (20, length)
        for row in range(20):
            assignments, queries = check_sequence(*decode(dataset, row), n_back=2)
            assert assignments > 50 and queries > 50


def test_keys_and_values_are_spread_over_the_vocabulary():
    dataset = make_task("mqrar").generate(50, seed=4, split="train")
    used = {dataset.vocab[t] for t in dataset.inputs.ravel()}
    assert {f"K{k}" for k in range(32)} | {f"V{v}" for v in range(32)} <= used
