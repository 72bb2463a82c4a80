"""mqrar: every sequence parsed from its token strings and its queries answered here."""

import numpy as np
import pytest

from pathbench.tasks import make_task
from pathbench.tasks.mqrar import Mqrar


def check_sequence(tokens, targets, n_back):
    """Parse one sequence; assert its format and answers. Returns (assignments, queries)."""
    history: dict[str, list[str]] = {}
    expected_targets = [None] * len(tokens)
    position = assignments = queries = 0
    while position < len(tokens) and tokens[position] != ".":
        if tokens[position] == "?":
            key = tokens[position + 1]
            assert key.startswith("K")
            assert len(history.get(key, [])) >= n_back, "a key queried too early"
            expected_targets[position + 1] = history[key][-n_back]
            position, queries = position + 2, queries + 1
        else:
            key, value = tokens[position], tokens[position + 1]
            assert key.startswith("K") and value.startswith("V")
            history.setdefault(key, []).append(value)
            position, assignments = position + 2, assignments + 1
    padding = tokens[position:]
    assert set(padding) <= {"."} and len(padding) < 2  # the stream stops when an item won't fit
    assert targets == expected_targets
    return assignments, queries


def decode(dataset, row):
    tokens = [dataset.vocab[t] for t in dataset.inputs[row]]
    targets = [None if t == -100 else dataset.vocab[t] for t in dataset.targets[row]]
    return tokens, targets


def latest_mention_rule(tokens, targets):
    """(correct, scored) of "predict the value token that most recently followed a mention of
    the queried key", from the token strings alone: the shortcut that version 1 allowed."""
    correct = scored = 0
    for position, target in enumerate(targets):
        if target is None:
            continue
        key = tokens[position]
        followers = [tokens[at + 1] for at in range(position)
                     if tokens[at] == key and tokens[at + 1].startswith("V")]
        correct += bool(followers) and followers[-1] == target
        scored += 1
    return correct, scored


def test_vocabulary_is_keys_values_query_pad():
    task = make_task("mqrar", {"num_keys": 3, "num_values": 2})
    assert task.vocab == ["K0", "K1", "K2", "V0", "V1", "?", "."]
    assert make_task("mqrar").config == {
        "num_keys": 32, "num_values": 32, "n_back": 2, "query_prob": 0.5,
        "length": 768, "eval_lengths": (),
    }
    assert task.version == "2"  # version 1 showed each answer in the input


@pytest.mark.parametrize("n_back", [1, 2, 3, 4])
def test_queries_are_answerable_and_answered(n_back):
    task = make_task("mqrar", {"n_back": n_back, "num_keys": 8, "num_values": 8, "length": 121})
    for split in ["train", "val", "test"]:
        dataset = task.generate(300, seed=n_back, split=split)
        total_queries = 0
        for row in range(300):
            _, queries = check_sequence(*decode(dataset, row), n_back)
            total_queries += queries
        assert total_queries > 300 * 5  # queries are common, not an edge case


def test_the_documented_example_is_a_valid_sequence():
    lines = [line.split() for line in Mqrar.__doc__.splitlines()]
    tokens = next(words[1:] for words in lines if words[:1] == ["inputs"])
    documented = next(words[1:] for words in lines if words[:1] == ["targets"])
    targets = [None] * len(tokens)
    for position in [i + 1 for i, token in enumerate(tokens) if token == "?"]:
        targets[position] = documented.pop(0)
    assert not documented and len(tokens) == 17
    assert check_sequence(tokens, targets, n_back=2) == (5, 3)


@pytest.mark.parametrize("n_back", [1, 2, 3, 4])
def test_no_answer_is_in_the_input(n_back):
    task = make_task("mqrar", {"n_back": n_back, "num_keys": 4, "num_values": 8, "length": 200})
    dataset = task.generate(200, seed=1, split="test")
    rows, positions = np.nonzero(dataset.targets != -100)
    vocab = np.array(dataset.vocab)
    assert (vocab[dataset.inputs[rows, positions - 1]] == "?").all()  # scored: a query's key
    inside = positions + 1 < dataset.inputs.shape[1]  # a query may end the sequence
    rows, positions = rows[inside], positions[inside]
    after = dataset.inputs[rows, positions + 1]
    assert not np.char.startswith(vocab[after], "V").any()  # no value right after a query key
    assert not (after == dataset.targets[rows, positions]).any()


