"""`pathbench plot`'s panels from made-up records: depth against length, heads x layers
heatmaps, baselines, every seed drawn, and no line through a cell that did not run. Each test
reads what the figure shows (its lines' points, bars' heights, heatmaps' values), not only its
tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import BarContainer

from pathbench.runners.training import store
from pathbench.runners.training.config import resolve_run
from pathbench.runners.analysis.figures import draw, plan_panels, render
from pathbench.runners.analysis.records import load_frame


def shown(figure) -> dict[str, dict]:
    """What each panel of a figure shows, by panel title: each labelled line's points (y None
    where the line breaks; a second line of the same label as "LABEL #2"), each labelled set of
    bars' heights, and a heatmap's values (rows bottom up, None where blank); a second panel of
    the same title as "TITLE #2"."""
    def number(value):
        return None if math.isnan(value) else round(float(value), 6)

    panels = {}
    for ax in figure.axes:
        if not ax.get_visible() or not ax.get_title():  # hidden, or a colour bar
            continue
        panel = {}
        for line in ax.get_lines():
            label = line.get_label()
            if not label.startswith("_") and len(line.get_xydata()):  # a legend's own entry
                name = next(f"{label} #{n}" if n > 1 else label for n in range(1, 99)
                            if (f"{label} #{n}" if n > 1 else label) not in panel)
                panel[name] = [(number(x), number(y)) for x, y in line.get_xydata()]
        for bars in ax.containers:
            if isinstance(bars, BarContainer):
                panel[bars.get_label()] = [number(bar.get_height()) for bar in bars]
        if ax.images:
            values = ax.images[0].get_array()
            blank = np.ma.getmaskarray(values) | np.isnan(values.filled(np.nan))
            panel["heatmap"] = [[None if blank[i, j] else number(values[i, j])
                                 for j in range(values.shape[1])]
                                for i in range(values.shape[0])]
        title = ax.get_title()
        panels[title + (f" #{sum(t.startswith(title) for t in panels) + 1}" if title in panels
                        else "")] = panel
    return panels


def _record(config, val, test, baselines=None):
    from pathbench.tasks import TASKS

    return {"run_id": config.run_id, "status": "ok", "reason": None, "steps": 1,
            "primary_metric": "accuracy",
            "solved_threshold": TASKS.get(config.config["task"]["name"]).solved_threshold,
            "validation": {"accuracy": val}, "metrics": {"test": {"accuracy": test}},
            "baselines": {"test": baselines or {}}, "config": config.config,
            "provenance": {"wall_time_s": 0.1}}


def _write(out, task, model, layers, seed, val, test, sets=(), heads=None, baselines=None):
    parsed = {"task": {}, "model": {}, "train": {"steps": "500"}}
    for item in sets:
        key, value = item.split("=")
        section, name = key.split(".")
        parsed[section][name] = value
    config = resolve_run(task, options={"model": model, "layers": layers, "heads": heads},
                         sets=parsed, seed=seed)
    store.write_json_atomic(out / config.run_id / "result.json",
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
    written, tables = draw(load_frame(word_problem_runs), tmp_path / "figure" / "a5")
    assert [path.name for path in written] == ["a5.png", "a5.pdf", "a5.md"]
    assert "| path | 1 (1) | 2 (2) |" in tables  # minimum layers at length 8 and 16
    assert "| rope | 2 (2) | >3 (>3) |" in tables
    # at length 16, rope's 2-layer cell did not run: its row has no value there
    assert ("| rope | 0.290 ± 0.01; 0/3 solved [0.00, 0.56] |  | "
            "0.290 ± 0.01; 0/3 solved [0.00, 0.56] |") in tables
    # beside each mean, the seeds that solved and the 95% Wilson interval of that rate
    assert "| path | 0.290 ± 0.01; 0/3 solved [0.00, 0.56] | 0.940 ± 0.01; 3/3 solved " \
           "[0.44, 1.00] |" in tables
    assert "| baseline: chance | 0.017 | 0.017 | 0.017 |" in tables

    figure = render(load_frame(word_problem_runs))[0]
    depth, lines = shown(figure).values()
    # models are drawn a little apart along x, each on its integer layer count; rope solves no
    # length-16 cell: no point on its line, an open triangle above its deepest, 3
    assert {model: [(round(x), y) for x, y in points]
            for model, points in depth.items()} == {"path": [(8, 1), (16, 2)],
                                                    "rope": [(8, 2), (16, None)]}
    assert depth["path"][0][0] != depth["rope"][0][0]
    [triangle] = [collection.get_offsets().tolist() for collection in figure.axes[0].collections
                  if len(collection.get_offsets())]
    assert [(round(x), y) for x, y in triangle] == [(16, 3.5)]
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "open triangle at N + 1/2: not solved up to N layers" in legend
    assert lines["path"] == [(1, 0.29), (2, 0.94), (3, 0.94)]
    assert lines["rope"] == [(1, 0.29), (2, None), (3, 0.29)]  # broken where no run was
    assert {y for _, y in lines["chance"]} == {round(1 / 60, 6)}
    assert {y for _, y in lines["solved (90%)"]} == {0.9}


def test_a_depth_solved_above_an_unresolved_one_is_drawn_with_a_triangle_below(
        word_problem_runs, tmp_path):
    """path's one-layer seeds at length 16 were still improving at their step cap: its reading
    there is "≤2?", drawn at 2 with an open triangle pointing down at 1.5; length 8 stays 1."""
    for folder in word_problem_runs.iterdir():
        record = json.loads((folder / "result.json").read_text())
        model, task = record["config"]["model"], record["config"]["task"]["config"]
        if (model["attention"], model["layers"], task["length"]) == ("path", 1, 16):
            record["budget_limited"] = True
            store.write_json_atomic(folder / "result.json", record)
    _, tables = draw(load_frame(word_problem_runs), tmp_path / "figure" / "a5")
    assert "| path | 1 (1) | ≤2? (≤2?) |" in tables
    figure = render(load_frame(word_problem_runs))[0]
    depth = next(iter(shown(figure).values()))
    assert [(round(x), y) for x, y in depth["path"]] == [(8, 1), (16, 2)]
    def apex(collection):  # which way a triangle marker points: 1 "^", -1 "v"
        x, y = min(collection.get_paths()[0].vertices, key=lambda vertex: abs(vertex[0]))
        return int(np.sign(y))

    triangles = {apex(c): [(round(x), y) for x, y in c.get_offsets().tolist()]
                 for c in figure.axes[0].collections if len(c.get_offsets())}
    assert triangles == {1: [(16, 3.5)], -1: [(16, 1.5)]}  # rope: >3 at 16; path: ≤2? at 16
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "open triangle at N - 1/2: solved with N, fewer unresolved" in legend


def test_a_length_a_model_did_not_run_is_blank_in_the_depth_table(word_problem_runs, tmp_path):
    for seed in range(3):  # nope runs at length 8 alone
        _write(word_problem_runs, "a5", "nope", 1, seed, 0.3, 0.3, sets=["task.length=8"])
    _, tables = draw(load_frame(word_problem_runs), tmp_path / "figure" / "a5")
    assert "| nope | >1 (>1) |  |" in tables


def test_heads_and_layers_get_a_heatmap_per_model(tmp_path):
    for model in ("path", "rope"):
        for layers in (1, 2):
            for heads in (1, 2):
                _write(tmp_path, "flipflop", model, layers, 0, 0.5, 0.1 * layers * heads + (
                    0.05 if model == "path" else 0), heads=heads, sets=["task.length=32"])
    panels = plan_panels(load_frame(tmp_path))
    assert [(p["kind"], p["title"]) for p in panels] == [
        ("heatmap", "flipflop (length 32, 500 steps): rope"),  # the registry's order
        ("heatmap", "flipflop (length 32, 500 steps): path")]
    figure, tables = render(load_frame(tmp_path))
    assert "accuracy (test) over layers x heads" in tables  # flip-flop has no threshold
    rope, path = shown(figure).values()
    assert rope["heatmap"] == [[0.1, 0.2], [0.2, 0.4]]  # heads 1, 2 (rows) x layers 1, 2
    assert path["heatmap"] == [[0.15, 0.25], [0.25, 0.45]]


def test_a_heatmap_of_a_task_with_a_threshold_shows_solve_rates(tmp_path):
    """A5 (solved at 0.9): a cell's colour is the share of its seeds that solve it on test, its
    label k/n; a cell that did not run stays blank."""
    solving = {(1, 1): 0, (1, 2): 1, (2, 1): 2, (2, 2): 3}  # (layers, heads) -> seeds >= 0.9
    for (layers, heads), count in solving.items():
        if (layers, heads) == (1, 2):
            continue  # did not run
        for seed in range(3):
            accuracy = 0.95 if seed < count else 0.5
            _write(tmp_path, "a5", "path", layers, seed, accuracy, accuracy, heads=heads,
                   sets=["task.length=16"])
    figure, tables = render(load_frame(tmp_path))
    [panel] = shown(figure).values()
    assert panel["heatmap"] == [[0.0, round(2 / 3, 6)], [None, 1.0]]  # rows: heads 1, 2
    labels = sorted(text.get_text() for text in figure.axes[0].texts)
    assert labels == ["0/3", "2/3", "3/3"]
    assert "solve rate over layers x heads (seeds at accuracy >= 0.9 on test)" in tables
    assert "| 1 | 0.500 ± 0; 0/3 solved [0.00, 0.56] | 0.800 ± 0.26; 2/3 solved" in tables
    assert "| 2 |  | 0.950 ± 0; 3/3 solved [0.44, 1.00] |" in tables


def test_mqrar_panels_draw_baselines_that_vary_with_n(tmp_path):
    for n_back in (1, 2):
        for seed in range(2):
            _write(tmp_path, "mqrar", "path", 2, seed, 0.9, 0.8,
                   sets=[f"task.n_back={n_back}", "task.length=64", "task.num_keys=4"],
                   baselines={"chance": 1 / 8, "latest_assignment": 1.0 if n_back == 1 else 0.13})
    figure, tables = render(load_frame(tmp_path))
    assert "| baseline: latest assignment | 1.000 | 0.130 |" in tables
    assert "| baseline: chance | 0.125 | 0.125 |" in tables
    assert "Learning rate picked on val" in tables
    [panel] = shown(figure).values()
    assert panel["path"] == [(1, 0.8), (2, 0.8)]
    assert panel["latest assignment"] == [(1, 1.0), (2, 0.13)]  # drawn over n_back
    assert {y for _, y in panel["chance"]} == {0.125}


def test_results_gives_minimum_depth_per_length_and_baselines(word_problem_runs, capsys):
    from pathbench.runners.cli import main

    main(["results", str(word_problem_runs)])
    out = capsys.readouterr().out
    assert "a5 (500 steps): minimum layers to solve: two thirds of the seeds at >= 0.9 on " \
           "test" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["rope", "4", "2", "(2)", ">3", "(>3)"] in lines
    assert ["path", "4", "1", "(1)", "2", "(2)"] in lines
    assert "chance (test)" in out and "learning rate picked on val" in out


def test_results_keeps_a_setting_that_varies_at_one_length_only(word_problem_runs, capsys):
    """The generator framing at length 16 beside elements at 8 and 16: `task.words` varies
    among the runs of length 16 alone, and each framing gets its own row of minimum depths."""
    from pathbench.runners.cli import main

    for model in ("path", "rope"):
        for layers in (1, 2):
            for seed in range(3):
                accuracy = 0.95 if (model, layers) == ("path", 2) else 0.3
                _write(word_problem_runs, "a5", model, layers, seed, accuracy, accuracy,
                       sets=["task.length=16", "task.words=generators"])
    main(["results", str(word_problem_runs)])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["path", "4", "elements", "1", "(1)", "2", "(2)"] in lines
    assert ["path", "4", "generators", "2", "(2)"] in lines  # no runs at length 8: no cell
    assert ["rope", "4", "generators", ">2", "(>2)"] in lines


def test_no_empty_panel_for_a_task_without_the_metric(tmp_path):
    """Flip-flop's error column in the same frame does not give MQRAR an empty error panel."""
    _write(tmp_path, "flipflop", "path", 1, 0, 0.9, 0.9, sets=["task.length=16"])
    record = next(tmp_path.glob("flipflop*/result.json"))
    data = __import__("json").loads(record.read_text())
    data["metrics"]["test"]["error"] = 10.0
    store.write_json_atomic(record, data)
    _write(tmp_path, "mqrar", "path", 2, 0, 0.9, 0.8, sets=["task.length=64", "task.num_keys=4"])
    frame = load_frame(tmp_path)
    figure, tables = render(frame[frame["task"] == "mqrar"])
    assert "accuracy per split" in tables and "nan" not in tables
    assert shown(figure) == {"mqrar (length 64, 500 steps)": {"path": [0.8]}}  # one bar


