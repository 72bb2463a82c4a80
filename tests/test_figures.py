"""`pathbench plot`'s panels from made-up records: depth against length, heads x layers
heatmaps, baselines, every seed drawn, and no line through a cell that did not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathbench.runners import store
from pathbench.runners.config import resolve_run, run_id
from pathbench.runners.figures import draw, plan_panels
from pathbench.runners.report import load_frame


def _record(config, val, test, baselines=None):
    return {"run_id": run_id(config), "status": "ok", "reason": None, "steps": 1,
            "primary_metric": "accuracy", "solved_threshold": 0.9,
            "validation": {"accuracy": val}, "metrics": {"test": {"accuracy": test}},
            "baselines": {"test": baselines or {}}, "config": config,
            "provenance": {"wall_time_s": 0.1}}


def _write(out, task, model, layers, seed, val, test, sets=(), heads=None, baselines=None):
    parsed = {"task": {}, "model": {}, "train": {"steps": "500"}}
    for item in sets:
        key, value = item.split("=")
        section, name = key.split(".")
        parsed[section][name] = value
    config = resolve_run(task, options={"model": model, "layers": layers, "heads": heads},
                         sets=parsed, seed=seed)
    store.write_json_atomic(out / run_id(config) / "result.json",
                            _record(config, val, test, baselines))
    return config


@pytest.fixture
def word_problem_runs(tmp_path):
    """a5 at lengths 8 and 16: path solves 8 at 1 layer and 16 at 2; rope solves 8 at 2 and not
    16 within 3 layers. rope at 16 has no 2-layer runs (a cell that did not run)."""
    for length in (8, 16):
        for model in ("path", "rope"):
            for layers in (1, 2, 3):
                if model == "rope" and length == 16 and layers == 2:
                    continue
                need = {("path", 8): 1, ("path", 16): 2, ("rope", 8): 2}.get((model, length), 9)
                for seed in range(3):
                    accuracy = 0.95 if layers >= need else 0.3
                    _write(tmp_path, "a5", model, layers, seed, accuracy, accuracy - 0.01 * seed,
                           sets=[f"task.length={length}"],
                           baselines={"chance": 1 / 60})
    return tmp_path


def test_word_problems_get_depth_against_length_and_accuracy_at_the_longest(word_problem_runs,
                                                                           tmp_path):
    panels = plan_panels(load_frame(word_problem_runs))
    assert [panel["kind"] for panel in panels] == ["depth_vs_length", "lines"]
    assert panels[1]["title"] == "a5 (length 16, 500 steps)"
    _, tables = draw(load_frame(word_problem_runs), tmp_path / "figure" / "a5")
    assert "| path | 1 | 2 |" in tables  # minimum layers at length 8 and 16
    assert "| rope | 2 | >3 |" in tables
    # at length 16, rope's 2-layer cell did not run: its row has no value there
    assert "| rope | 0.290 ± 0.01 |  | 0.290 ± 0.01 |" in tables
    assert "| baseline: chance | 0.017 | 0.017 | 0.017 |" in tables
    assert (tmp_path / "figure" / "a5.png").stat().st_size > 0


def test_heads_and_layers_get_a_heatmap_per_model(tmp_path):
    for model in ("path", "rope"):
        for layers in (1, 2):
            for heads in (1, 2):
                _write(tmp_path, "flipflop", model, layers, 0, 0.5 + 0.1 * layers * heads, 0.5,
                       heads=heads, sets=["task.length=32"])
    panels = plan_panels(load_frame(tmp_path))
    assert [(p["kind"], p["title"]) for p in panels] == [
        ("heatmap", "flipflop (length 32, 500 steps): rope"),  # the registry's order
        ("heatmap", "flipflop (length 32, 500 steps): path")]
    _, tables = draw(load_frame(tmp_path), tmp_path / "heads")
    assert "over layers x heads" in tables


def test_mqrar_panels_draw_baselines_that_vary_with_n(tmp_path):
    for n_back in (1, 2):
        for seed in range(2):
            _write(tmp_path, "mqrar", "path", 2, seed, 0.9, 0.8,
                   sets=[f"task.n_back={n_back}", "task.length=64", "task.num_keys=4"],
                   baselines={"chance": 1 / 8, "latest_assignment": 1.0 if n_back == 1 else 0.13})
    _, tables = draw(load_frame(tmp_path), tmp_path / "mqrar")
    assert "| baseline: latest assignment | 1.000 | 0.130 |" in tables
    assert "| baseline: chance | 0.125 | 0.125 |" in tables
    assert "Learning rate picked on val" in tables


def test_results_gives_minimum_depth_per_length_and_baselines(word_problem_runs, capsys):
    from pathbench.runners.cli import main

    main(["results", str(word_problem_runs)])
    out = capsys.readouterr().out
    assert "a5: minimum layers to solve (two thirds of the seeds at >= 0.9 on test" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["rope", "4", "2", ">3"] in lines and ["path", "4", "1", "2"] in lines
    assert "chance (test)" in out and "learning rate picked on val" in out


def test_no_empty_panel_for_a_task_without_the_metric(tmp_path):
    """Flip-flop's error column in the same frame does not give MQRAR an empty error panel."""
    _write(tmp_path, "flipflop", "path", 1, 0, 0.9, 0.9, sets=["task.length=16"])
    record = next(tmp_path.glob("flipflop*/result.json"))
    data = __import__("json").loads(record.read_text())
    data["metrics"]["test"]["error"] = 10.0
    store.write_json_atomic(record, data)
    _write(tmp_path, "mqrar", "path", 2, 0, 0.9, 0.8, sets=["task.length=64", "task.num_keys=4"])
    frame = load_frame(tmp_path)
    _, tables = draw(frame[frame["task"] == "mqrar"], tmp_path / "mqrar")
    assert "accuracy per split" in tables and "nan" not in tables


