"""Multi-query repeated associative recall with N-back (MQRAR-N).

Version 2 of the format: a query is ``? Kx`` and shows no answer. Version 1 wrote a query as
``? Kx Vz``, its answer Vz as an input token after the scored position. A later query of the
same key, with no assignment to it in between, has the same answer, so a model could copy the
answer shown after the earlier query instead of counting assignments: the rule "repeat the
value that followed the key's latest mention" scored 57-68% at N = 2-4, far above the latest
assignment (the N = 1 answer, about 1/num_values for N > 1). In version 2 the only values in
the input are those of assignments, so that rule is exactly the latest-assignment baseline.
"""

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

ASSIGNMENT_TOKENS, QUERY_TOKENS = 2, 2  # "Kx Vy" and "? Kx"


@dataclass(frozen=True)
class MqrarConfig:
    num_keys: int = option(32, "number of distinct keys K0, K1, ...", minimum=1)
    num_values: int = option(32, "number of distinct values V0, V1, ...", minimum=2)
    n_back: int = option(2, "a query asks for the n-th most recent value of its key", minimum=1)
    query_prob: float = option(0.5, "probability that an item is a query (when one is possible)")
    length: int = option(768, "tokens per sequence, padded with '.'", minimum=1, maximum=MAX_LENGTH)

    def __post_init__(self):
        if not 0 < self.query_prob < 1:
            raise UserError(
                f"invalid value {self.query_prob} for 'query_prob'; it must be between 0 and 1"
            )
        shortest = ASSIGNMENT_TOKENS * self.n_back + QUERY_TOKENS  # room for one query
        if self.length < shortest:
            raise UserError(
                f"invalid value {self.length} for 'length'; with n_back={self.n_back} it must "
                f"be >= {shortest}"
            )