def _write_metrics(out, task, model, layers, seed, val, metrics, sets=()):
    """A record whose test splits are given in full: {split: {metric: value}}."""
    config = _write(out, task, model, layers, seed, val, 0.0, sets=sets)
    path = out / config.run_id / "result.json"
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
    figure, tables = render(load_frame(tmp_path))
    assert "accuracy against evaluation length" in tables
    assert "| path | 4 | 4 | 1 | 0.94 ± 0.01 | 0.475 ± 0.01 |  |" in tables
    assert "| path | 4 | 8 | 2 |  | 0.94 ± 0.01 | 0.485 ± 0.01 |" in tables
    longer = shown(figure)["a5 (500 steps), longer tests"]
    # a line per training length, at the fewest layers that solved it (1 at 4, 2 at 8)
    assert longer == {"path": [(4, 0.94), (8, 0.475)], "path #2": [(8, 0.94), (16, 0.485)]}
    # each segment's training length is marked by a square, which the legend explains
    ax = next(ax for ax in figure.axes if ax.get_title().endswith("longer tests"))
    squares = sorted(tuple(line.get_xydata()[0]) for line in ax.get_lines()
                     if line.get_marker() == "s" and len(line.get_xydata()))
    assert squares == [(4, 0.94), (8, 0.94)]
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "square: the length a segment's runs trained at" in legend