def _write_metrics(out, task, model, layers, seed, val, metrics, sets=()):
    """A record whose test splits are given in full: {split: {metric: value}}."""
    config = _write(out, task, model, layers, seed, val, 0.0, sets=sets)
    path = out / run_id(config) / "result.json"
    data = __import__("json").loads(path.read_text())
    data["metrics"] = metrics
    store.write_json_atomic(path, data)


def test_longer_tests_get_metric_against_evaluation_length(tmp_path):
    """Word problems trained at 4 and 8, tested at twice that: each model at the fewest layers
    that solved its training length; eval_lengths, which varies with length, splits no panel."""
    for length in (4, 8):
        for layers in (1, 2):
            for seed in range(3):
                solved = layers == 2 or length == 4
                accuracy = 0.95 if solved else 0.4
                _write_metrics(tmp_path, "a5", "path", layers, seed, accuracy, {
                    "test": {"accuracy": accuracy - 0.01 * seed},
                    f"test_{2 * length}": {"accuracy": accuracy / 2 + 0.01 * (layers - seed)}},
                    sets=[f"task.length={length}", f"task.eval_lengths={2 * length}"])
    panels = plan_panels(load_frame(tmp_path))
    assert [panel["kind"] for panel in panels] == ["depth_vs_length", "lines", "generalisation"]
    _, tables = draw(load_frame(tmp_path), tmp_path / "a5")
    assert "accuracy against evaluation length" in tables
    assert "| path | 4 | 4 | 1 | 0.94 ± 0.01 | 0.475 ± 0.01 |  |" in tables
    assert "| path | 4 | 8 | 2 |  | 0.94 ± 0.01 | 0.485 ± 0.01 |" in tables


def test_flipflop_longer_tests_show_the_error(tmp_path):
    for model, error in (("rope", [30.0, 40.0, 45.0]), ("path", [0.0, 0.0, 1.0])):
        _write_metrics(tmp_path, "flipflop", model, 1, 0, 0.9, {
            split: {"accuracy": 1 - e / 100, "error": e}
            for split, e in zip(("test", "test_64", "test_256"), error)},
            sets=["task.length=32", "task.eval_lengths=64,256"])
    panels = plan_panels(load_frame(tmp_path))
    assert [panel["kind"] for panel in panels] == ["bars", "generalisation"]
    _, tables = draw(load_frame(tmp_path), tmp_path / "flipflop")
    assert "error (%) against evaluation length" in tables
    assert "| rope | 2 | 32 | 1 | 30 | 40 | 45 |" in tables


def test_a_records_table_gives_the_same_tables_and_figures(word_problem_runs, tmp_path, capsys):
    """`results --format records` writes every run's row; `results` and `plot` read it back
    in place of the records and give the same tables."""
    from pathbench.runners.cli import main

    main(["results", str(word_problem_runs), "--format", "records"])
    table = tmp_path / "runs.csv"
    table.write_text(capsys.readouterr().out)
    assert len(table.read_text().splitlines()) == 1 + len(list(word_problem_runs.glob("*/result.json")))
    outputs = []
    for number, source in enumerate((word_problem_runs, table)):
        main(["results", str(source), "--format", "markdown"])
        main(["plot", str(source), "-o", str(tmp_path / f"figure{number}" / "a5")])
        outputs.append([line for line in capsys.readouterr().out.splitlines()
                        if not line.startswith("wrote")])
    assert outputs[0] == outputs[1]
    assert (tmp_path / "figure1" / "a5.md").read_text() == (
        tmp_path / "figure0" / "a5.md").read_text()
    assert "| path | 1 | 2 |" in outputs[1]


COMMITTED = Path(__file__).parent / "data"


def test_a_committed_records_table_regenerates_its_figure(tmp_path, capsys):
    """tests/data/a5_runs.csv gives the committed tables of its figure, tests/data/a5_runs.md.

    The table holds H200 records of the paper sweep (`pathbench results DIR --task a5 --format
    records`): PaTH's and RoPE's runs at lengths 4 and 8, without the columns that are empty
    there and without run_dir. a5_runs.md is `pathbench plot tests/data/a5_runs.csv -o
    tests/data/a5_runs`'s."""
    from pathbench.runners.cli import main

    main(["plot", str(COMMITTED / "a5_runs.csv"), "-o", str(tmp_path / "a5_runs")])
    assert (tmp_path / "a5_runs.md").read_text() == (COMMITTED / "a5_runs.md").read_text()
    assert (tmp_path / "a5_runs.png").stat().st_size > 0


def test_results_paper_is_what_its_records_give(tmp_path):
    """results/paper/regenerate.sh, run into an empty folder, writes the committed runs.csv
    (from runs.tar.xz) and every committed table (from runs.csv) byte for byte, and its
    figures."""
    import os
    import subprocess
    import sys

    paper = Path(__file__).parents[1] / "results" / "paper"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(paper / "regenerate.sh"), str(tmp_path)], env=env, check=True)
    committed = sorted(p.name for p in paper.iterdir() if p.suffix in (".csv", ".md", ".png")
                       and p.name != "README.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        if name.endswith(".png"):  # PNG bytes vary with matplotlib's version
            assert (tmp_path / name).stat().st_size > 0
        else:
            assert (tmp_path / name).read_text() == (paper / name).read_text(), name
