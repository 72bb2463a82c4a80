"""Word problems on finite groups: a5, s5, a4xz5, z60 (one task class, four registered groups)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pathbench import UserError

from pathbench.tasks.base import (
    MAX_LENGTH,
    TASKS,
    Task,
    option,
)


def _build_group(group: str):
    """The sympy permutation group called ``group`` (sympy is imported only when needed)."""
    from sympy.combinatorics.group_constructs import DirectProduct
    from sympy.combinatorics.named_groups import AlternatingGroup, CyclicGroup, SymmetricGroup

    builders = {
        "a5": lambda: AlternatingGroup(5),
        "s5": lambda: SymmetricGroup(5),
        "a4xz5": lambda: DirectProduct(AlternatingGroup(4), CyclicGroup(5)),
        "z60": lambda: DirectProduct(CyclicGroup(4), CyclicGroup(3), CyclicGroup(5)),
    }
    return builders[group]()


@functools.cache
def group_tables(group: str) -> tuple[list[str], np.ndarray]:
    """The group's element tokens, sorted by array form, and its multiplication table.

    ``table[a, b]`` is the index of ``a * b``, "apply a, then b" (sympy's convention), whose
    array form is ``b[a[i]]``.
    """
    elements = np.array(sorted(p.array_form for p in _build_group(group).generate()))
    order, degree = elements.shape
    tokens = ["[" + ",".join(map(str, p)) + "]" for p in elements]
    # Products of all pairs as array forms: products[a, b, i] = elements[b, elements[a, i]].
    products = elements[np.arange(order)[None, :, None], elements[:, None, :]]
    # A permutation's base-`degree` number, most significant digit first, sorts like its
    # array form, so the position among the sorted elements' numbers is the element's index.
    place_values = degree ** np.arange(degree - 1, -1, -1, dtype=np.int64)
    table = np.searchsorted(elements @ place_values, products @ place_values)
    return tokens, table


WORDS = ("elements", "generators")


@dataclass(frozen=True)
class WordProblemConfig:
    length: int = option(20, "group elements per sequence", minimum=1, maximum=MAX_LENGTH)
    words: str = option("elements", "what a word is made of: elements of the group, uniform, or "
                        "its fixed generators and their inverses", choices=WORDS)


def _array_form(cycle: tuple[int, ...], degree: int) -> tuple[int, ...]:
    """The permutation of ``range(degree)`` that maps each point of ``cycle`` to the next."""
    image = list(range(degree))
    for point, following in zip(cycle, cycle[1:] + cycle[:1]):
        image[point] = following
    return tuple(image)


class WordProblem(Task):
    """The word problem of a finite group: track the running product of random elements.

    Tokens are the group's elements written as permutation array forms, such as
    ``[1,2,0,3,4]``; the vocabulary is sorted by array form. A sequence is ``length`` elements
    drawn uniformly; the target at position t is x_0 * x_1 * ... * x_t, where p * q means
    "apply p, then q" (sympy's convention). Every position is scored.

    With ``words=generators`` (for a group with fixed generators: A5's are the paper's g1 = (1 2
    3), g2 = (1 2 4), g3 = (1 2 5), here on points 0..4) a word is drawn uniformly from the
    generators and their inverses, written ``g1``..``g3`` and ``g1^-1``..``g3^-1`` (tokens after
    the elements'), and the targets are the running products as elements, as above::

        inputs   g1          g2^-1       g1
        targets  [1,2,0,3,4] [0,2,3,1,4] [1,0,3,2,4]

    A word that opens with one letter repeated is the same word to a model whose attention
    weights sum to one at every position (softmax, whatever the position encoding): each of
    those positions averages identical values. With generators of order 3 that costs position 1
    (g g = g^-1) a sixth of its words and position 2 (g g g = e) a 36th, so such a model's
    ``solved_length`` in this framing is 1 and its accuracy at length 16 at most 0.988; with
    elements, position 1 loses 59 words in 3,600.

    Splits: ``train``, ``val`` and ``test``, all of ``length`` elements. Length generalisation:
    each N of ``eval_lengths`` (each greater than ``length``) adds a test split ``test_N`` of
    words N elements long, drawn from its own random stream like every split. Training always
    uses ``length``.

    Metrics: ``accuracy`` (all positions), ``last_accuracy`` (the final product),
    ``accuracy_by_position`` (a list, one accuracy per position) and ``solved_length``, the
    longest prefix of positions that are each at least 90% accurate (0 when the first position
    is below). Solved means accuracy of at least 0.9, the threshold of Merrill et al. (2024)
    that PaTH follows; a depth solves the task only at a stated length, since the depth needed
    grows with the length of the word. Baselines: ``chance`` (1 / the order of the group, the
    floor of ``last_accuracy``) and ``copy_first``, the honest floor of ``accuracy``: the first
    position right (its product is the first letter's element) and chance at every other.
    """

    version = "1"
    Config = WordProblemConfig
    length_setting = "length"
    solved_threshold = 0.9
    generators: ClassVar[dict[str, tuple[int, ...]]] = {}  # name -> cycle, on points 0, 1, ...
    # Our choice, not the paper's: four heads of width 32 (d_model 128) and two layers as the
    # starting point of a depth sweep, on sequences of 20 elements, the short-sequence regime
    # in which Merrill et al. (2024) and PaTH compare the depth needed to reach 90% on A5.
    run_defaults = {
        "model": {"attention": "path", "layers": 2, "heads": 4, "d_model": 128},
        "train": {
            "steps": 20_000,
            "batch_size": 128,
            "lr": 1e-3,
            "warmup": 1000,
            "eval_num": 2048,
            "early_stop": 0.99,  # well past the 0.9 "solved" line; saves time in depth sweeps
        },
    }
    # Words of 3 elements: the shortest at which the last position needs the running product
    # tracked, learned in minutes on two CPU cores (docs/usage.md gives the numbers).
    presets = {"cpu": {
        "task": {"length": 3},
        "train": {"steps": 1500, "batch_size": 256, "lr": 3e-3, "warmup": 100,
                  "schedule": "constant", "eval_num": 1024, "eval_every": 500},
    }}

    def __init__(self, overrides=None):
        super().__init__(overrides)
        self.vocab, self._table = group_tables(self.name)
        self.splits = ("train", "val", "test")
        # the group elements a word's tokens stand for: every element, or the generators
        self._letters = np.arange(len(self.vocab))
        if self.options.words == "generators":
            if not self.generators:
                with_generators = [name for name, task in TASKS.entries().items()
                                   if getattr(TASKS.get(name), "generators", None)]
                raise UserError(f"task {self.name!r} has no fixed generators; words=generators "
                                f"is for {', '.join(with_generators)}")
            self._letters = self._generator_elements()

    def _generator_elements(self) -> np.ndarray:
        """The element indices of the generators and their inverses, in token order; adds
        their tokens to the vocabulary."""
        forms = [tuple(int(i) for i in token.strip("[]").split(",")) for token in self.vocab]
        index = {form: number for number, form in enumerate(forms)}
        degree = len(forms[0])
        letters, names = [], []
        for inverse in (False, True):
            for name, cycle in self.generators.items():
                letters.append(index[_array_form(cycle[::-1] if inverse else cycle, degree)])
                names.append(name + ("^-1" if inverse else ""))
        self.vocab = [*self.vocab, *names]
        return np.array(letters)

    def sample(self, rng, num, split):
        length, order = self.options.length, len(self._table)
        letters = rng.integers(0, len(self._letters), size=(num, length))
        elements = self._letters[letters]
        products = np.empty_like(elements)
        products[:, 0] = elements[:, 0]
        for t in range(1, length):
            products[:, t] = self._table[products[:, t - 1], elements[:, t]]
        inputs = elements if len(self._letters) == order else order + letters
        return inputs, products

    def sample_tensors(self, generator, num, split):
        import torch

        device, order = generator.device, len(self._table)
        table = self.device_array(self._table, device)
        letters = torch.randint(0, len(self._letters), (num, self.options.length),
                                generator=generator, device=device)
        elements = self.device_array(self._letters, device)[letters]
        products = [elements[:, 0]]
        for t in range(1, self.options.length):
            products.append(table[products[-1], elements[:, t]])
        inputs = elements if len(self._letters) == order else order + letters
        return inputs, torch.stack(products, dim=1)

    def metrics_from(self, tally, split):
        metrics = super().metrics_from(tally, split)
        by_position = tally["correct"] / np.maximum(tally["scored"], 1)  # every position scored
        below = np.flatnonzero(by_position < self.solved_threshold)
        metrics["last_accuracy"] = float(by_position[-1])
        metrics["accuracy_by_position"] = by_position.tolist()
        metrics["solved_length"] = int(below[0]) if below.size else len(by_position)
        return metrics

    def baselines(self, dataset, split):
        order, length = len(self._table), dataset.targets.shape[1]
        # The first product is the first letter's element, a lookup: a model that tracks no
        # state still gets it, and is at chance from the second on.
        return {"chance": 1.0 / order, "copy_first": (1.0 + (length - 1) / order) / length}


@TASKS.register("a5")
class A5WordProblem(WordProblem):
    name = "a5"
    description = "word problem on A5 (order 60, not solvable): running product of permutations"
    # the PaTH paper's: (1 2 3), (1 2 4), (1 2 5) on points 1..5
    generators = {"g1": (0, 1, 2), "g2": (0, 1, 3), "g3": (0, 1, 4)}
    # Twice the other groups' steps: at 1,500, two seeds of five had not yet learned the last
    # position (results/cpu_presets gives both budgets).
    presets = {"cpu": {**WordProblem.presets["cpu"],
                       "train": {**WordProblem.presets["cpu"]["train"], "steps": 3000}}}


@TASKS.register("s5")
class S5WordProblem(WordProblem):
    name = "s5"
    description = "word problem on S5 (order 120, not solvable): running product of permutations"
    # Twice the group's order, four times its products to learn: words of 2 elements and one
    # layer (the product of two is one lookup), which a CPU learns in the time the other groups
    # take for 3.
    presets = {"cpu": {
        "task": {"length": 2},
        "model": {"layers": 1},
        "train": {"steps": 2000, "batch_size": 256, "lr": 3e-3, "warmup": 100,
                  "schedule": "constant", "eval_num": 1024, "eval_every": 500},
    }}


@TASKS.register("a4xz5")
class A4xZ5WordProblem(WordProblem):
    name = "a4xz5"
    description = "word problem on A4 x Z5 (order 60, solvable control for a5)"


@TASKS.register("z60")
class Z60WordProblem(WordProblem):
    name = "z60"
    description = "word problem on Z60 = Z4 x Z3 x Z5 (order 60, abelian control for a5)"