def test_flipflop_longer_tests_show_the_error(tmp_path):
    for model, error in (("rope", [30.0, 40.0, 45.0]), ("path", [0.0, 0.0, 1.0])):
        _write_metrics(tmp_path, "flipflop", model, 1, 0, 0.9, {
            split: {"accuracy": 1 - e / 100, "error": e}
            for split, e in zip(("test", "test_64", "test_256"), error)},
            sets=["task.length=32", "task.eval_lengths=64,256"])
    panels = plan_panels(load_frame(tmp_path))
    assert [panel["kind"] for panel in panels] == ["bars", "generalisation"]
    figure, tables = render(load_frame(tmp_path))
    assert "error (%) against evaluation length" in tables
    assert "| rope | 2 | 32 | 1 | 30 | 40 | 45 |" in tables
    bars, longer = shown(figure).values()
    assert bars == {"rope": [30, 40, 45], "path": [0, 0, 1]}  # test, test_64, test_256
    # the models sit a little apart along x (a log axis here), so that neither hides the other
    assert {model: [y for _, y in points] for model, points in longer.items()} == {
        "rope": [30, 40, 45], "path": [0, 0, 1]}
    for model, sign in (("rope", -1), ("path", 1)):
        assert [x for x, _ in longer[model]] == pytest.approx(
            [n * 2 ** (sign / 40) for n in (32, 64, 256)])


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
    assert "| path | 1 (1) | 2 (2) |" in outputs[1]
    drawn = [shown(render(load_frame(source))[0]) for source in (word_problem_runs, table)]
    assert drawn[0] == drawn[1] and drawn[0]["a5 (500 steps)"]["path"] == [(8.2, 1), (16.2, 2)]


