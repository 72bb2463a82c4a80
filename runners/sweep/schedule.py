"""The order in which a sweep's runs train, and which runs it may skip.

Runs go out in packs (runs that differ only in seed and learning rate, trained as one model,
``pathbench.models.pack``). ``--until-solved`` runs layer counts in ascending order and skips a
model's deeper layer counts once it has solved the task (two thirds of the seeds at the
learning rate val picked reach the task's solved threshold on val), which is what a
min-layers-to-solve table needs and no more. With ``--max-seeds N``, a depth whose seeds
disagree on val (some solve, some do not: one of three, or two of three, which counts as
solved) first gets more seeds, up to N in all, and is judged again on all of them: a split of
three seeds is the case a solve rate resolves least. With
``--max-steps S``, a depth that val does not call solved while some of its runs were still
improving at their step cap (budget-limited) trains again with twice the steps, up to S, and is
judged on the longer runs; deeper layer counts start again from the grid's budget.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pathbench.runners.training import store
from pathbench.runners.training.config import Run
from pathbench.runners.sweep.grid import Grid


class Schedule:
    """The runs a sweep has still to train, handed out as packs once they may start.

    A grid is a chain of steps: a plain grid is one step, all its runs; an --until-solved grid
    is a chain per model (per depth-free cell), one step per layer count, and a step starts
    once every run of the step before it has ended and the model has not solved the task
    there; once it has, the chain's deeper runs are dropped (unless another grid needs them).
    Chains wait for nothing else: not for other models, nor other grids, so that workers freed
    by one finish the work of another.

    The grids take turns: the next pack comes from the grid that has had the fewest so far, so
    that a sweep cut short has made progress on every experiment, not only on the one listed
    first or with the most work. Within a grid, the packs whose chains have the most layer
    counts still ahead go first (they are the longest paths through the sweep), then the
    longest runs.
    """

    def __init__(self, planned: list[tuple[Grid, list[Run]]], out: Path, drop,
                 dry_run: bool = False, add=lambda runs: None):
        self.out, self.dry_run = out, dry_run
        self.drop = drop  # called with the runs (not yet done) that a solved model never needs
        self.add = add  # called with the runs added to a depth whose seeds disagree
        # per grid number, the packs that may start: a heap of (priority, arrival, pack)
        self.ready: dict[int, list[tuple[tuple, int, list[Run]]]] = {}
        self.arrivals = itertools.count()  # equal priorities go in the order they came
        self.turns: dict[int, int] = {}  # grid number -> packs handed out
        # run id -> the chains waiting for it, for each run handed out and not ended (two
        # grids of one sweep may share runs; each is trained once)
        self.waiting: dict[str, list[_Chain]] = {}
        self.handed_out: set[str] = set()  # every run id ever queued
        # plain grids first: a run one of them needs is never dropped by a chain
        numbered = sorted(enumerate(planned), key=lambda item: item[1][0].until_solved)
        for number, (grid, runs) in numbered:
            self.turns[number] = 0
            if not grid.until_solved:
                self._advance(_Chain(grid, number, [runs]))
                continue
            cells: dict[str, dict[int, list[Run]]] = {}
            for run in runs:
                depths = cells.setdefault(run.cell_key(with_layers=False), {})
                depths.setdefault(run.model.layers, []).append(run)
            for depths in cells.values():
                self._advance(_Chain(grid, number, [depths[n] for n in sorted(depths)]))

    def next_pack(self) -> list[Run] | None:
        """The pack to train next, or None while none may start."""
        waiting = [number for number, packs in self.ready.items() if packs]
        if not waiting:
            return None
        # the grid with the fewest packs so far; in it, the first by priority, then arrival
        number = min(waiting, key=lambda n: (self.turns[n], self.ready[n][0][:2]))
        _, _, pack = heapq.heappop(self.ready[number])
        self.turns[number] += 1
        return pack

    def ended(self, name: str) -> None:
        """A run handed out has ended, with a record or without (its worker died)."""
        for chain in self.waiting.pop(name, []):
            chain.running.discard(name)
            if not chain.running:
                self._advance(chain)

    def _advance(self, chain: _Chain) -> None:
        """Hand out the chain's next step that has runs to do (first, more seeds or steps for
        the last one where the search extends it), or drop the rest if solved."""
        while chain.steps or chain.last is not None:
            if chain.last is not None and chain.grid.until_solved:
                verdict = self._verdict(chain.last, chain.grid)
                if verdict == "solved":
                    self.drop([run for step in chain.steps for run in step
                               if run.run_id not in self.handed_out
                               and not self._done(run)])
                    chain.steps = []
                    return
                new, judged = extension(chain.last, verdict, chain.grid)
                if new:
                    chain.last = judged
                    self.add([run for run in new if not self._done(run)])
                    if self._hand_out(chain, new):
                        return
                    continue
            if not chain.steps:
                return
            chain.last = step = chain.steps.pop(0)
            if self._hand_out(chain, step):
                return

    def _hand_out(self, chain: _Chain, step: list[Run]) -> bool:
        """Queue the runs of ``step`` not yet done; whether any is to wait for."""
        todo = [run for run in step if not self._done(run)]
        new = [run for run in todo if run.run_id not in self.waiting]
        self.handed_out.update(run.run_id for run in new)
        steps_ahead = len(chain.steps) + 1 if chain.grid.until_solved else 0
        for pack in in_packs(in_run_order(new), chain.grid.pack):
            heapq.heappush(self.ready.setdefault(chain.number, []),
                           ((-steps_ahead, *_run_order(pack[0])), next(self.arrivals), pack))
        chain.running = {run.run_id for run in todo}
        for name in chain.running:
            self.waiting.setdefault(name, []).append(chain)
        return bool(chain.running)

    def _done(self, run: dict) -> bool:
        return is_done(self.out / run.run_id, set_aside=not self.dry_run)

    def _verdict(self, step: list[Run], grid: Grid) -> str:
        """What val says of a depth's runs: "split" (some of the seeds at the picked learning
        rate solve and some do not: too few for two thirds, or two thirds while the grid's
        max_seeds allows more seeds; near the line either way), "solved" (two thirds of those
        seeds), "budget-limited" (not solved, with some of those runs still improving at their
        step cap), or "not solved"."""
        import pandas as pd  # only when asked

        from pathbench.runners.analysis.cells import aggregate
        from pathbench.runners.analysis.records import load_frame

        recorded = {run.run_id for run in step if self._done(run)}
        if not recorded:  # a dry run before any record, or every worker died
            return "not solved"
        table = aggregate(load_frame(self.out, recorded))
        rows = table[table["depth_free_cell"] == step[0].cell_key(with_layers=False)]
        if rows.empty:
            return "not solved"
        row = rows.iloc[0]
        disagree = 0 < row["val_solved_seeds"] < row["seeds"]
        if row["val_solved"] and not (disagree and grid.max_seeds
                                      and more_seeds(step, grid.max_seeds)):
            return "solved"
        if disagree:
            return "split"
        cut_short = pd.notna(row["budget_limited"]) and row["budget_limited"] > 0
        return "budget-limited" if cut_short else "not solved"


def extension(step: list[Run], verdict: str, grid: Grid) -> tuple[list[Run], list[Run]]:
    """The runs a depth search adds to a depth before it goes on, and the runs it then judges
    the depth on: more seeds where they disagree (max_seeds), the runs again with more steps
    where the budget cut them short (max_steps); none, and the step as it is, otherwise."""
    if verdict == "split" and grid.max_seeds:
        more = more_seeds(step, grid.max_seeds)
        return more, step + more
    if verdict == "budget-limited" and grid.max_steps:
        longer = longer_runs(step, grid.max_steps)
        return longer, longer
    return [], step


def longer_runs(step: list[Run], max_steps: int) -> list[Run]:
    """A depth's runs again with twice their steps, at most ``max_steps``; none if they have
    that many."""
    steps = min(2 * step[0].train.steps, max_steps)
    if steps <= step[0].train.steps:
        return []
    return [dataclasses.replace(run, train=dataclasses.replace(run.train, steps=steps))
            for run in step]


def more_seeds(step: list[Run], max_seeds: int) -> list[Run]:
    """The runs that bring a depth's step to ``max_seeds`` seeds: the next seed numbers, at
    every learning rate of the step; none if it has that many."""
    seeds = sorted({run.seed for run in step})
    templates = [run for run in step if run.seed == seeds[0]]
    return [dataclasses.replace(run, seed=seed) for seed in
            range(seeds[-1] + 1, seeds[-1] + 1 + max_seeds - len(seeds)) for run in templates]


@dataclass
class _Chain:
    grid: Grid
    number: int  # the grid's place in the sweep, for taking turns
    steps: list[list[Run]]  # the steps not yet handed out, in order
    last: list[Run] | None = None  # the step handed out (or found done) last
    running: set[str] = field(default_factory=set)  # its runs that have not ended


def in_run_order(runs: list[Run]) -> list[Run]:
    """Longest runs first, so that the last ones to finish are short; among equals, seed 0 of
    every configuration before any seed 1, so that a sweep cut short has every cell."""
    return sorted(runs, key=_run_order)


def _run_order(run: dict) -> tuple:
    return -run_cost(run), run.seed


# --pack auto: a GPU pack holds a whole cell (the runs that differ only in seed and learning
# rate), split into equal packs where its activations would pass PACK_MEMORY. A run's are
# estimated as ACTIVATION_BYTES per token, channel and layer (bf16 activations kept for the
# backward; `pathbench bench train` measures the real figure). On a CPU, packing gains nothing.
PACK_MEMORY = 16 * 2**30
ACTIVATION_BYTES = 96


def auto_pack_size(cell: list[Run]) -> int:
    """How many runs of ``cell`` (runs that differ only in seed and learning rate) train as one
    model under --pack auto."""
    run = cell[0]
    if run.device == "cpu":
        return 1
    length = run.task.length or 1
    per_run = (run.train.batch_size * length * run.model.d_model * run.model.layers
               * ACTIVATION_BYTES)
    packs = math.ceil(len(cell) / max(1, PACK_MEMORY // per_run))
    return math.ceil(len(cell) / packs)


def in_packs(runs: list[Run], size: int | None) -> list[list[Run]]:
    """Runs that differ only in seed and learning rate, grouped in packs of up to ``size``
    (None: `auto_pack_size`), in the order of each pack's first run."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.cell_key(), []).append(run)
    packs = []
    for group in groups.values():
        step = size or auto_pack_size(group)
        packs += [group[start : start + step] for start in range(0, len(group), step)]
    return packs


def run_cost(run: dict) -> int:
    """A rough measure of a run's work: tokens trained times layers times width."""
    train, model = run.train, run.model
    length = run.task.length or 1
    return train.steps * train.batch_size * length * model.layers * model.d_model


def is_done(run_dir: Path, set_aside: bool = True) -> bool:
    """store.is_done, with a corrupt record set aside (and the run redone); without
    ``set_aside`` (a dry run), the record is left as it is and only named."""
    try:
        return store.is_done(run_dir)
    except store.CorruptRecord as exc:
        if not set_aside:
            tqdm.write(f"{exc}; a sweep would set it aside and redo that run", file=sys.stderr)
            return False
        aside = store.set_aside_corrupt(run_dir)
        tqdm.write(f"{exc}\n  moved to {aside}; that run is redone", file=sys.stderr)
        return False
