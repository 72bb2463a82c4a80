"""Word problems: targets re-derived from the token strings by composing permutations here.

The groups are rebuilt with sympy in this file and products are composed by hand, so nothing
of the generator (its element list or its multiplication table) is trusted.
"""

import json

import numpy as np
import pytest
from sympy.combinatorics import Permutation
from sympy.combinatorics.group_constructs import DirectProduct
from sympy.combinatorics.named_groups import AlternatingGroup, CyclicGroup, SymmetricGroup

from pathbench import UserError
from pathbench.tasks import make_task

GROUPS = {
    "a5": lambda: AlternatingGroup(5),
    "s5": lambda: SymmetricGroup(5),
    "a4xz5": lambda: DirectProduct(AlternatingGroup(4), CyclicGroup(5)),
    "z60": lambda: DirectProduct(CyclicGroup(4), CyclicGroup(3), CyclicGroup(5)),
}
ORDERS = {"a5": 60, "s5": 120, "a4xz5": 60, "z60": 60}


def then(p, q):
    """The permutation "apply p, then q", written out: i -> q(p(i))."""
    return [q[p[i]] for i in range(len(p))]


def parse(token):
    return json.loads(token)  # "[1,2,0,3,4]" -> [1, 2, 0, 3, 4]


def test_products_compose_left_to_right_like_sympy():
    p, q = [1, 2, 0], [1, 0, 2]
    assert then(p, q) == [0, 2, 1]
    assert (Permutation(p) * Permutation(q)).array_form == then(p, q)


@pytest.mark.parametrize("name", GROUPS)
def test_vocabulary_is_the_group_sorted_by_array_form(name):
    task = make_task(name)
    elements = [parse(token) for token in task.vocab]
    expected = sorted(p.array_form for p in GROUPS[name]().generate())
    assert elements == expected
    assert len(elements) == ORDERS[name]
    assert all(token == "[" + ",".join(map(str, e)) + "]" for token, e in zip(task.vocab, elements))


@pytest.mark.parametrize("name", GROUPS)
def test_targets_are_running_products(name):
    task = make_task(name, {"length": 12, "eval_lengths": [30]})
    assert task.splits == ("train", "val", "test", "test_30")
    for split, length in [("train", 12), ("val", 12), ("test", 12), ("test_30", 30)]:
        dataset = task.generate(200, seed=5, split=split)
        assert dataset.inputs.shape == dataset.targets.shape == (200, length)
        for row in range(200):
            product = None
            for token, target in zip(dataset.inputs[row], dataset.targets[row]):
                element = parse(dataset.vocab[token])
                product = element if product is None else then(product, element)
                assert parse(dataset.vocab[target]) == product


def test_z60_is_cyclic_and_a4xz5_is_not_abelian():
    # Cheap structural checks of the controls, through the token strings alone.
    z60 = [parse(t) for t in make_task("z60").vocab]
    identity = list(range(12))

    def order(p):
        power, n = p, 1
        while power != identity:
            power, n = then(power, p), n + 1
        return n

    assert max(order(p) for p in z60) == 60
    a4xz5 = [parse(t) for t in make_task("a4xz5").vocab]
    assert any(then(p, q) != then(q, p) for p in a4xz5 for q in a4xz5)


@pytest.mark.parametrize("name", GROUPS)
def test_elements_are_uniform(name):
    dataset = make_task(name).generate(10_000, seed=2, split="train")
    observed = np.bincount(dataset.inputs.ravel(), minlength=ORDERS[name])
    expected = dataset.inputs.size / ORDERS[name]
    chi_square = ((observed - expected) ** 2 / expected).sum()
    dof = ORDERS[name] - 1
    # Mean dof, standard deviation sqrt(2 dof): ten deviations above is beyond any chance.
    assert chi_square < dof + 10 * np.sqrt(2 * dof)


def test_metrics_score_every_position_and_the_last_one():
    task = make_task("a5", {"length": 4})
    dataset = task.generate(8, seed=0, split="test")
    predictions = dataset.targets.copy()
    predictions[:2, -1] = (predictions[:2, -1] + 1) % 60  # two wrong final products
    predictions[0, 0] = (predictions[0, 0] + 1) % 60
    metrics = task.metrics(predictions, dataset.targets, "test")
    assert metrics["accuracy"] == pytest.approx(1 - 3 / 32)
    assert metrics["last_accuracy"] == pytest.approx(6 / 8)
    assert metrics["accuracy_by_position"] == pytest.approx([7 / 8, 1, 1, 6 / 8])
    assert metrics["solved_length"] == 0  # the first position is below 90%
    assert task.solved_threshold == 0.9
    assert json.loads(json.dumps(metrics)) == metrics


def predictions_with_errors(targets, errors_by_position):
    """``targets`` with ``errors_by_position[t]`` rows wrong at position t."""
    predictions = targets.copy()
    for position, errors in enumerate(errors_by_position):
        predictions[:errors, position] = (predictions[:errors, position] + 1) % 60
    return predictions