COMMITTED = Path(__file__).parent / "data"


def test_drift_a_committed_records_table_still_gives_its_figure(tmp_path, capsys):
    """A snapshot, against drift: tests/data/a5_runs.csv gives the committed tables of its
    figure, tests/data/a5_runs.md, and the figure draws the minimum depths that table holds.

    The table holds H200 records of the paper sweep (`pathbench results DIR --task a5 --format
    records`): PaTH's and RoPE's runs at lengths 4 and 8, without the columns that are empty
    there and without run_dir. a5_runs.md is `pathbench plot tests/data/a5_runs.csv -o
    tests/data/a5_runs`'s."""
    from pathbench.runners.cli import main

    main(["plot", str(COMMITTED / "a5_runs.csv"), "-o", str(tmp_path / "a5_runs")])
    tables = (COMMITTED / "a5_runs.md").read_text()
    assert (tmp_path / "a5_runs.md").read_text() == tables
    depth = next(iter(shown(render(load_frame(COMMITTED / "a5_runs.csv"))[0]).values()))
    for model, points in depth.items():  # the drawn depths are the table's, in order
        row = next(line for line in tables.splitlines() if line.startswith(f"| {model} |"))
        cells = [cell.split()[0].lstrip("≤").rstrip("?")  # "2 (1)", "≤2? (1)": 2
                 for cell in row.strip("|").split("|")[1:]]
        assert [str(round(y)) if y is not None else None for _, y in points] == [
            cell if cell.isdigit() else None for cell in cells]


