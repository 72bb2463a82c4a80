"""The example outputs in the docs are what the code prints today: the main job's closing lines in
docs/usage.md, and the numbers of the CPU presets' table, which come from results/cpu_presets."""

from __future__ import annotations

import re
from pathlib import Path

from pathbench.runners.cli.run import summary_table
from pathbench.runners.training.config import DECISION_SPLIT, resolve_run
from pathbench.runners.training.loop import EvaluationSplit

ROOT = Path(__file__).parents[1]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def test_the_main_jobs_example_is_what_it_prints_for_a_model_without_error():
    """docs/usage.md shows `pathbench run flipflop --layers 1` on a CPU: its run id, steps, and
    the split table of a model that makes no error (what PaTH does on every seed), whose read
    counts come from the evaluation data."""
    status, *table = code_blocks((ROOT / "docs" / "usage.md").read_text())[0].splitlines()
    run = resolve_run("flipflop", options={"layers": 1}, device="cpu")
    assert re.fullmatch(rf"ok after {run.train.steps} steps in [0-9.]+ s: "
                        rf"results/runs/{run.run_id}", status), status
    task, metrics = run.task, {}
    for split in task.test_splits:
        data = EvaluationSplit(task, split, run.train.eval_sizes.get(split, run.train.eval_num))
        tally = None
        for chunk in data.chunks():  # a perfect model: its predictions are the targets
            more = task.tally(chunk.targets, chunk.targets, split)
            tally = more if tally is None else {k: tally[k] + more[k] for k in tally}
        metrics[split] = task.metrics_from(tally, split)
    assert DECISION_SPLIT not in metrics
    assert "\n".join(table) == summary_table({"metrics": metrics})


def results_table(folder: Path, *options: str) -> str:
    """What `pathbench results runs.tar.xz OPTIONS --format markdown` prints in ``folder``,
    after checking that the folder's tables.md is exactly that."""
    import subprocess
    import sys

    printed = subprocess.run(
        [sys.executable, "-m", "pathbench.runners.cli", "results", "runs.tar.xz", *options,
         "--format", "markdown"], cwd=folder, capture_output=True, text=True, check=True).stdout
    assert printed == (folder / "tables.md").read_text()
    return printed


def test_the_constructions_table_is_what_its_record_gives():
    tables = results_table(ROOT / "results" / "constructions", "--metric", "error")
    readme = (ROOT / "results" / "constructions" / "README.md").read_text()
    row = next(line for line in tables.splitlines() if line.startswith("| path_construction"))
    assert row.split(" | ")[-5:] == [
        line for line in readme.splitlines() if line.startswith("| path_construction")
    ][0].split(" | ")[-5:]


def test_the_cpu_presets_table_is_what_its_records_give():
    """results/cpu_presets/tables.md is `pathbench results` of its archive, and every
    "mean ± sd" that docs/usage.md's CPU table and the folder's README quote is in it."""
    folder = ROOT / "results" / "cpu_presets"
    tables = results_table(folder)
    quoted = re.findall(r"\d\.\d+ ± \d\.\d+(?:e-\d+)?", (ROOT / "docs" / "usage.md").read_text()
                        + (folder / "README.md").read_text())
    assert len(quoted) >= 12
    for value in quoted:
        assert value in tables, value