@pytest.mark.parametrize(
    "errors, solved_length",
    [
        ([0, 0, 0, 0, 0, 0], 6),  # every position right
        ([0, 1, 2, 5, 0, 0], 3),  # position 3 is 75% accurate, the positions after it do not count
        ([0, 0, 2, 0, 0, 3], 5),  # 2 of 20 wrong is exactly 90%: solved
        ([3, 0, 0, 0, 0, 0], 0),  # the first position is below
        ([0, 0, 0, 0, 0, 3], 5),  # only the last is below
    ],
)
def test_solved_length_is_the_prefix_of_positions_at_least_90_percent_right(errors, solved_length):
    task = make_task("a5", {"length": 6})
    targets = task.generate(20, seed=1, split="val").targets
    metrics = task.metrics(predictions_with_errors(targets, errors), targets, "val")
    assert metrics["solved_length"] == solved_length
    assert metrics["accuracy_by_position"] == pytest.approx([1 - e / 20 for e in errors])
    assert metrics["last_accuracy"] == pytest.approx(1 - errors[-1] / 20)
    assert metrics["accuracy"] == pytest.approx(1 - sum(errors) / 120)
    assert metrics["scored"] == 120
    assert set(metrics) == {"accuracy", "scored", "last_accuracy", "accuracy_by_position",
                            "solved_length"}
    # The same scores from the tallies of two halves, added: the runner's batched evaluation.
    predictions = predictions_with_errors(targets, errors)
    halves = [task.tally(predictions[rows], targets[rows], "val") for rows in (slice(0, 7), slice(7, 20))]
    summed = {key: halves[0][key] + halves[1][key] for key in halves[0]}
    assert task.metrics_from(summed, "val") == metrics


@pytest.mark.parametrize("name", GROUPS)
def test_baselines_are_chance_and_the_first_position_copied(name):
    task = make_task(name, {"length": 3})
    dataset = task.generate(4, seed=0, split="test")
    chance = 1 / ORDERS[name]
    assert task.baseline_scores(dataset, "test") == pytest.approx(
        {"chance": chance, "copy_first": (1 + 2 * chance) / 3})


def test_baselines_of_generator_words_are_over_the_group_not_the_vocabulary():
    task = make_task("a5", {"length": 4, "words": "generators"})
    assert len(task.vocab) == 66  # 60 elements and 6 letters
    scores = task.baseline_scores(task.generate(4, seed=0, split="test"), "test")
    assert scores == pytest.approx({"chance": 1 / 60, "copy_first": (1 + 3 / 60) / 4})


def _forms(vocab):
    return {token: tuple(int(i) for i in token.strip("[]").split(","))
            for token in vocab if token.startswith("[")}


def _times(p, q):
    """p * q: apply p, then q (sympy's convention)."""
    return tuple(q[p[i]] for i in range(len(p)))


def test_a5_words_over_the_papers_generators_track_the_running_product():
    task = make_task("a5", {"length": 12, "words": "generators"})
    forms = _forms(task.vocab)
    assert task.vocab[60:] == ["g1", "g2", "g3", "g1^-1", "g2^-1", "g3^-1"]
    # the paper's g1 = (1 2 3), g2 = (1 2 4), g3 = (1 2 5), on points 0..4 here
    letters = {"g1": (1, 2, 0, 3, 4), "g2": (1, 3, 2, 0, 4), "g3": (1, 4, 2, 3, 0)}
    identity = (0, 1, 2, 3, 4)
    for name, form in list(letters.items()):
        inverse = tuple(form.index(i) for i in range(5))
        assert _times(form, inverse) == identity
        letters[name + "^-1"] = inverse
    data = task.generate(200, seed=0, split="train")
    for row in range(200):
        product = identity
        for t in range(12):
            token = task.vocab[data.inputs[row, t]]
            product = _times(product, letters[token])  # only generator tokens come in
            assert forms[task.vocab[data.targets[row, t]]] == product
    counts = np.bincount(data.inputs.ravel() - 60, minlength=6)
    assert counts.min() > 300  # each of the six letters about 400 times in 2,400


def test_the_documented_generator_word():
    from pathbench.tasks.word_problems import WordProblem

    lines = [line.split() for line in WordProblem.__doc__.splitlines()]
    inputs = next(words[1:] for words in lines if words[:1] == ["inputs"])
    targets = next(words[1:] for words in lines if words[:1] == ["targets"])
    task = make_task("a5", {"length": 3, "words": "generators"})
    forms, letters = _forms(task.vocab), task._letters
    product = (0, 1, 2, 3, 4)
    for token, target in zip(inputs, targets):
        element = task.vocab[letters[task.vocab.index(token) - 60]]
        product = _times(product, forms[element])
        assert forms[target] == product


def test_words_over_generators_need_a_group_that_has_them():
    with pytest.raises(UserError, match="task 's5' has no fixed generators; words=generators "
                                        "is for a5"):
        make_task("s5", {"words": "generators"})
    with pytest.raises(UserError, match="'words'"):
        make_task("a5", {"words": "letters"})