@pytest.mark.parametrize("experiment", ["paper", "families"])
def test_drift_results_are_still_what_their_records_give(tmp_path, experiment):
    """A snapshot, against drift: results/EXPERIMENT/regenerate.sh, run into an empty folder,
    writes the committed runs.csv (from runs.tar.xz) and every committed table (from runs.csv)
    byte for byte, and its figures."""
    import os
    import subprocess
    import sys

    folder = Path(__file__).parents[1] / "results" / experiment
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(folder / "regenerate.sh"), str(tmp_path)], env=env, check=True)
    committed = sorted(p.name for p in folder.iterdir() if p.suffix in (".csv", ".md", ".png")
                       and p.name != "README.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        if name.endswith(".png"):  # PNG bytes vary with matplotlib's version
            assert (tmp_path / name).stat().st_size > 0
        else:
            assert (tmp_path / name).read_text() == (folder / name).read_text(), name


def test_a_model_has_its_colour_by_name_and_no_two_models_share_one():
    from pathbench.runners.analysis.figures import MODEL_COLOURS, colour

    builtins = list(MODEL_COLOURS)
    others = [f"plugin{i}" for i in range(20)]
    for models in (builtins + others, others[::-1] + builtins[::-1]):
        colours = [colour(model, models) for model in models]
        assert len(set(colours)) == len(models)  # an eighth, or a twentieth, model too
        assert {m: colour(m, models) for m in builtins} == MODEL_COLOURS  # by name, any order


def test_the_solved_length_against_depth_from_runs_at_one_length(tmp_path):
    """A5 at length 16: path solves the first 4, 10 and 16 positions at 1, 2 and 3 layers (mean
    of seeds 3, 4, 5 and so on), rope 2, 4, 6."""
    for model, per_layer in (("path", [4, 10, 16]), ("rope", [2, 4, 6])):
        for layers, solved in enumerate(per_layer, 1):
            for seed in range(3):
                _write_metrics(tmp_path, "a5", model, layers, seed, 0.5, {"test": {
                    "accuracy": 0.5, "solved_length": solved - 1 + seed}},
                    sets=["task.length=16"])
    panels = plan_panels(load_frame(tmp_path))
    assert [(p["kind"], p.get("metric")) for p in panels] == [("lines", None),
                                                             ("lines", "solved_length")]
    figure, tables = render(load_frame(tmp_path))
    assert "solved_length (test) against layers" in tables
    solved = shown(figure)["a5 (length 16, 500 steps) #2"]  # after accuracy against layers
    assert solved["path"] == [(1, 4), (2, 10), (3, 16)] and solved["rope"] == [(1, 2), (2, 4),
                                                                                (3, 6)]


def test_minimum_depth_never_mixes_step_budgets_and_one_cell_names_its_length_and_steps(
        tmp_path, capsys):
    """path solves at 1 layer with 2,000 steps, at 2 with 500: two rows, a steps column."""
    from pathbench.runners.cli import main

    for steps, need in ((500, 2), (2000, 1)):
        for layers in (1, 2):
            for seed in range(3):
                accuracy = 0.95 if layers >= need else 0.3
                config = _write(tmp_path, "a5", "path", layers, seed, accuracy, accuracy,
                                sets=["task.length=8", f"train.steps={steps}"])
    main(["results", str(tmp_path)])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["path", "4", "500", "2", "(2)"] in lines
    assert ["path", "4", "2000", "1", "(1)"] in lines
    main(["results", str(tmp_path / config.run_id)])
    assert capsys.readouterr().out.startswith("a5 (length 8, 2,000 steps):\n")


def test_word_problems_show_the_last_position_and_the_honest_floor(tmp_path, capsys):
    """Beside accuracy: the final position's accuracy (table and a panel against depth, with
    chance), and the floor of a model that only copies the first position."""
    from pathbench.runners.cli import main

    floor = (1 + 7 / 60) / 8
    for layers, last in ((1, 0.02), (2, 0.9)):
        for seed in range(2):
            config = _write(tmp_path, "a5", "path", layers, seed, 0.5, 0.5,
                            sets=["task.length=8"],
                            baselines={"chance": 1 / 60, "copy_first": floor})
            record = tmp_path / config.run_id / "result.json"
            data = __import__("json").loads(record.read_text())
            data["metrics"]["test"]["last_accuracy"] = last + 0.02 * seed
            store.write_json_atomic(record, data)
    main(["results", str(tmp_path)])
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    assert "copy first (test)" in header
    assert header.index(" test ") < header.index("last accuracy (test)")
    assert "0.03 ± 0.014" in out and "0.91 ± 0.014" in out
    panels = shown(render(load_frame(tmp_path))[0])
    accuracy, last = panels.values()
    assert accuracy["copy first"] == [(0, round(floor, 6)), (1, round(floor, 6))]
    assert last["path"] == [(1, 0.03), (2, 0.91)]
    assert {y for _, y in last["chance"]} == {round(1 / 60, 6)}
    assert "copy first" not in last  # the floor of accuracy, not of the last position


def legend_text_boxes(figure) -> list[tuple]:
    """(label, box on the canvas) of each entry of the figure's one legend, once laid out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # lays the figure out
    renderer = canvas.get_renderer()
    [legend] = figure.legends
    return [(text.get_text(), text.get_window_extent(renderer)) for text in legend.get_texts()]


def test_every_legend_entry_lies_inside_the_figure():
    """Six models, the baselines and the line styles' notes make a legend wider than a row of
    three panels: it takes more rows rather than running off both edges."""
    import tempfile

    models = ("nope", "rope", "sba", "fox", "path", "path_fox")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for length in (8, 16):
            for model in models:
                for layers in (1, 2):
                    _write(out, "a5", model, layers, 0, 0.95, 0.95 if layers == 2 else 0.3,
                           sets=[f"task.length={length}", f"task.eval_lengths={2 * length}"],
                           baselines={"chance": 1 / 60})
        figure, _ = render(load_frame(out))
    entries = legend_text_boxes(figure)
    labels = [label for label, _ in entries]
    assert set(models) <= set(labels) and len(labels) >= 10
    for label, box in entries:
        assert 0 <= box.x0 and box.x1 <= figure.bbox.width, label


def test_each_family_of_a_legend_in_several_rows_starts_at_the_top_of_a_column(tmp_path):
    """Two attention variants and three recurrent mixers on flip-flop's two panels: a legend
    of two rows, where the second heading fell at the foot of a column and headed nothing."""
    models = ("rope", "path", "deltanet", "gated_deltanet", "deltaproduct")
    for model in models:
        _write_metrics(tmp_path, "flipflop", model, 1, 0, 0.99,
                       {split: {"accuracy": 0.99, "error": 1.0}
                        for split in ("test", "test_1024", "test_4096")},
                       sets=["task.eval_lengths=1024,4096"])
    figure, _ = render(load_frame(tmp_path))
    places = {label: box for label, box in legend_text_boxes(figure) if label}
    top = max(box.y0 for box in places.values())
    assert min(box.y0 for box in places.values()) < top  # more than one row
    for heading, members in (("attention:", models[:2]), ("recurrent:", models[2:])):
        assert places[heading].y0 == top
        assert all(places[model].x0 >= places[heading].x0 for model in members)
    assert places["recurrent:"].x0 > max(places[model].x0 for model in models[:2])


def test_lengths_that_span_a_factor_of_four_get_a_log_axis(tmp_path):
    for length in (8, 16, 32):
        for model in ("path", "rope"):
            for layers in (1, 2):
                _write(tmp_path, "a5", model, layers, 0, 0.95, 0.95 if layers == 2 else 0.3,
                       sets=[f"task.length={length}"])
    figure = render(load_frame(tmp_path))[0]
    depth = figure.axes[0]
    assert depth.get_xscale() == "log"
    assert [tick.get_text() for tick in depth.get_xticklabels()] == ["8", "16", "32"]
    points = shown(figure)[depth.get_title()]
    # each model's points sit at the lengths, all moved by one small factor of its own
    for model, factor in (("path", 2**(1 / 40)), ("rope", 2**(-1 / 40))):
        assert [x for x, _ in points[model]] == pytest.approx([8 * factor, 16 * factor,
                                                              32 * factor])