@pytest.mark.parametrize("n_back", [1, 2, 3, 4])
def test_the_latest_mention_shortcut_is_only_the_latest_assignment(n_back):
    task = make_task("mqrar", {"n_back": n_back, "num_keys": 4, "num_values": 8, "length": 160})
    dataset = task.generate(200, seed=2, split="test")
    correct = scored = 0
    for row in range(len(dataset)):
        row_correct, row_scored = latest_mention_rule(*decode(dataset, row))
        correct, scored = correct + row_correct, scored + row_scored
    baselines = task.baseline_scores(dataset, "test")
    assert correct / scored == baselines["latest_assignment"]
    if n_back == 1:
        assert correct == scored
    else:  # about 1/8, the chance that the latest value equals the n-th latest
        assert correct / scored < 0.25


def brute_force_rules(dataset):
    """Accuracy of each rule, recounted from the token strings item by item."""
    correct = {"latest_assignment": 0, "first_assignment": 0, "copy_after_mention": 0}
    scored = 0
    for row in range(len(dataset)):
        tokens, targets = decode(dataset, row)
        latest, first, after = {}, {}, {}
        for position in range(0, len(tokens) - 1, 2):
            head, second = tokens[position], tokens[position + 1]
            if head.startswith("K"):
                latest[head] = second
                first.setdefault(head, second)
            elif head == "?":
                answer = targets[position + 1]
                correct["latest_assignment"] += latest[second] == answer
                correct["first_assignment"] += first[second] == answer
                correct["copy_after_mention"] += after.get(second) == answer
                scored += 1
            for at in (position, position + 1):  # what followed each mention of a key
                if tokens[at].startswith("K") and at + 1 < len(tokens):
                    after[tokens[at]] = tokens[at + 1]
    return {rule: count / scored for rule, count in correct.items()}


@pytest.mark.parametrize("n_back", [1, 2, 3])
def test_baselines_are_recounted_by_hand(n_back):
    task = make_task("mqrar", {"n_back": n_back, "num_keys": 3, "num_values": 5, "length": 61})
    dataset = task.generate(300, seed=4, split="val")
    baselines = task.baseline_scores(dataset, "val")
    assert set(baselines) == {"chance", "latest_assignment", "first_assignment",
                              "copy_after_mention"}
    assert baselines["chance"] == 1 / 5
    recounted = brute_force_rules(dataset)
    assert {rule: baselines[rule] for rule in recounted} == pytest.approx(recounted)
    if n_back == 1:
        assert baselines["latest_assignment"] == 1.0
        assert baselines["copy_after_mention"] < 1.0  # a query since breaks the copy
    else:
        assert 0.1 < baselines["latest_assignment"] < 0.3  # 1/5 for independent values


def test_the_rules_on_a_sequence_worked_by_hand():
    """K0 V3 K0 V1 ? K0 ? K0 . at n_back 2: both queries ask for K0's value before its latest
    (V3). The latest assignment says V1 twice, the first V3 twice; copying what followed K0's
    previous mention gives V1, then "?" (the second query's previous mention is the first)."""
    task = make_task("mqrar", {"n_back": 2, "num_keys": 1, "num_values": 4, "length": 9})
    inputs = np.array([[task.vocab.index(token) for token in "K0 V3 K0 V1 ? K0 ? K0 .".split()]])
    queried = [5, 7]

    def answers(rule):
        return [task.vocab[token] for token in getattr(task, rule)(inputs)[0, queried]]

    assert answers("latest_assignment") == ["V1", "V1"]
    assert answers("first_assignment") == ["V3", "V3"]
    assert answers("copy_after_mention") == ["V1", "?"]


def test_latest_assignment_predicts_only_at_queries():
    task = make_task("mqrar", {"num_keys": 3, "num_values": 4, "length": 40})
    dataset = task.generate(50, seed=0, split="test")
    predictions = task.latest_assignment(dataset.inputs)
    pad = task.vocab.index(".")
    assert ((predictions != pad) == (dataset.targets != -100)).all()


def test_paper_setting_and_long_evaluation_split():
    task = make_task("mqrar", {"eval_lengths": "1024"})
    assert task.splits == ("train", "val", "test", "test_1024")
    assert task.test_splits == ("test", "test_1024")
    for split, length in [("val", 768), ("test", 768), ("test_1024", 1024)]:
        dataset = task.generate(20, seed=0, split=split)
        assert dataset.inputs.shape == dataset.targets.shape == (20, length)
        for row in range(20):
            assignments, queries = check_sequence(*decode(dataset, row), n_back=2)
            assert assignments > 50 and queries > 50


def test_keys_and_values_are_spread_over_the_vocabulary():
    dataset = make_task("mqrar").generate(50, seed=4, split="train")
    used = {dataset.vocab[t] for t in dataset.inputs.ravel()}
    assert {f"K{k}" for k in range(32)} | {f"V{v}" for v in range(32)} <= used
