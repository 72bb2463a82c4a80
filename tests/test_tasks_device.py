"""Training data drawn with torch (`Task.sample_tensors`, on a GPU in training) against the
numpy generators: exactly where the data follow from the draws (a read's answer, a running
product, a query's answer), and in distribution elsewhere (frequencies within 5 standard
errors of the numpy sampler's, on 20,000 sequences)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pathbench.tasks import IGNORE_INDEX, make_task

NUM = 20_000
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TASKS = {"flipflop": {"length": 64}, "a5": {"length": 8}, "s5": {"length": 6},
         "a4xz5": {"length": 6}, "z60": {"length": 6},
         "mqrar": {"length": 64, "num_keys": 4, "num_values": 8, "n_back": 2}}


def drawn(task, split="train", seed=0, num=NUM):
    inputs, targets = task.generate_tensors(num, seed, split, DEVICE)
    return inputs.cpu().numpy(), targets.cpu().numpy()


def close(a: float, b: float, n: int) -> bool:
    """Two rates of n draws each agree within 5 standard errors of their difference."""
    p = (a + b) / 2
    return abs(a - b) <= 5 * math.sqrt(max(2 * p * (1 - p) / n, 1e-12))


@pytest.mark.parametrize("name", TASKS)
def test_device_data_are_the_tasks_arrays_and_a_function_of_the_seed(name):
    task = make_task(name, TASKS[name])
    assert task.samples_on_device
    inputs, targets = drawn(task, num=500)
    cpu = task.generate(500, 0, "train")
    assert inputs.shape == cpu.inputs.shape and inputs.dtype == np.int64
    assert inputs.min() >= 0 and inputs.max() < len(task.vocab)
    assert np.all((targets == IGNORE_INDEX) | ((targets >= 0) & (targets < len(task.vocab))))
    again, _ = drawn(task, num=500)
    other, _ = drawn(task, seed=1, num=500)
    val, _ = drawn(task, split="val", num=500)
    assert np.array_equal(inputs, again)
    assert not np.array_equal(inputs, other) and not np.array_equal(inputs, val)


@pytest.mark.parametrize("split", ["train", "sparse", "dense"])
def test_flipflop_reads_answer_the_latest_write_and_instructions_follow_the_split(split):
    task = make_task("flipflop", TASKS["flipflop"])
    inputs, targets = drawn(task, split)
    cpu = task.generate(NUM, 0, split)
    for row in range(50):  # each read's answer is the bit of the latest write before it
        last = None
        for t in range(0, inputs.shape[1], 2):
            instruction, bit = task.vocab[inputs[row, t]], inputs[row, t + 1]
            if instruction == "w":
                last = bit
            if instruction == "r":
                assert bit == last and targets[row, t] == bit
            else:
                assert targets[row, t] == IGNORE_INDEX
    middle = slice(2, -2, 2)  # instructions other than the first write and the last read
    n = inputs[:, middle].size
    for token in range(3):  # w, r, i
        assert close((inputs[:, middle] == token).mean(), (cpu.inputs[:, middle] == token).mean(),
                     n), task.vocab[token]
    bits = inputs[:, 3::2][inputs[:, 2::2] == 0]  # the bits that writes write
    assert close((bits == task.vocab.index("1")).mean(), 0.5, bits.size)


@pytest.mark.parametrize("name", ["a5", "s5", "a4xz5", "z60"])
def test_word_problem_targets_are_the_running_products_of_uniform_elements(name):
    task = make_task(name, TASKS[name])
    inputs, targets = drawn(task)
    forms = [tuple(int(i) for i in token.strip("[]").split(",")) for token in task.vocab]
    index = {form: number for number, form in enumerate(forms)}
    for row in range(100):  # "apply p, then q": (p * q)[i] = q[p[i]]
        product = forms[inputs[row, 0]]
        assert targets[row, 0] == inputs[row, 0]
        for t in range(1, inputs.shape[1]):
            q = forms[inputs[row, t]]
            product = tuple(q[product[i]] for i in range(len(product)))
            assert targets[row, t] == index[product]
    counts = np.bincount(inputs.ravel(), minlength=len(task.vocab))
    expected = inputs.size / len(task.vocab)
    chi_square = ((counts - expected) ** 2 / expected).sum()
    degrees = len(task.vocab) - 1
    assert chi_square < degrees + 5 * math.sqrt(2 * degrees)  # uniform


def test_mqrar_answers_are_the_nth_latest_assignment_and_queries_come_as_often():
    task = make_task("mqrar", TASKS["mqrar"])
    o = task.options
    inputs, targets = drawn(task)
    cpu = task.generate(NUM, 0, "train")
    query = o.num_keys + o.num_values
    for row in range(200):
        history = {}
        t = 0
        while t < inputs.shape[1] and inputs[row, t] != query + 1:  # up to the padding
            if inputs[row, t] == query:
                key = inputs[row, t + 1]
                assert len(history.get(key, [])) >= o.n_back
                assert targets[row, t + 1] == history[key][-o.n_back]
            else:
                history.setdefault(inputs[row, t], []).append(inputs[row, t + 1])
                assert targets[row, t] == targets[row, t + 1] == IGNORE_INDEX
            t += 2
    for array in (inputs, cpu.inputs):
        assert array.shape == (NUM, o.length)
    for token in (query, query + 1):  # queries, padding
        assert close((inputs == token).mean(), (cpu.inputs == token).mean(), inputs.size)
    assert close((targets != IGNORE_INDEX).mean(), (cpu.targets != IGNORE_INDEX).mean(),
                 targets.size)
    # when queries may start, and which key a query picks among those it may
    device_items, cpu_items = mqrar_items(inputs, query), mqrar_items(cpu.inputs, query)
    for statistic in ("queries_by_item", "queried_keys", "asks_the_key_just_assigned"):
        for mine, theirs in zip(device_items[statistic], cpu_items[statistic]):
            assert close(mine, theirs, NUM)


def mqrar_items(inputs, query) -> dict:
    """Per item (two tokens): how often it is a query, for the first 8 items (the first
    query may come after n_back assignments to one key); how often queries ask for each key;
    and how often a query that follows an assignment asks for that assignment's key."""
    is_query = inputs[:, 0::2] == query
    key = np.where(is_query, inputs[:, 1::2], inputs[:, 0::2])
    after_assignment = is_query[:, 1:] & ~is_query[:, :-1]
    same_key = (key[:, 1:] == key[:, :-1])[after_assignment]
    queried = key[is_query]
    return {"queries_by_item": is_query[:, :8].mean(axis=0),
            "queried_keys": [(queried == k).mean() for k in range(key.max() + 1)],
            "asks_the_key_just_assigned": [same_key.mean()]}


def test_a_task_without_a_device_sampler_says_so():
    from test_tasks_interface import LegacyCount

    assert not LegacyCount().samples_on_device


def test_words_over_generators_drawn_on_the_device_are_their_running_products():
    task = make_task("a5", {"length": 6, "words": "generators"})
    inputs, targets = drawn(task, num=2000)
    order = len(task._table)
    assert inputs.min() >= order and inputs.max() < len(task.vocab)  # generator tokens only
    elements = task._letters[inputs - order]
    products = elements[:, 0]
    for t in range(6):
        products = elements[:, 0] if t == 0 else task._table[products, elements[:, t]]
        assert np.array_equal(targets[:, t], products)
    counts = np.bincount(inputs.ravel() - order, minlength=6)
    assert close(counts.min() / inputs.size, 1 / 6, inputs.size)
    assert close(counts.max() / inputs.size, 1 / 6, inputs.size)
