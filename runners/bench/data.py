"""`pathbench bench data`: how long each task takes to generate a dataset, on one CPU core.

The generators are plain numpy; the process is pinned to a single core (where the operating
system allows it) so the numbers do not depend on the machine's core count. Each task is timed
``--repeat`` times with its default configuration and the fastest run is reported. The
requirement it checks by eye: 100,000 flipflop sequences of length 512 in under 10 seconds.
"""

from __future__ import annotations

import os
import time


from pathbench.tasks import TASKS, make_task


def bench_data(num, task_names, repeat, echo=print):
    """Print a table of dataset generation times (train split, default configs)."""
    names = task_names or [n for n, entry in TASKS.entries().items() if entry.origin == "built-in"]
    tasks = [make_task(name) for name in names]  # unknown names fail before any timing
    cores = _pin_to_one_core()
    echo(f"{num:,} sequences per task, best of {repeat}, {cores}")
    header = f"{'task':<10} {'length':>7} {'seconds':>8} {'sequences/s':>12} {'Mtokens/s':>10}"
    echo(header)
    echo("-" * len(header))
    for task in tasks:
        times = []
        for run in range(repeat):
            start = time.perf_counter()
            dataset = task.generate(num, seed=run, split="train")
            times.append(time.perf_counter() - start)
            length = dataset.inputs.shape[1]
            del dataset  # free the arrays before the next run allocates its own
        best = min(times)
        echo(
            f"{task.name:<10} {length:>7} {best:>8.2f} {num / best:>12,.0f} "
            f"{num * length / best / 1e6:>10.1f}"
        )


def _pin_to_one_core() -> str:
    """Restrict this process to one CPU core; returns a note for the table's header."""
    if not hasattr(os, "sched_setaffinity"):
        return "all cores (this system cannot pin a process to one core)"
    core = min(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {core})
    except OSError as exc:
        return f"all cores (pinning to one core failed: {exc.strerror or exc})"
    return f"pinned to CPU core {core}"