@TASKS.register("mqrar")
class Mqrar(Task):
    """Multi-query repeated associative recall, N-back: recall a key's N-th most recent value.

    The PaTH paper describes the task in words only; this token format is pathbench's own.
    Vocabulary: keys ``K0``..``K{num_keys-1}``, values ``V0``..``V{num_values-1}``, the query
    marker ``?`` and the pad ``.``, in that id order. A sequence is a stream of items, each an
    assignment ``Kx Vy`` (key x now holds value y, both uniform) or, with probability
    ``query_prob`` once some key has at least ``n_back`` assignments, a query ``? Kx`` about a
    key chosen uniformly among those. The answer to the query is the value of the
    ``n_back``-th most recent assignment to Kx before it (1 = the latest); it is not in the
    input. The stream ends at the first item that does not fit in ``length`` tokens; the
    remainder is padded with ``.``. Scored: the ``Kx`` position of each query, whose target is
    the answer; every other position is not scored (-100).

    An example with ``n_back`` = 2 and ``length`` = 17 (targets under the scored positions)::

        inputs   K0 V3 K1 V0 K0 V1 ?  K0 K1 V2 ?  K1 K0 V2 ?  K0 .
        targets                       V3          V0          V1

    The first query asks for K0's value before its latest (V3, not V1), the second for K1's
    (V0, not V2), the third for K0's second most recent of V3, V1, V2 (V1).

    Baselines (`baselines`), scored on the same data: ``chance`` (1 / num_values);
    ``latest_assignment``, answering with the key's latest value, i.e. the N = 1 answer: 1.0
    when ``n_back`` is 1, and for ``n_back`` > 1 what a model scores that has not learnt to look
    past the latest assignment; ``first_assignment``, the key's first value; and
    ``copy_after_mention``, the token that followed the key's previous mention (its latest
    value, unless the key was queried since, when the copy is not a value at all).

    Splits: ``train``, ``val`` and ``test``, all ``length`` tokens. Length generalisation: each
    N of ``eval_lengths`` (each greater than ``length``) adds a test split ``test_N`` of N-token
    sequences with the same statistics and hence more items, drawn from its own random stream
    like every split.
    """

    name = "mqrar"
    version = "2"
    description = "multi-query repeated associative recall: recall a key's n-th most recent value"
    Config = MqrarConfig
    length_setting = "length"
    # The model and task size are PaTH's setting (Yang et al. 2025): two layers, two heads,
    # width 256, 32 keys, 768 tokens. The training settings are our choice.
    run_defaults = {
        "model": {"attention": "path", "layers": 2, "heads": 2, "d_model": 256},
        "train": {
            "steps": 20_000,
            "batch_size": 64,
            "lr": 1e-3,
            "warmup": 1000,
            "eval_num": 1024,
            "early_stop": None,
        },
    }
    # Small enough to train in about a minute on two CPU cores, and still separating PaTH from
    # RoPE and FoX at N = 2 (docs/usage.md gives the numbers).
    presets = {"cpu": {
        "task": {"length": 64, "num_keys": 4, "num_values": 8},
        "model": {"d_model": 64},
        "train": {"steps": 600, "batch_size": 32, "warmup": 60, "eval_every": 200},
    }}

    def __init__(self, overrides=None):
        super().__init__(overrides)
        keys, values = self.options.num_keys, self.options.num_values
        self.vocab = [f"K{k}" for k in range(keys)] + [f"V{v}" for v in range(values)] + ["?", "."]
        self.splits = ("train", "val", "test")

    def sample(self, rng, num, split):
        o = self.options
        length = o.length
        first_value = o.num_keys  # token id of V0
        query, pad = first_value + o.num_values, first_value + o.num_values + 1
        inputs = np.full((num, length), pad, dtype=np.int64)
        targets = np.full((num, length), IGNORE_INDEX, dtype=np.int64)
        # recent[n, k, j]: value of the (j+1)-th most recent assignment to key k in sequence n.
        recent = np.zeros((num, o.num_keys, o.n_back), dtype=np.int64)
        assignments = np.zeros((num, o.num_keys), dtype=np.int64)
        queryable_keys = np.zeros(num, dtype=np.int64)  # keys with >= n_back assignments
        position = np.zeros(num, dtype=np.int64)
        active = np.arange(num)  # sequences whose stream has not ended yet

        while active.size:
            is_query = (rng.random(active.size) < o.query_prob) & (queryable_keys[active] > 0)
            fits = position[active] + np.where(is_query, QUERY_TOKENS, ASSIGNMENT_TOKENS) <= length
            active, is_query = active[fits], is_query[fits]

            rows = active[~is_query]
            keys = rng.integers(0, o.num_keys, rows.size)
            values = rng.integers(0, o.num_values, rows.size)
            at = position[rows]
            inputs[rows, at] = keys
            inputs[rows, at + 1] = first_value + values
            recent[rows, keys] = np.concatenate([values[:, None], recent[rows, keys, :-1]], axis=1)
            assignments[rows, keys] += 1
            queryable_keys[rows] += assignments[rows, keys] == o.n_back
            position[rows] += ASSIGNMENT_TOKENS

            rows = active[is_query]
            # The key is the c-th queryable one, for c uniform in [0, number of queryable keys).
            queryable = assignments[rows] >= o.n_back
            chosen = (rng.random(rows.size) * queryable_keys[rows]).astype(np.int64)
            keys = np.argmax(np.cumsum(queryable, axis=1) > chosen[:, None], axis=1)
            answers = first_value + recent[rows, keys, o.n_back - 1]
            at = position[rows]
            inputs[rows, at] = query
            inputs[rows, at + 1] = keys
            targets[rows, at + 1] = answers
            position[rows] += QUERY_TOKENS
        return inputs, targets

    def sample_tensors(self, generator, num, split):
        """`sample`'s stream of items, drawn with torch for all items at once.

        Every item is two tokens, so a sequence holds ``length // 2`` items. An item is a query
        with probability ``query_prob`` once some key has ``n_back`` assignments; before that
        every item is an assignment, so that moment follows from the keys drawn alone, and
        each item's kind, the assignment counts before it, the queried key and the answer
        follow from cumulative sums and gathers over all items at once: a few dozen kernel
        launches a draw, where a loop over items launches that many an item.
        """
        import torch

        o, device = self.options, generator.device
        items = o.length // 2
        first_value = o.num_keys  # token id of V0
        query, pad = first_value + o.num_values, first_value + o.num_values + 1
        rows = torch.arange(num, device=device)[:, None]  # [N, 1]

        def uniform():
            return torch.rand((num, items), generator=generator, device=device)

        keys = torch.randint(0, o.num_keys, (num, items), generator=generator, device=device)
        values = torch.randint(0, o.num_values, (num, items), generator=generator, device=device)
        wants_query, choice = uniform(), uniform()

        def counts_before(one_hot):  # [N, I, K]: a key's items before each item
            return torch.cumsum(one_hot, dim=1, dtype=torch.int32) - one_hot

        # [N, I, K], by comparison: one_hot() reads the keys' range back from the device
        one_hot = (keys[..., None] == torch.arange(o.num_keys, device=device)).to(torch.int32)
        # while no key has n_back assignments every item is one, so the first item that may
        # be a query is where the keys drawn so far first repeat one n_back times
        can_query = counts_before(one_hot).amax(dim=2) >= o.n_back  # [N, I]
        is_query = (wants_query < o.query_prob) & can_query
        assigned = counts_before(one_hot * ~is_query[..., None])  # [N, I, K]

        # the query's key: the c-th of those with n_back assignments, c uniform
        queryable = assigned >= o.n_back
        chosen = (choice * queryable.sum(dim=2)).long()  # [N, I]
        queried = (queryable.cumsum(dim=2) > chosen[..., None]).int().argmax(dim=2)
        # value_of[n, k, r]: the value of key k's (r+1)-th assignment; queries write to the
        # spare last slot
        rank = assigned.gather(2, keys[..., None]).squeeze(2).long()  # [N, I]
        value_of = torch.zeros((num, o.num_keys, items + 1), dtype=torch.int64, device=device)
        value_of[rows, keys, torch.where(is_query, items, rank)] = values
        before = assigned.gather(2, queried[..., None]).squeeze(2).long()  # [N, I]
        answers = value_of[rows, queried, (before - o.n_back).clamp(min=0)]

        inputs = torch.full((num, o.length), pad, dtype=torch.int64, device=device)
        targets = torch.full((num, o.length), IGNORE_INDEX, dtype=torch.int64, device=device)
        inputs[:, 0:2 * items:2] = torch.where(is_query, query, keys)
        inputs[:, 1:2 * items:2] = torch.where(is_query, queried, first_value + values)
        targets[:, 1:2 * items:2] = torch.where(is_query, first_value + answers, IGNORE_INDEX)
        return inputs, targets

    def baselines(self, dataset, split):
        """``chance`` and the rules of the class docstring, on ``dataset``."""
        return {
            "chance": 1.0 / self.options.num_values,
            "latest_assignment": self.latest_assignment(dataset.inputs),
            "first_assignment": self.first_assignment(dataset.inputs),
            "copy_after_mention": self.copy_after_mention(dataset.inputs),
        }

    def latest_assignment(self, inputs: np.ndarray) -> np.ndarray:
        """Predictions [num, length] of the rule "answer a query with the latest value assigned
        to its key", read from the tokens alone (the pad token where there is no query)."""
        return self._answer_queries(inputs, lambda kept, value: value)

    def first_assignment(self, inputs: np.ndarray) -> np.ndarray:
        """Predictions of the rule "answer with the first value assigned to the key"."""
        return self._answer_queries(inputs, lambda kept, value: np.where(kept == self._pad,
                                                                          value, kept))

    def copy_after_mention(self, inputs: np.ndarray) -> np.ndarray:
        """Predictions of the rule "answer with the token that followed the key's previous
        mention", an assignment's value or, after a query of the key, the next item's first
        token (which is never a value): what copying from the last mention would give."""
        o = self.options
        num, length = inputs.shape
        predictions = np.full((num, length), self._pad, dtype=np.int64)
        followed = np.full((num, o.num_keys), self._pad, dtype=np.int64)
        rows = np.arange(num)
        for at in range(1, length):
            previous, token = inputs[:, at - 1], inputs[:, at]
            asked = rows[previous == self._query]  # token is the queried key
            predictions[asked, at] = followed[asked, token[asked]]
            mentioned = rows[previous < o.num_keys]  # token follows a mention of a key
            followed[mentioned, previous[mentioned]] = token[mentioned]
        return predictions

    @property
    def _query(self) -> int:
        return self.options.num_keys + self.options.num_values

    @property
    def _pad(self) -> int:
        return self._query + 1

    def _answer_queries(self, inputs: np.ndarray, keep) -> np.ndarray:
        """Predictions of a rule that answers a query from the values assigned to its key:
        ``keep(kept, value)`` is what the rule holds for a key once ``value`` is assigned to it
        (pad: nothing yet)."""
        o = self.options
        num, length = inputs.shape
        predictions = np.full((num, length), self._pad, dtype=np.int64)
        kept = np.full((num, o.num_keys), self._pad, dtype=np.int64)  # value token per key
        rows = np.arange(num)
        # Every item is two tokens and the first starts at position 0.
        for at in range(0, length - 1, ASSIGNMENT_TOKENS):
            first, second = inputs[:, at], inputs[:, at + 1]
            assigned = rows[first < o.num_keys]
            keys = first[assigned]
            kept[assigned, keys] = keep(kept[assigned, keys], second[assigned])
            asked = rows[first == self._query]
            predictions[asked, at + 1] = kept[asked, second[asked]]
        return predictions
