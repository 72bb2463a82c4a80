"""Runners without training: configuration resolution, option parsing, the results store, the
sweep's file format and its --until-solved schedule."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import PurePosixPath
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import cli, sweep_counts

from pathbench import UserError
from pathbench.runners.training import store
from pathbench.runners.training.config import (
    parse_float_list,
    parse_int_list,
    parse_sets,
    resolve_run,
    run_id,
    train_config,
)
from pathbench.runners.analysis.cells import aggregate, solved_cells
from pathbench.runners.analysis.records import load_frame
from pathbench.runners.analysis.tables import min_layers_table
from pathbench.runners.sweep.grid import Grid, find_sweep_file, load_sweep_file
from pathbench.runners.sweep.schedule import Schedule, in_run_order
from pathbench.runners.sweep.orchestrate import run_grids


# --- options and configuration ---------------------------------------------------------------


def test_int_lists_and_ranges():
    assert parse_int_list("1-6", "--layers") == [1, 2, 3, 4, 5, 6]
    assert parse_int_list("4,1,2", "--heads") == [1, 2, 4]
    assert parse_int_list("1-3,6", "--layers") == [1, 2, 3, 6]
    assert parse_float_list("1e-3,3e-4", "--lrs") == [1e-3, 3e-4]
    for bad in ("6-1", "a", "1-", "1,,2"):
        with pytest.raises(UserError, match="--layers"):
            parse_int_list(bad, "--layers")
    with pytest.raises(UserError, match="--lrs"):
        parse_float_list("0.1,x", "--lrs")


def test_set_items_are_parsed_and_checked():
    assert parse_sets(["task.length=64", "train.lr=1e-3", "model.beta_max=1.5"]) == {
        "task": {"length": "64"}, "model": {"beta_max": "1.5"}, "train": {"lr": "1e-3"}}
    for bad in ("length=64", "optim.lr=1", "task.length", "task.=3", "task.length="):
        with pytest.raises(UserError, match="--set expects"):
            parse_sets([bad])


def test_later_sources_win():
    """defaults < task run_defaults < preset < command-line options < --set."""
    paper = resolve_run("flipflop", device="cuda").config
    assert paper["preset"] == "paper"
    assert paper["model"] | {"vocab_size": None} == paper["model"] | {
        "attention": "path", "layers": 1, "heads": 2, "d_model": 64, "vocab_size": None}
    assert paper["task"]["config"]["length"] == 512  # the paper's setting
    cpu = resolve_run("flipflop", device="cpu").config
    assert cpu["preset"] == "cpu"
    assert cpu["task"]["config"]["length"] == 128 and cpu["train"]["steps"] == 600
    assert cpu["model"] == paper["model"]  # the cpu preset shrinks the data, not the model
    forced = resolve_run("flipflop", device="cpu", preset="paper").config
    assert forced["task"] == paper["task"] and forced["train"] == paper["train"]

    options = resolve_run("flipflop", device="cpu", options={"lr": 3e-3, "layers": 2}).config
    assert options["train"]["lr"] == 3e-3 and options["model"]["layers"] == 2
    both = resolve_run("flipflop", device="cpu", options={"lr": 3e-3},
                       sets=parse_sets(["train.warmup=7", "task.length=32", "model.heads=4"])).config
    assert both["train"]["lr"] == 3e-3 and both["train"]["warmup"] == 7
    assert both["task"]["config"]["length"] == 32 and both["model"]["heads"] == 4
    assert both["model"]["vocab_size"] == 5  # from the task's vocabulary
    with pytest.raises(UserError, match="--lr 0.003 and --set train.lr=5e-3 both set train.lr"):
        resolve_run("flipflop", options={"lr": 3e-3}, sets=parse_sets(["train.lr=5e-3"]))


def test_run_id_is_deterministic_and_names_the_run():
    first = resolve_run("flipflop", device="cpu", seed=1)
    again = resolve_run("flipflop", device="cpu", seed=1)
    assert first.run_id == again.run_id
    assert first.run_id.startswith("flipflop-path-L1-H2-D64-lr0.001-s1-")
    assert resolve_run("flipflop", device="cpu", seed=2).run_id != first.run_id
    # The device is where a run happens, not what it is.
    assert run_id({**first.config, "device": "cuda"}) == first.run_id


def test_strict_configuration_errors():
    with pytest.raises(UserError, match="unknown task 'nosuch'; valid choices: .*flipflop"):
        resolve_run("nosuch", device="cpu")
    with pytest.raises(UserError, match="unknown attention 'nosuch'"):
        resolve_run("flipflop", device="cpu", options={"model": "nosuch"})
    with pytest.raises(UserError, match="unknown train setting 'lrate'; valid settings: steps"):
        resolve_run("flipflop", device="cpu", sets=parse_sets(["train.lrate=1"]))
    with pytest.raises(UserError, match="train.steps expects int, got 'many'"):
        train_config({"steps": "many"})
    with pytest.raises(UserError, match="train.early_stop must be in"):
        train_config({"early_stop": "1.5"})
    assert train_config({"early_stop": "none"}).early_stop is None
    for key, value, rule in (("decay", "0", "in \\(0, 1\\]"), ("patience", "0", ">= 1 or none")):
        with pytest.raises(UserError, match=f"train.{key} must be {rule}, got"):
            train_config({key: value})
    with pytest.raises(UserError,
                       match="train.schedule must be one of cosine, constant, wsd, got 'linear'"):
        train_config({"schedule": "linear"})
    assert train_config({"eval_sizes": "sparse:100, dense:5"}).eval_sizes == {"sparse": 100, "dense": 5}
    assert train_config({"eval_sizes": {"sparse": 7.0}}).eval_sizes == {"sparse": 7}
    with pytest.raises(UserError, match="eval_sizes expects NAME:VALUE pairs"):
        train_config({"eval_sizes": "sparse=100"})
    with pytest.raises(UserError, match=r"train.eval_sizes\['sparse'\] expects int, got 'many'"):
        train_config({"eval_sizes": "sparse:many"})
    with pytest.raises(UserError, match="names split 'tset', which task 'flipflop' does not "
                                        "evaluate; valid splits: "):
        resolve_run("flipflop", sets={"train": {"eval_sizes": "tset:10"}})
    with pytest.raises(UserError, match="vocab_size is set by the task"):
        resolve_run("flipflop", device="cpu", sets=parse_sets(["model.vocab_size=9"]))
    with pytest.raises(UserError, match="unknown preset"):
        resolve_run("flipflop", device="cpu", preset="huge")


# --- the store --------------------------------------------------------------------------------


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path):
    path = tmp_path / "run" / "result.json"
    store.write_json_atomic(path, {"status": "ok"})
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # usual permissions, not mkstemp's

    def crash(file):
        file.write(b'{"status": "half')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        store.write_atomic(path, crash)
    assert json.loads(path.read_text()) == {"status": "ok"}  # the old record is intact
    assert os.listdir(path.parent) == ["result.json"]


def test_corrupt_record_is_a_one_line_error_naming_the_file(tmp_path):
    run_dir = tmp_path / "some-run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text('{"status": "ok", "metr')  # half-written
    with pytest.raises(store.CorruptRecord) as caught:
        store.read_result(run_dir)
    assert str(run_dir / "result.json") in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(store.CorruptRecord):
        store.is_done(run_dir)
    (run_dir / "result.json").write_text('{"status": "ok"}')  # valid JSON, not a record
    with pytest.raises(store.CorruptRecord, match="missing keys: metrics, config, provenance"):
        store.read_result(run_dir)
    record = {"status": "ok", "metrics": {"test": {}}, "config": {}, "provenance": {}}
    store.write_json_atomic(run_dir / "result.json", record)  # ok, but a split without metrics
    with pytest.raises(store.CorruptRecord, match="not a complete record"):
        store.is_done(run_dir)
    aside = store.set_aside_corrupt(run_dir)
    assert aside.name == "result.json.corrupt" and aside.exists()
    assert not store.is_done(run_dir)


def _archive(source, archive, arcname):
    import tarfile

    mode = {".xz": "w:xz", ".gz": "w:gz", ".tar": "w"}[archive.suffix]
    with tarfile.open(archive, mode) as tar:
        tar.add(source, arcname=arcname)
    return archive


def test_a_record_whose_metric_is_not_a_number_is_damaged(tmp_path):
    run_dir = tmp_path / "run"
    record = {"status": "ok", "metrics": {"test": {"accuracy": "high"}}, "config": {},
              "provenance": {}}
    store.write_json_atomic(run_dir / "result.json", record)
    with pytest.raises(store.CorruptRecord, match="metric test:accuracy is 'high', not a number"):
        store.read_result(run_dir)
    record["metrics"]["test"] = {"accuracy": float("nan"), "by_position": [0.5, 1]}
    store.write_json_atomic(run_dir / "result.json", record)
    assert store.read_result(run_dir)["metrics"]["test"]["by_position"] == [0.5, 1]


def test_results_and_plot_read_an_archive_of_runs_as_the_directory(tmp_path, capsys):
    runs = tmp_path / "runs"
    grid = Grid(task="a5", models=["path", "rope"], layers=[1, 2], lrs=[1e-3, 3e-4],
                seeds=[0, 1], sets=["task.length=8"])
    for i, run in enumerate(grid.runs("cpu")):
        store.write_json_atomic(runs / run.run_id / "result.json",
                                _fake_record(run, 0.3 + 0.02 * i))
        store.write_text_atomic(runs / run.run_id / "curve.jsonl", "{}\n")
    other = next(iter(Grid(task="z60", models=["path"], seeds=[0]).runs("cpu")))
    store.write_json_atomic(tmp_path / "probe" / other.run_id / "result.json",
                            _fake_record(other, 0.95))
    archives = [_archive(runs, tmp_path / "runs.tar.xz", "runs"),
                _archive(runs, tmp_path / "runs.tar.gz", "./runs"),
                _archive(runs, tmp_path / "runs.tar", "runs")]

    def outputs(path, name):
        tables = [cli(capsys, "results", path, *options) for options in
                  ([], ["--format", "csv"], ["--runs", "--format", "markdown"], ["--all-lrs"])]
        code, _, stderr = cli(capsys, "plot", path, "-o", tmp_path / name / "a5")
        assert code == 0, stderr
        return tables, (tmp_path / name / "a5.md").read_text()

    expected = outputs(runs, "from-directory")
    assert all(code == 0 for code, _, _ in expected[0]) and "| path |" in expected[1]
    for archive in archives:
        assert outputs(archive, "from-" + archive.name) == expected
        assert store.split_archive_path(archive / "runs") == (archive, PurePosixPath("runs"))
        assert outputs(archive / "runs", "from-folder-" + archive.name) == expected
    assert sorted(name for name, _ in store.iter_results(archives[0])) == sorted(
        archives[0] / "runs" / run_dir.name for run_dir, _ in store.iter_results(runs))

    # a folder inside the archive reads only the runs under it
    both = tmp_path / "both.tar.xz"
    import tarfile

    with tarfile.open(both, "w:xz") as tar:
        tar.add(runs, arcname="runs")
        tar.add(tmp_path / "probe", arcname="probe")
    assert len(load_frame(both)) == len(grid.runs("cpu")) + 1
    assert list(load_frame(both / "probe")["task"]) == ["z60"]
    assert outputs(both / "runs", "both-runs") == expected
    code, _, stderr = cli(capsys, "results", both / "nosuch")
    assert code == 2 and "no run records (result.json) under" in stderr


def test_corrupt_record_in_an_archive_is_skipped_with_a_warning_naming_it(tmp_path, capsys):
    runs = Grid(task="a5", models=["path"], seeds=[0, 1]).runs("cpu")
    for run in runs:
        store.write_json_atomic(tmp_path / "runs" / run.run_id / "result.json",
                                _fake_record(run, 0.5))
    run_dir = tmp_path / "runs" / runs[0].run_id
    good = _archive(tmp_path / "runs", tmp_path / "good.tar.gz", "runs")
    (run_dir / "result.json").write_text('{"status": "ok", "metr')  # half-written
    bad = _archive(tmp_path / "runs", tmp_path / "runs.tar.xz", "runs")
    for command in (["results", bad], ["plot", bad, "-o", tmp_path / "figure"]):
        code, stdout, stderr = cli(capsys, *command)
        assert code == 0 and stderr.count("\n") == 1 and "Traceback" not in stderr
        assert (f"warning: skipped {bad}/runs/{run_dir.name}/result.json is not a valid record"
                in stderr)
        assert "1/1" in stdout or "(n = 1)" in stdout  # the other run is still shown
    (run_dir / "result.json").write_text('{"status": "ok"}')  # valid JSON, not a record
    bad = _archive(tmp_path / "runs", tmp_path / "runs.tar.xz", "runs")
    with pytest.raises(store.CorruptRecord, match="missing keys: metrics, config, provenance"):
        load_frame(bad)
    truncated = tmp_path / "truncated.tar.gz"  # a damaged archive, not a damaged record
    truncated.write_bytes(good.read_bytes()[:60])
    code, _, stderr = cli(capsys, "results", truncated)
    assert code == 2 and stderr.count("\n") == 1
    assert f"cannot read the archive {truncated}" in stderr


# --- sweep files and --until-solved -------------------------------------------------------------


def test_shipped_sweep_files_resolve():
    settings, grids = load_sweep_file(find_sweep_file("paper"))
    assert settings["out"] == "results/runs/paper"  # under the ignored runs folder, never results/paper
    # the construction of Theorem A.1 beside Table 1, at 16,384 tokens too
    [construction] = settings["construct"]
    assert construction.task == "flipflop" and construction.preset == "paper"
    assert construction.sets == ["task.eval_lengths=1024,4096,16384"]
    tasks = {grid.task for grid in grids}
    assert tasks == {"flipflop", "a5", "a4xz5", "z60", "mqrar"}
    flipflop = [grid for grid in grids if grid.task == "flipflop"]
    assert flipflop[0].models == ["nope", "rope", "sba", "fox", "path", "path_fox"]
    assert len(flipflop[0].seeds) >= 3
    runs = flipflop[0].runs("cuda")
    assert len(runs) == 6 * len(flipflop[0].seeds) * len(flipflop[0].lrs or [None])
    assert {c.model.d_model for c in runs} == {64}
    # Table 1 at one layer, PaTH also at two (the theorem's depth); both tested at 1,024 and
    # 4,096 tokens, and the sparse split scores about 10^6 reads (3.5 a sequence).
    assert [(grid.models, grid.layers) for grid in flipflop[1:]] == [(["path"], [2])]
    for run in runs + flipflop[1].runs("cuda"):
        assert run.task.config["eval_lengths"] == (1024, 4096)
        assert run.train.eval_sizes["sparse"] * 3.5 >= 1e6
    mqrar = next(grid for grid in grids if grid.task == "mqrar")
    n_back = {c.task.config["n_back"] for c in mqrar.runs("cuda")}
    assert n_back == {1, 2, 3, 4}
    # runs end on a plateau (patience) or at the cap that fits the GPU time
    assert {(c.train.steps, c.train.patience) for c in mqrar.runs("cuda")} == {(2000, 5)}
    # Flip-flop's Table 1 searches learning rates from 3e-4 to 1e-2, MQRAR takes 1e-3
    # alone, and word problems one rate per depth: 1e-3 up to 3 layers, 3e-4 from 4 on; a
    # cell's runs pack as --pack auto decides, but MQRAR's, which fill the GPU alone.
    by_depth = {layers: [1e-3] if layers <= 3 else [3e-4] for layers in range(1, 7)}
    for grid in grids:
        expected = by_depth if grid.task in ("a5", "a4xz5", "z60") else {
            "flipflop": [3e-4, 1e-3, 3e-3, 1e-2], "mqrar": [1e-3]}[grid.task]
        if isinstance(expected, dict):
            expected = {layers: expected[layers] for layers in grid.layers}
        assert grid.lrs == expected, grid
    assert {grid.task: grid.pack for grid in grids} == {"flipflop": None, "a5": None,
                                                        "a4xz5": None, "z60": None, "mqrar": 1}
    # A5's depth is searched at every length of the ladder, shortest first, each length its
    # own chain, tested at twice that length: all six attentions to 16, RoPE and PaTH beyond,
    # in the generator framing and on the controls, up to 4 layers. A split depth gets five
    # seeds; a run ends on a plateau of its validation accuracy or at its step cap.
    lengths = {}
    for grid in grids:
        if grid.task in ("a5", "a4xz5", "z60") and grid.until_solved:
            assert len(grid.seeds) >= 3 and grid.max_seeds == 5 and grid.max_steps is None
            assert grid.layers == [1, 2, 3, 4]
            assert {run.train.patience for run in grid.runs("cuda")} == {10}
            task = grid.runs("cuda")[0].task.config
            assert task["eval_lengths"] == (2 * task["length"],)
            key = (grid.task, task["words"], len(grid.models))
            lengths.setdefault(key, []).append(task["length"])
            if len(grid.models) == 2:
                assert grid.models == ["rope", "path"]
    assert lengths == {("a5", "elements", 6): [8, 12, 16], ("a5", "elements", 2): [24, 32],
                       ("a5", "generators", 2): [16], ("a4xz5", "elements", 2): [16],
                       ("z60", "elements", 2): [16]}
    # depth and heads: every cell of 1-4 layers x 1, 2, 4, 8 heads at length 16, trained as the
    # ladder trains that length, so that its 4-head runs are the ladder's own
    [heads] = [grid for grid in grids if grid.task == "a5" and grid.heads]
    ladder_16 = next(grid for grid in grids if grid.until_solved
                     and grid.runs("cuda")[0].task.config == {"length": 16, "words": "elements",
                                                              "eval_lengths": (32,)})
    assert heads.models == ["rope", "path"] and heads.heads == [1, 2, 4, 8]
    assert heads.layers == [1, 2, 3, 4] and not heads.until_solved
    shared = {run.run_id for run in heads.runs("cuda")} & {
        run.run_id for run in ladder_16.runs("cuda")}
    assert len(shared) == 2 * 4 * 3  # models x layers x seeds, at 4 heads
    for name in ("flipflop", "word_problems", "mqrar", "heads"):
        file_settings, _ = load_sweep_file(find_sweep_file(name))
        assert file_settings["out"].startswith("results/runs/")
    # the CPU presets' robustness: five seeds of exactly what `pathbench run TASK` trains on a
    # CPU, with the models docs/usage.md compares there
    cpu_settings, cpu_grids = load_sweep_file(find_sweep_file("cpu"))
    assert cpu_settings["device"] == "cpu" and cpu_settings["out"].startswith("results/runs/")
    for grid in cpu_grids:
        assert grid.seeds == [0, 1, 2, 3, 4]
        default = resolve_run(grid.task, device="cpu")
        for run in grid.runs("cpu"):
            assert run.config["task"] == default.config["task"] and run.train == default.train
            assert replace(run.model, attention=default.model.attention) == default.model
    # PaTH and RoPE beside the recurrent mixers: flip-flop, and A5 at lengths 16 and 32
    family_settings, families = load_sweep_file(find_sweep_file("families"))
    assert family_settings["out"].startswith("results/runs/")
    # each experiment a table for the mixers, on pathbench's torch code, and one for PaTH and
    # RoPE, with otherwise the same settings
    mixers, attention = families[::2], families[1::2]
    for grid in mixers:
        assert grid.models == ["deltanet", "deltaproduct", "gated_deltanet", "rwkv7"]
        assert {run.model.backend for run in grid.runs("cuda")} == {"torch"}
    for grid in attention:
        assert grid.models == ["path", "rope"]
    for grid in families:  # learning rates and plateaus as in the paper sweep
        assert grid.seeds == [0, 1, 2]
        assert grid.lrs == ([3e-4, 1e-3, 3e-3, 1e-2] if grid.task == "flipflop" else
                            {1: [1e-3], 2: [1e-3], 3: [1e-3], 4: [3e-4]})
        assert {run.train.patience for run in grid.runs("cuda")} == (
            {None} if grid.task == "flipflop" else {10})
    for mixer, other in zip(mixers, attention):
        assert [item for item in mixer.sets if item != "model.backend=torch"] == other.sets
    # PaTH's and RoPE's runs are the paper sweep's own, which results/sweep_on_gpu.sh shares
    _, paper = load_sweep_file(find_sweep_file("paper"))
    planned = {run.run_id for grid in paper for run in grid.runs("cuda")}
    assert {run.run_id for grid in attention for run in grid.runs("cuda")} <= planned
    assert [grid.runs("cuda")[0].task.config.get("length") for grid in attention] == [512, 16, 32]
    assert all(grid.until_solved and grid.max_seeds == 5 for grid in families[2:])
    _, [heads] = load_sweep_file(find_sweep_file("heads"))
    assert len(heads.runs("cuda")) == 2 * 4 * 4 * 3  # models x layers x heads x seeds


def test_sweep_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    for text, message in [
        ('[[sweep]]\ntask = "flipflop"\nlayer = [1]\n', "unknown key 'layer'; valid keys: .*layers"),
        ('[[sweep]]\ntask = "flipflop"\nlayers = "3-1"\n', "layers expects integers"),
        ('[[sweep]]\ntask = "flipflop"\nset = "task.length=8"\n', "set must be a list"),
        ('[[sweep]]\ntask = "flipflop"\npack = 0\n', 'pack must be "auto" or an integer >= 1, got 0'),
        ('[[sweep]]\ntask = "flipflop"\npack = "all"\n',
         'pack must be "auto" or an integer >= 1, got \'all\''),
        ("[[sweep]\n", "not valid TOML"),
    ]:
        bad.write_text(text)
        with pytest.raises(UserError, match=message):
            load_sweep_file(bad)
    with pytest.raises(UserError, match="shipped sweep files: .*paper"):
        find_sweep_file("nosuch")


def test_a_sweep_file_gives_each_layer_count_its_own_learning_rates(tmp_path):
    path = tmp_path / "grids.toml"
    path.write_text('[[sweep]]\ntask = "a5"\nmodels = ["rope"]\nlayers = "1-3"\n'
                    'lrs = { "1-2" = [1e-3, 3e-3], "3" = [3e-4] }\nseeds = [0, 1]\n'
                    'until_solved = true\nd_model = 16\nset = ["task.length=4"]\n')
    _, [grid] = load_sweep_file(path)
    rates = sorted((run.model.layers, run.train.lr, run.seed) for run in grid.runs("cpu"))
    assert rates == sorted([(layers, lr, seed) for layers in (1, 2) for lr in (1e-3, 3e-3)
                            for seed in (0, 1)] + [(3, 3e-4, 0), (3, 3e-4, 1)])
    # one depth search over all three layer counts: a chain per model, a step per depth
    schedule = Schedule([(grid, grid.runs("cpu"))], tmp_path, lambda runs: None, dry_run=True)
    for layers in (1, 2, 3):  # each depth once the one before it ended unsolved
        ready = []
        while (pack := schedule.next_pack()) is not None:
            ready += pack
        assert sorted((run.model.layers, run.train.lr) for run in ready) == sorted(
            (run.model.layers, run.train.lr) for run in grid.runs("cpu")
            if run.model.layers == layers)
        for run in ready:
            schedule.ended(run.run_id)
    for line, message in [
        ('lrs = { "1-2" = [1e-3] }', "lrs by layer count gives no rates for 3 layers"),
        ('lrs = { "1-3" = [1e-3], "3" = [3e-4] }', "lrs gives 3 layers rates twice"),
        ('lrs = { "1-3" = ["fast"] }', "lrs for 1-3 layers expects numbers"),
    ]:
        path.write_text(f'[[sweep]]\ntask = "a5"\nlayers = "1-3"\n{line}\n')
        with pytest.raises(UserError, match=message):
            load_sweep_file(path)[1][0].runs("cpu")


def _fake_record(run, accuracy, test=None):
    """A finished run whose val accuracy is ``accuracy`` (and test accuracy ``test``, or the
    same)."""
    return {"run_id": run.run_id, "status": "ok", "reason": None, "steps": 1,
            "primary_metric": "accuracy", "solved_threshold": 0.9,
            "validation": {"accuracy": accuracy},
            "metrics": {"test": {"accuracy": accuracy if test is None else test}},
            "config": run.config, "provenance": {"wall_time_s": 0.1}}


def test_runs_start_longest_first_then_seed_by_seed():
    grid = Grid(task="flipflop", models=["rope", "path"], layers=[1, 2], seeds=[0, 1], d_model=16)
    order = [(c.model.layers, c.seed, c.model.attention)
             for c in in_run_order(grid.runs("cpu"))]
    assert order == [(2, 0, "rope"), (2, 0, "path"), (2, 1, "rope"), (2, 1, "path"),
                     (1, 0, "rope"), (1, 0, "path"), (1, 1, "rope"), (1, 1, "path")]


def test_packs_hold_runs_that_differ_only_in_seed_and_learning_rate():
    from pathbench.runners.sweep.schedule import in_packs

    grid = Grid(task="flipflop", models=["rope", "path"], lrs=[1e-3, 3e-3], seeds=[0, 1, 2],
                d_model=16)
    packs = in_packs(in_run_order(grid.runs("cpu")), 4)
    assert sorted(len(pack) for pack in packs) == [2, 2, 4, 4]
    for pack in packs:
        assert len({run.model.attention for run in pack}) == 1
    assert sorted(run.run_id for pack in packs for run in pack) == sorted(
        run.run_id for run in grid.runs("cpu"))


def test_auto_packs_a_cell_together_on_a_gpu_as_memory_allows(monkeypatch):
    from pathbench.runners.sweep import schedule
    from pathbench.runners.sweep.schedule import in_packs

    grid = Grid(task="a5", models=["rope", "path"], lrs=[1e-4, 3e-4, 1e-3], seeds=[0, 1, 2],
                layers=[4], sets=["task.length=12"], batch_size=256, d_model=128)
    assert sorted(map(len, in_packs(grid.runs("cuda"), None))) == [9, 9]  # a cell a pack
    assert list(map(len, in_packs(grid.runs("cpu"), None))) == [1] * 18
    # 256 x 12 tokens x 128 channels x 4 layers: 4 runs' activations fit, 9 take three packs
    monkeypatch.setattr(schedule, "PACK_MEMORY", 4 * 256 * 12 * 128 * 4 * schedule.ACTIVATION_BYTES)
    assert sorted(map(len, in_packs(grid.runs("cuda"), None))) == [3] * 6
    monkeypatch.setattr(schedule, "PACK_MEMORY", 1)  # not even one: each alone
    assert list(map(len, in_packs(grid.runs("cuda"), None))) == [1] * 18


def test_pack_is_auto_unless_a_file_or_the_command_line_gives_a_size(tmp_path):
    from pathbench.runners.sweep.grid import apply_values

    path = tmp_path / "s.toml"
    path.write_text('[[sweep]]\ntask = "flipflop"\n\n[[sweep]]\ntask = "flipflop"\npack = 3\n'
                    '\n[[sweep]]\ntask = "flipflop"\npack = "auto"\n')
    _, grids = load_sweep_file(path)
    assert [grid.pack for grid in grids] == [None, 3, None]
    assert apply_values(Grid(task="flipflop", pack=3), "--", pack="auto").pack is None


def _dry_run(grid, out, capsys):
    run_grids([grid], out=out, device="cpu", workers=1, executor="local", slurm_params={},
              dry_run=True)
    return Counter(line.split()[0] for line in capsys.readouterr().out.splitlines())


def test_a_dry_run_sums_the_work_to_do_once_per_run_and_plans_for_a_gpu_anywhere(tmp_path,
                                                                                 capsys):
    one = Grid(task="flipflop", models=["rope"], layers=[1, 2], steps=30)
    both = Grid(task="flipflop", models=["rope"], layers=[2, 3], steps=30)  # shares layers 2
    done = one.runs("cuda")[0]
    store.write_json_atomic(tmp_path / done.run_id / "result.json", _fake_record(done, 0.5))
    run_grids([one, both], out=tmp_path, device="cuda", workers=1, executor="local",
              slurm_params={}, dry_run=True)
    summary = capsys.readouterr().err.splitlines()[-1]
    assert summary.startswith("dry run: 2 runs to train, 60 run-steps at their step caps")
    assert summary.endswith("0 to skip, 1 done")


def test_until_solved_drops_deeper_runs_of_solved_models(tmp_path, capsys):
    grid = Grid(task="a5", models=["path", "rope"], layers=[1, 2, 3], lrs=[1e-3, 3e-4],
                seeds=[0, 1], sets=["task.length=8"], until_solved=True)
    runs = grid.runs("cpu")
    assert _dry_run(grid, tmp_path / "none yet", capsys) == {"todo": 24}  # nothing decided yet
    dropped = []
    schedule = Schedule([(grid, runs)], tmp_path, dropped.extend)
    seen_layers = []
    while (pack := schedule.next_pack()) is not None:
        layers = pack[0].model.layers
        seen_layers.append((pack[0].model.attention, layers))
        for run in pack:
            # path solves at 2 layers with the smaller learning rate only; rope never.
            solved = (run.model.attention == "path" and layers >= 2
                      and run.train.lr == 3e-4)
            record = _fake_record(run, 0.95 if solved else 0.5)
            store.write_json_atomic(tmp_path / run.run_id / "result.json", record)
            schedule.ended(run.run_id)
    assert len(dropped) == 4  # path at 3 layers: 2 lrs x 2 seeds
    assert all(c.model.layers == 3 and c.model.attention == "path" for c in dropped)
    for model, depths in (("path", [1, 2]), ("rope", [1, 2, 3])):  # one layer count at a time
        assert [layers for name, layers in seen_layers if name == model] == sorted(depths * 4)
    # the records decide what is left: nothing, and the runs that will never be needed
    assert _dry_run(grid, tmp_path, capsys) == {"done": 20, "skip": 4}
    # an unneeded run recorded anyway (by an earlier sweep) is listed as done
    unneeded = next(c for c in runs if c.model.attention == "path"
                    and c.model.layers == 3 and c.train.lr == 3e-4)
    store.write_json_atomic(tmp_path / unneeded.run_id / "result.json", _fake_record(unneeded, 0.95))
    assert _dry_run(grid, tmp_path, capsys) == {"done": 21, "skip": 3}

    table = aggregate(load_frame(tmp_path))
    assert set(table.loc[table["model"] == "path", "lr"]) == {3e-4}  # best over lrs
    assert len(solved_cells(load_frame(tmp_path))) == 1
    readings = min_layers_table(table).set_index("model")
    assert readings["min_layers"].to_dict() == {"path": "2", "rope": ">3"}
    # the solve rates behind them, with Wilson intervals: at the depth and one fewer, or at the
    # deepest where none solved
    assert readings["evidence"].to_dict() == {"path": "2: 2/2 [0.34, 1.00]; 1: 0/2 [0.00, 0.66]",
                                              "rope": "3: 0/2 [0.00, 0.66]"}


def test_scrambled_test_labels_change_no_decision(tmp_path, capsys):
    """Validation decides, test reports: with every test score of a finished sweep replaced by
    noise, the learning rates picked, the cells solved for --until-solved and the runs the sweep
    would train or skip stay the same; only the reported numbers move."""
    grid = Grid(task="a5", models=["path", "rope"], layers=[1, 2, 3], lrs=[1e-3, 3e-4],
                seeds=[0, 1, 2], sets=["task.length=8"], until_solved=True)
    rng = __import__("random").Random(0)
    for run in grid.runs("cpu"):
        model, layers, lr = (run.model.attention, run.model.layers,
                             run.train.lr)
        val = 0.95 if model == "path" and layers >= 2 and lr == 3e-4 else 0.3 + 0.1 * layers
        if model == "path" and layers == 3:
            continue  # the sweep skipped these: path solved at 2 layers
        store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                _fake_record(run, val, test=val - 0.01))

    def decisions():
        table = aggregate(load_frame(tmp_path))
        picked = sorted(zip(table["cell"], table["lr"]))
        return picked, solved_cells(load_frame(tmp_path)), _dry_run(grid, tmp_path, capsys)

    before = decisions()
    for path in tmp_path.glob("*/result.json"):
        record = json.loads(path.read_text())
        record["metrics"]["test"]["accuracy"] = rng.random()  # labels scrambled: test is noise
        store.write_json_atomic(path, record)
    assert decisions() == before
    assert before[1] and before[2]["skip"] == 6  # something was decided: path at 3 layers


def _write_cell(out, val, test=None, scored=None):
    """One a5 cell (path, 2 layers, length 8): a seed per value of ``val``."""
    grid = Grid(task="a5", models=["path"], layers=[2], seeds=list(range(len(val))),
                sets=["task.length=8"])
    for index, run in enumerate(grid.runs("cpu")):
        record = _fake_record(run, val[index], None if test is None else test[index])
        if scored is not None:
            record["metrics"]["test"]["scored"] = scored[index]
        store.write_json_atomic(out / run.run_id / "result.json", record)


@pytest.mark.parametrize("accuracies, solved", [
    ([0.95, 0.97, 0.2], True),  # two of three seeds
    ([0.95, 0.2, 0.2], False),  # one of three
    ([0.9, 0.9, 0.2], True),  # exactly at the threshold counts
    ([0.9, 0.8999, 0.2], False),  # just below it does not
    ([0.9], True), ([0.8999], False),  # one of one; none of one
    ([0.95, 0.95, 0.2, 0.2], False),  # two of four is below two thirds
    ([0.95, 0.95, 0.95, 0.2], True),  # three of four
])
def test_solved_needs_two_thirds_of_the_seeds_at_or_above_the_threshold(tmp_path, accuracies,
                                                                       solved):
    _write_cell(tmp_path, accuracies)
    frame = load_frame(tmp_path)
    table = aggregate(frame)
    assert table["solved"].tolist() == [solved] and table["val_solved"].tolist() == [solved]
    assert solved_cells(frame) == ({table["depth_free_cell"].iloc[0]} if solved else set())
    assert min_layers_table(table)["min_layers"].tolist() == ["2" if solved else ">2"]


def test_a_cell_has_a_solve_rate_and_depth_two_readings(tmp_path):
    """path at 1 layer: one seed of three solves (it can express the task there); at 2 layers
    three of three (it learns it reliably)."""
    for layers, accuracies in ((1, [0.95, 0.2, 0.2]), (2, [0.95, 0.93, 0.91])):
        grid = Grid(task="a5", models=["path"], layers=[layers], seeds=[0, 1, 2],
                    sets=["task.length=8"])
        for run, accuracy in zip(grid.runs("cpu"), accuracies):
            store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                    _fake_record(run, accuracy))
    table = aggregate(load_frame(tmp_path)).sort_values("layers")
    assert table["solved_seeds"].tolist() == [1, 3] and table["solved"].tolist() == [False, True]
    # the Wilson interval of 1 of 3 and of 3 of 3, worked out from its definition
    assert (table["solve_low"].iloc[0], table["solve_high"].iloc[0]) == pytest.approx(
        _wilson_bounds(1, 3))
    assert table["solve_low"].iloc[1] == pytest.approx(_wilson_bounds(3, 3)[0])
    assert table["solve_high"].iloc[1] == 1.0
    readings = min_layers_table(table).iloc[0]
    assert (readings["min_layers"], readings["min_layers_any"]) == ("2", "1")


def test_a_model_cut_short_by_its_budget_is_unresolved_not_unsolved(tmp_path):
    """rope at 1 and 2 layers solves nowhere; at 2 layers one run was still improving at its
    step cap, so its depth is ">2?" (unresolved); path's runs say nothing of it (older records)
    and stay ">2"."""
    for model in ("rope", "path"):
        grid = Grid(task="a5", models=[model], layers=[1, 2], seeds=[0, 1, 2],
                    sets=["task.length=8"])
        for index, run in enumerate(grid.runs("cpu")):
            record = _fake_record(run, 0.5)
            if model == "rope":
                record["budget_limited"] = run.model.layers == 2 and index % 3 == 0
            store.write_json_atomic(tmp_path / run.run_id / "result.json", record)
    table = aggregate(load_frame(tmp_path))
    counts = {(m, l): c for m, l, c in zip(table["model"], table["layers"],
                                           table["budget_limited"])}
    assert counts[("rope", 1)] == 0 and counts[("rope", 2)] == 1
    assert pd.isna(counts[("path", 1)]) and pd.isna(counts[("path", 2)])
    readings = min_layers_table(table).set_index("model")
    assert readings.loc["rope", "min_layers"] == ">2?" and readings.loc["path", "min_layers"] == ">2"


def test_a_depth_solved_above_an_unresolved_one_is_read_as_at_most(tmp_path):
    """rope and path solve at 2 layers with every seed and at 1 layer with none; rope's 1-layer
    cell has a run still improving at its step cap, so rope's fewest layers may be 1: "≤2?",
    while path's are 2. The solve rates behind both readings show the shallower cell."""
    for model in ("rope", "path"):
        grid = Grid(task="a5", models=[model], layers=[1, 2], seeds=[0, 1, 2],
                    sets=["task.length=8"])
        for index, run in enumerate(grid.runs("cpu")):
            record = _fake_record(run, 0.95 if run.model.layers == 2 else 0.5)
            record["budget_limited"] = model == "rope" and run.model.layers == 1 and index == 0
            store.write_json_atomic(tmp_path / run.run_id / "result.json", record)
    readings = min_layers_table(aggregate(load_frame(tmp_path))).set_index("model")
    assert readings.loc["rope", ["min_layers", "min_layers_any"]].tolist() == ["≤2?", "≤2?"]
    assert readings.loc["path", ["min_layers", "min_layers_any"]].tolist() == ["2", "2"]
    assert readings.loc["rope", "evidence"] == "2: 3/3 [0.44, 1.00]; 1: 0/3 [0.00, 0.56]"


def test_a_depth_whose_seeds_disagree_gets_more_seeds_before_the_search_goes_on(tmp_path):
    """max_seeds 5: path's three seeds disagree at 1 layer (one of three solves), so seeds 3
    and 4 train at that depth at both learning rates, and all five decide (three of five: not
    solved, so on to 2 layers); rope's seeds agree (none solves) and it goes deeper at once."""
    grid = Grid(task="a5", models=["path", "rope"], layers=[1, 2], lrs=[1e-3, 3e-4],
                seeds=[0, 1, 2], sets=["task.length=8"], until_solved=True, max_seeds=5)
    added, dropped, trained = [], [], []
    schedule = Schedule([(grid, grid.runs("cpu"))], tmp_path, dropped.extend, add=added.extend)
    while (pack := schedule.next_pack()) is not None:
        for run in pack:
            trained.append((run.model.attention, run.model.layers, run.seed))
            # path solves with seeds 0, 3 and 4 at 1 layer, with every seed at 2
            solves = run.model.attention == "path" and (run.model.layers == 2
                                                         or run.seed in (0, 3, 4))
            store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                    _fake_record(run, 0.95 if solves else 0.5))
            schedule.ended(run.run_id)
    assert sorted({(layers, seed) for model, layers, seed in trained if model == "path"}) == [
        (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1), (2, 2)]
    assert sorted({(layers, seed) for model, layers, seed in trained if model == "rope"}) == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert sorted((run.model.layers, run.seed, run.train.lr) for run in added) == [
        (1, 3, 3e-4), (1, 3, 1e-3), (1, 4, 3e-4), (1, 4, 1e-3)]
    row = aggregate(load_frame(tmp_path))
    row = row[(row["model"] == "path") & (row["layers"] == 1)].iloc[0]
    assert (row["seeds"], row["val_solved_seeds"], row["val_solved"]) == (5, 3, False)
    with pytest.raises(UserError, match="needs until_solved"):
        Grid(task="a5", seeds=[0], max_seeds=3).runs("cpu")
    with pytest.raises(UserError, match=r"max_seeds \(2\) is below the 3 seeds"):
        Grid(task="a5", seeds=[0, 1, 2], until_solved=True, max_seeds=2).runs("cpu")


@pytest.mark.parametrize("later, solved", [((3, 4), True), ((3,), False)])
def test_two_seeds_of_three_are_near_the_line_and_get_more_seeds_too(tmp_path, later, solved):
    """Two of three seeds solve at 1 layer: solved by the rule, but the rate's interval is
    [0.21, 0.94], so max_seeds 5 adds seeds 3 and 4 before the verdict. With both solving
    (four of five) the search stops; with one (three of five) it goes on to 2 layers. With
    five seeds the verdict stands whatever they say."""
    grid = Grid(task="a5", models=["path"], layers=[1, 2], lrs=[1e-3], seeds=[0, 1, 2],
                sets=["task.length=8"], until_solved=True, max_seeds=5)
    trained = []
    schedule = Schedule([(grid, grid.runs("cpu"))], tmp_path, lambda runs: None)
    while (pack := schedule.next_pack()) is not None:
        for run in pack:
            trained.append((run.model.layers, run.seed))
            solves = run.model.layers == 2 or run.seed in (0, 1, *later)
            store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                    _fake_record(run, 0.95 if solves else 0.5))
            schedule.ended(run.run_id)
    deeper = [] if solved else [(2, 0), (2, 1), (2, 2)]
    assert sorted(trained) == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), *deeper]


def test_a_depth_cut_short_by_its_budget_trains_again_longer_before_the_search_goes_on(
        tmp_path):
    """max_steps 400: path at 1 layer ends its 100 steps still improving and unsolved, so it
    trains again with 200, then 400 steps, where it solves; rope is not budget-limited and goes
    deeper at once; deeper layer counts start again from the grid's 100 steps."""
    grid = Grid(task="a5", models=["path", "rope"], layers=[1, 2], seeds=[0, 1], steps=100,
                sets=["task.length=8"], until_solved=True, max_steps=400)
    added, trained = [], []
    schedule = Schedule([(grid, grid.runs("cpu"))], tmp_path, lambda runs: None,
                        add=added.extend)
    while (pack := schedule.next_pack()) is not None:
        for run in pack:
            trained.append((run.model.attention, run.model.layers, run.train.steps))
            solves = run.model.attention == "path" and run.train.steps == 400
            record = {**_fake_record(run, 0.95 if solves else 0.5),
                      "budget_limited": run.model.attention == "path" and not solves}
            store.write_json_atomic(tmp_path / run.run_id / "result.json", record)
            schedule.ended(run.run_id)
    assert sorted(set(trained)) == [("path", 1, 100), ("path", 1, 200), ("path", 1, 400),
                                    ("rope", 1, 100), ("rope", 2, 100)]
    assert sorted(run.train.steps for run in added) == [200, 200, 400, 400]
    with pytest.raises(UserError, match=r"max_steps \(50\) is below the 100 steps"):
        Grid(task="a5", steps=100, until_solved=True, max_steps=50).runs("cpu")


@pytest.mark.parametrize("record, expected", [
    ({"budget_limited": True}, True),  # a record that says so
    ({"curve": [0.5, 0.6, 0.7]}, True),  # at the cap, a new best at the last check
    ({"curve": [0.5, 0.7, 0.7]}, False),  # at the cap, no new best at the last check
    ({"curve": [0.5, 0.6, 0.7], "stopped_early": True, "steps": 6}, False),  # ended early
    ({"curve": []}, None),  # nothing tells
])
def test_an_older_record_is_judged_budget_limited_by_its_curve(record, expected):
    from pathbench.runners.analysis.records import budget_limited

    full = {"status": "ok", "steps": 10, "stopped_early": False, "primary_metric": "accuracy",
            "config": {"train": {"steps": 10}}, **record}
    if "curve" in record:
        full["curve"] = [{"step": 2 * i, "validation": {"accuracy": value}}
                         for i, value in enumerate(record["curve"], 1)]
    assert budget_limited(full) is expected


def test_a_learning_rate_picked_on_an_edge_of_the_grid_is_flagged(tmp_path, capsys):
    """path tries 1e-4, 3e-4, 1e-3 and val picks the middle one; rope picks the highest; fox
    scores the same at 1e-5, 1e-4 and 1e-3: the smallest is picked (whatever order the records
    come in: 1e-05 sorts last by name), and a tie says nothing of rates beyond the grid."""
    best = {"path": [3e-4], "rope": [1e-3], "fox": [1e-5, 1e-4, 1e-3]}
    for model, lrs in (("path", [1e-4, 3e-4, 1e-3]), ("rope", [1e-4, 3e-4, 1e-3]),
                       ("fox", [1e-5, 1e-4, 1e-3])):
        grid = Grid(task="a5", models=[model], layers=[2], lrs=lrs, seeds=[0],
                    sets=["task.length=8"])
        for run in grid.runs("cpu"):
            accuracy = 0.9 if run.train.lr in best[model] else 0.5
            store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                    _fake_record(run, accuracy))
    table = aggregate(load_frame(tmp_path)).set_index("model")
    assert table.loc["path", "lr"] == 3e-4 and not table.loc["path", "lr_at_edge"]
    assert table.loc["rope", "lr"] == 1e-3 and table.loc["rope", "lr_at_edge"]
    assert table.loc["fox", "lr"] == 1e-5 and not table.loc["fox", "lr_at_edge"]
    code, stdout, _ = cli(capsys, "results", tmp_path)
    rows = {line.split()[0]: line for line in stdout.splitlines() if line.strip()[:4] in
            ("path", "rope", "fox ")}
    assert "0.001 (edge)" in rows["rope"] and "(edge)" not in rows["path"]
    assert "(edge)" not in rows["fox"]


def test_val_decides_solved_for_the_sweep_and_test_for_the_tables(tmp_path):
    _write_cell(tmp_path, val=[0.95, 0.95, 0.2], test=[0.95, 0.2, 0.2])
    table = aggregate(load_frame(tmp_path))
    assert table["val_solved"].tolist() == [True] and table["solved"].tolist() == [False]
    assert table["test"].iloc[0] == pytest.approx((0.95 + 0.2 + 0.2) / 3)
    assert table["test_std"].iloc[0] == pytest.approx(0.4330127, rel=1e-6)  # sd, n - 1


def _wilson_bounds(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson interval from its definition: the rates p at which the observed rate lies
    exactly z standard errors away, the roots of (k/n - p)^2 = z^2 p (1 - p) / n."""
    import numpy as np

    rate = successes / n
    low, high = sorted(np.roots([1 + z * z / n, -(2 * rate + z * z / n), rate * rate]).real)
    return float(low), float(high)


def test_wilson_interval():
    from pathbench.runners.analysis.cells import wilson_interval

    low, high = wilson_interval(0.0, 1_000_000)
    assert low == 0.0 and high == pytest.approx(3.84e-6, rel=1e-2)  # 1.96^2 / n
    low, high = wilson_interval(0.5, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    assert wilson_interval(1.0, 7)[1] == 1.0
    for successes, n in ((3, 10), (97, 100), (1, 1000)):
        assert wilson_interval(successes / n, n) == pytest.approx(_wilson_bounds(successes, n))


def test_a_cells_interval_is_that_of_the_pooled_rate_counting_each_read_once(tmp_path):
    """Three seeds right on 90 of 100, 50 of 100 and 40 of 200 scored positions: 180 of 400
    pooled (0.45), where the plain mean over seeds is 0.533; the seeds read the same evaluation
    sequences, so the interval is that of 0.45 on the 200 distinct reads, not on 400."""
    _write_cell(tmp_path, val=[0.9, 0.5, 0.2], scored=[100, 100, 200])
    row = aggregate(load_frame(tmp_path)).iloc[0]
    assert row["test"] == pytest.approx(1.6 / 3)  # the mean over seeds, beside the interval
    assert (row["test_low"], row["test_high"]) == pytest.approx(_wilson_bounds(90, 200))
    assert (row["test_low"], row["test_high"]) == pytest.approx((0.3826, 0.5192), abs=1e-4)


def test_a_model_goes_deeper_without_waiting_for_others_and_grids_take_turns(tmp_path):
    chains = Grid(task="a5", models=["path", "rope"], layers=[1, 2], seeds=[0, 1], pack=2,
                  sets=["task.length=8"], until_solved=True)
    plain = Grid(task="flipflop", models=["nope"], layers=[4], seeds=[0], d_model=16)
    schedule = Schedule([(plain, plain.runs("cpu")), (chains, chains.runs("cpu"))],
                         tmp_path, lambda runs: None)
    first, second, third = (schedule.next_pack() for _ in range(3))
    # each grid in turn; the one-layer packs gate the two-layer ones, so the chains' grid,
    # tied with the plain one, goes first
    assert [(p[0].task.name, p[0].model.layers) for p in (first, second, third)] == [
        ("a5", 1), ("flipflop", 4), ("a5", 1)]
    assert schedule.next_pack() is None  # nothing else may start yet
    for run in third:  # one model's first layer count ends, the other's is still training
        store.write_json_atomic(tmp_path / run.run_id / "result.json", _fake_record(run, 0.5))
        schedule.ended(run.run_id)
    deeper = schedule.next_pack()
    assert [(c.model.attention, c.model.layers) for c in deeper] == [
        (third[0].model.attention, 2)] * 2
    assert schedule.next_pack() is None


def test_a_solved_model_still_trains_deeper_runs_another_grid_needs(tmp_path, capsys):
    chain = Grid(task="a5", models=["rope"], layers=[1, 2], seeds=[0], sets=["task.length=8"],
                 until_solved=True)
    plain = Grid(task="a5", models=["rope"], layers=[2], seeds=[0], sets=["task.length=8"])
    solved_first = chain.runs("cpu")[0]
    assert solved_first.model.layers == 1
    store.write_json_atomic(tmp_path / solved_first.run_id / "result.json",
                            _fake_record(solved_first, 0.95))
    dropped = []
    schedule = Schedule([(chain, chain.runs("cpu")), (plain, plain.runs("cpu"))],
                         tmp_path, dropped.extend)
    assert [c.run_id for c in schedule.next_pack()] == [plain.runs("cpu")[0].run_id]
    assert dropped == []
    run_grids([chain, plain], out=tmp_path, device="cpu", workers=1, executor="local",
              slurm_params={}, dry_run=True)
    marks = Counter(line.split()[0] for line in capsys.readouterr().out.splitlines()
                    if not line.startswith("sweep"))
    assert marks == {"done": 1, "todo": 2}  # the two-layer run, listed once per grid


def test_runs_shared_by_two_grids_train_once_and_release_both(tmp_path):
    deep = Grid(task="a5", models=["rope"], layers=[1, 2], seeds=[0, 1], sets=["task.length=8"],
                until_solved=True)
    shallow = Grid(task="a5", models=["rope"], layers=[1], seeds=[0, 1], sets=["task.length=8"])
    schedule = Schedule([(deep, deep.runs("cpu")), (shallow, shallow.runs("cpu"))],
                         tmp_path, lambda runs: None)
    handed = []
    while (pack := schedule.next_pack()) is not None:
        for run in pack:
            handed.append(run.run_id)
            store.write_json_atomic(tmp_path / run.run_id / "result.json",
                                    _fake_record(run, 0.5))
            schedule.ended(run.run_id)
    assert sorted(handed) == sorted(c.run_id for c in deep.runs("cpu"))  # each once


# --- training data and schedule ----------------------------------------------------------------


@pytest.mark.parametrize("on_device", [False, True])
def test_training_batches_are_fresh_and_a_function_of_the_run_seed(monkeypatch, on_device):
    """Drawn with numpy, or by the task's device sampler (as on a GPU; here on the CPU); a
    member's batches are the same in any pack."""
    import numpy as np
    import torch

    from pathbench.runners.training import loop
    from pathbench.runners.training.loop import TrainingData
    from pathbench.tasks import make_task

    monkeypatch.setattr(loop, "on_device_data", lambda task, device: on_device)
    monkeypatch.setattr(loop, "TOKENS_PER_DEVICE_DRAW", 32 * 64 * 16)  # 16 steps a draw
    task = make_task("flipflop", {"length": 64})

    def first_batches(seeds, steps=70):  # several draws
        data = TrainingData(task, 32, seeds, 64, torch.device("cpu"))
        taken = []
        for step in range(steps):
            if step % data.steps_per_draw == 0:
                data.refill()
            taken.append(data.inputs[step % data.steps_per_draw].view(len(seeds), 32, 64).clone())
        data.close()
        assert data.steps_per_draw == (16 if on_device else 1024 // 32)
        return torch.stack(taken, dim=1).numpy()  # [members, steps, B, T]

    [first] = first_batches([3])
    assert np.array_equal(first, first_batches([3])[0])
    assert not np.array_equal(first, first_batches([4])[0])
    assert np.array_equal(first_batches([4, 3])[1], first)  # as alone, in a pack
    assert len({row.tobytes() for row in first.reshape(-1, 64)}) == 70 * 32  # all distinct


def test_learning_rate_warms_up_then_decays_to_zero():
    from pathbench.runners.training.loop import lr_factor

    factors = [lr_factor(step, total=1000, warmup=100) for step in range(1000)]
    assert factors[0] == 0.01 and factors[99] == 1.0
    assert all(a >= b for a, b in zip(factors[99:], factors[100:]))
    assert factors[-1] < 1e-4
    # A short run keeps the shape: the warm-up is capped at a tenth of the steps.
    assert lr_factor(9, total=100, warmup=500) == 1.0
    constant = [lr_factor(step, total=1000, warmup=100, schedule="constant") for step in range(1000)]
    assert constant[:100] == factors[:100] and set(constant[100:]) == {1.0}


def test_wsd_holds_the_peak_then_decays_linearly_and_a_longer_budget_keeps_its_start():
    from pathbench.runners.training.loop import lr_factor

    def wsd(total):
        return [lr_factor(step, total=total, warmup=100, schedule="wsd", decay=0.2)
                for step in range(total)]

    short, long = wsd(1000), wsd(2000)
    assert short[:100] == [(step + 1) / 100 for step in range(100)]  # the warm-up
    assert set(short[100:800]) == {1.0}  # the stable part
    # the last fifth decays linearly: 200 steps from 1 down to 1/200
    assert short[800:] == pytest.approx([(1000 - step) / 200 for step in range(800, 1000)])
    assert long[:800] == short[:800]  # a longer budget changes nothing before its decay


def _scripted_val(monkeypatch, values):
    """A tiny flip-flop model, its task and device, with val's accuracy at the successive
    checks scripted to be ``values``."""
    import torch

    from pathbench.models import build_model, model_config
    from pathbench.runners.training import loop
    from pathbench.tasks import make_task

    checks = iter(values)
    real_evaluate = loop.evaluate

    def scripted(model, members, task, data, batch_tokens, device, progress=False):
        if data.split != "val":
            return real_evaluate(model, members, task, data, batch_tokens, device, progress)
        return [{"accuracy": next(checks)}] * members

    monkeypatch.setattr(loop, "evaluate", scripted)
    task = make_task("flipflop", {"length": 16})
    model = build_model(model_config({"attention": "rope", "layers": 1, "heads": 2,
                                      "d_model": 16, "vocab_size": len(task.vocab)}))
    return model, task, torch.device("cpu")


@pytest.mark.parametrize("values, patience, outcome", [
    # (val at each of the checks every 2 steps, patience, (steps, stop reason, budget-limited))
    ([0.5, 0.6, 0.6, 0.6, 0.7], 2, (8, "patience", False)),  # no new best at steps 6 and 8
    ([0.5, 0.6, 0.6, 0.7, 0.8], 2, (10, "step cap", True)),  # still improving at the cap
    ([0.5, 0.6, 0.7, 0.6, 0.6], 3, (10, "step cap", True)),  # best two checks before the cap
    ([0.5, 0.6, 0.7, 0.6, 0.6], None, (10, "step cap", False)),  # no new best at the last
    ([0.5, 0.9, 0.9, 0.9, 0.9], None, (4, "threshold", False)),  # early stop at 0.9
])
def test_runs_end_when_val_stops_improving_and_say_whether_the_budget_cut_them(
        monkeypatch, values, patience, outcome):
    from pathbench.runners.training.config import train_config
    from pathbench.runners.training.loop import Member, train

    model, task, device = _scripted_val(monkeypatch, values)
    settings = train_config({"steps": 10, "batch_size": 4, "eval_every": 2, "eval_num": 8,
                             "early_stop": 0.9, "patience": patience})
    [result] = train(model, task, settings, [Member(0, 1e-3, [])], device, progress=False)
    assert (result.steps, result.stop_reason, result.budget_limited) == outcome
    assert result.stopped_early == (outcome[1] in ("threshold", "patience"))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="compiled steps and CUDA graphs need a CUDA GPU (run on the GPU machine)")
@pytest.mark.parametrize("attention, backend", [
    *((name, "auto") for name in ("nope", "rope", "sba", "fox", "path", "path_fox", "deltanet",
                                  "deltaproduct", "rwkv7")),
    # the recurrent mixers in pathbench's own torch code, without fla-core
    *((name, "torch") for name in ("deltanet", "gated_deltanet", "deltaproduct", "rwkv7"))])
def test_compiled_graph_replayed_training_matches_eager_training_on_cuda(attention, backend):
    import torch

    from pathbench.models import build_model, model_config
    from pathbench.models.pack import pack_models
    from pathbench.runners.training.optimizer import PackedAdamW
    from pathbench.runners.training.loop import TrainStep
    from pathbench.tasks import make_task

    task = make_task("a5", {"length": 20})
    data = task.generate(12 * 64, seed=5, split="train")
    inputs = torch.from_numpy(data.inputs).cuda().view(12, 64, -1)  # 12 steps of two members
    targets = torch.from_numpy(data.targets).cuda().view(12, 64, -1)
    device = torch.device("cuda")
    peak_lrs, runs = [3e-3, 1e-3], []
    for eager in (False, True):
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(build_model(model_config({
                "attention": attention, "layers": 2, "heads": 2, "d_model": 64,
                "vocab_size": len(task.vocab), "backend": backend})))
        model = pack_models(models).cuda()
        step = TrainStep(model, PackedAdamW(model, peak_lrs, weight_decay=0.1,
                                            grad_clip=1.0, member_axis=True),
                         inputs, targets, lambda n: (n + 1) / len(inputs), device)
        if eager:  # the plain computation: not compiled, no graph
            step.forward_losses = step._forward_losses
            step.EAGER_CUDA_STEPS = len(inputs)
        losses = []
        for i in range(len(inputs)):
            step()
            losses += step.read_losses()
        assert (step.graph is None) == eager
        runs.append((torch.tensor(losses), torch.cat([p.detach().flatten().float()
                                                          for p in model.parameters()]).cpu(),
                     step.scored.cpu(), step.correct.cpu()))
    (fast_losses, fast_params, fast_scored, fast_correct), (eager_losses, eager_params, scored,
                                                           correct) = runs
    assert fast_scored.tolist() == scored.tolist() == [12 * 32 * 20] * 2
    # the hit counts come from the compiled forward too; rounding may flip a near tie
    assert ((fast_correct - correct).abs() <= scored // 100).all(), (fast_correct, correct)
    # Compiled kernels keep bfloat16 intermediates in float32, so the two differ by bfloat16
    # rounding, which twelve updates carry on. The learning rate ramps up from a twelfth: at
    # its peak from the first step, AdamW's first update is the learning rate times the sign
    # of each gradient, and a gradient near zero has its sign set by that rounding.
    torch.testing.assert_close(fast_losses[0], eager_losses[0], rtol=2e-3, atol=0)
    torch.testing.assert_close(fast_losses, eager_losses, rtol=1e-2, atol=0)
    # A parameter whose gradient stays near zero can take the other sign's update at every
    # step, so a few may drift apart by up to twice the learning rate a step; a wrong gradient
    # or a missed update moves whole tensors.
    apart = ~torch.isclose(fast_params, eager_params, rtol=1e-2, atol=1e-3)
    assert apart.sum() <= len(eager_params) // 10_000, (apart.sum(), apart.nonzero()[:8])
    torch.testing.assert_close(fast_params, eager_params, rtol=0,
                               atol=2 * len(inputs) * max(peak_lrs))
    assert not torch.equal(eager_losses[0], eager_losses[-1])  # it trained


class _Connection:
    """A worker's end of the pipe: hands out the messages given, keeps what is sent back."""

    def __init__(self, messages):
        self.messages, self.sent = list(messages), []

    def recv(self):
        return self.messages.pop(0)

    def send(self, value):
        self.sent.append(value)


def _failing_runs(runs, out, progress):
    """execute_runs for a GPU that fails every run."""
    return [{"run_id": run.run_id, "status": "failed", "reason": "AcceleratorError: CUDA error"}
            for run in runs]


@pytest.mark.parametrize("cuda_lost", [False, True])
def test_worker_leaves_when_a_failed_pack_took_the_gpu_with_it(monkeypatch, tmp_path, cuda_lost):
    from pathbench.runners.sweep import executors

    monkeypatch.setattr(executors, "execute_runs", _failing_runs)
    monkeypatch.setattr(executors, "_cuda_lost", lambda: cuda_lost)
    connection = _Connection([([SimpleNamespace(run_id="a")], str(tmp_path)),
                              ([SimpleNamespace(run_id="b")], str(tmp_path)), None])
    executors._serve(connection, threads=1, gpu=None, sweep=os.getppid())
    # The worker says whether its GPU is lost along with the pack's outcomes; then it takes no
    # second pack (the pool starts a fresh one in its place), or goes on.
    summary = {"run_id": "a", "status": "failed", "reason": "AcceleratorError: CUDA error"}
    assert connection.sent[0] == ([summary], cuda_lost)
    assert len(connection.sent) == (1 if cuda_lost else 2)


def test_pool_replaces_a_worker_that_lost_its_gpu_and_loses_no_pack(monkeypatch, tmp_path):
    import multiprocessing

    from pathbench.runners.sweep import executors

    # Forked workers inherit these stand-ins: every pack fails and takes the GPU with it.
    monkeypatch.setattr(executors, "execute_runs", _failing_runs)
    monkeypatch.setattr(executors, "_cuda_lost", lambda: True)
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(executors.multiprocessing, "get_context", lambda method: fork)
    packs = [[SimpleNamespace(run_id=f"p{i}")] for i in range(4)]
    reported = []
    pool = executors.LocalPool(1)
    try:
        pool.run(lambda: packs.pop(0) if packs else None, tmp_path,
                 lambda name, summary: reported.append((name, summary and summary["status"])))
    finally:
        pool.close()
    assert reported == [(f"p{i}", "failed") for i in range(4)]  # none "lost" (None)


def _forked_workers(monkeypatch, execute_runs):
    """LocalPool's workers forked from this process, so that they inherit ``execute_runs``."""
    import multiprocessing

    from pathbench.runners.sweep import executors

    monkeypatch.setattr(executors, "execute_runs", execute_runs)
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(executors.multiprocessing, "get_context", lambda method: fork)


def _runs_forever(runs, out, progress):
    import time

    time.sleep(3600)


def test_the_sweep_runs_any_registered_executor_through_its_interface(tmp_path, monkeypatch,
                                                                      capsys):
    """An executor registered by name trains what the sweep hands it and says what it did;
    the sweep asks it for the device and, in a dry run, for its plan."""
    from pathbench.registry import Entry
    from pathbench.runners.sweep.executors import EXECUTORS, Executor

    calls = []

    class Recording(Executor):
        def device(self, device):
            calls.append(("device", device))
            return "cpu"

        def plan(self, packs):
            return [f"{len(packs)} packs for {self.workers} workers, {self.params}"]

        def run(self, next_pack, out, report, runs):
            calls.append(("run", runs))
            while (pack := next_pack()) is not None:
                for run in pack:
                    report(run.run_id, {"run_id": run.run_id, "status": "diverged",
                                        "reason": "made up"})
            return None

    # registered for this test alone: the registry's tables are restored afterwards
    monkeypatch.setattr(EXECUTORS, "_loaded", dict(EXECUTORS._loaded))
    monkeypatch.setitem(EXECUTORS._builtins, "recording", Entry("recording", "test",
                                                                lambda: Recording))
    grid = Grid(task="flipflop", models=["rope"], seeds=[0, 1, 2], d_model=16, pack=2)
    run_grids([grid], out=tmp_path / "planned", device="auto", workers=3, executor="recording",
              slurm_params={"key": 1}, dry_run=True)
    assert capsys.readouterr().out.splitlines()[-1] == "2 packs for 3 workers, {'key': 1}"
    counts = run_grids([grid], out=tmp_path, device="auto", workers=3, executor="recording",
                       slurm_params={"key": 1})
    assert calls == [("device", "auto")] * 2 + [("run", 3)] and counts["diverged"] == 3


def _reports_its_gpu(runs, out, progress):
    """execute_runs that records nothing and reports the GPUs its process may use."""
    return [{"run_id": run.run_id, "status": "ok",
             "reason": os.environ.get("CUDA_VISIBLE_DEVICES", "unset")} for run in runs]


@pytest.mark.parametrize("gpus, seen", [(["0", "1", "2"], ["0", "1", "2", "0"]),
                                        (["0"], ["unset"] * 4), ([], ["unset"] * 4)])
def test_local_workers_are_spread_over_the_visible_gpus(monkeypatch, tmp_path, capsys, gpus,
                                                        seen):
    """Four workers on three GPUs: worker i on GPU i mod 3; with one GPU or none, the workers
    see what the sweep sees."""
    from pathbench.runners.sweep import executors

    _forked_workers(monkeypatch, _reports_its_gpu)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(executors, "visible_gpus", lambda: gpus)
    packs = [[SimpleNamespace(run_id=f"p{i}")] for i in range(4)]
    workers_gpus = {}

    def next_pack():  # one pack to each of the four workers, then none
        return packs.pop(0) if packs else None

    executor = executors.LocalExecutor(4, {})
    executor.run(next_pack, tmp_path, lambda name, summary: workers_gpus.update(
        {name: summary["reason"]}), runs=4)
    assert [workers_gpus[f"p{i}"] for i in range(4)] == seen


def test_a_sweeps_summary_lists_outcomes_in_one_order_whatever_order_they_came_in():
    from pathbench.runners.sweep.orchestrate import summary_line

    came = ["lost", "skipped (solved at fewer layers)", "ok", "already done", "ok", "diverged"]
    expected = "2 ok, 1 diverged, 1 lost, 1 skipped (solved at fewer layers), 1 already done"
    assert summary_line(Counter(came)) == summary_line(Counter(reversed(came))) == expected


def test_a_worker_killed_mid_pack_reports_each_of_its_runs_lost(monkeypatch, tmp_path, capsys):
    import signal

    from pathbench.runners.sweep import executors

    _forked_workers(monkeypatch, _runs_forever)
    pool = executors.LocalPool(2)
    handed = [[SimpleNamespace(run_id="a"), SimpleNamespace(run_id="b")]]

    def next_pack():
        if handed:
            return handed.pop()
        if pool.workers[0].runs:  # the first worker holds the pack: kill it mid-pack, once
            os.kill(pool.workers[0].process.pid, signal.SIGKILL)
        return None

    reported = []
    try:
        pool.run(next_pack, tmp_path, lambda name, summary: reported.append((name, summary)))
    finally:
        pool.close()
    assert reported == [("a", None), ("b", None)]
    assert "a, b: lost: its worker died" in capsys.readouterr().err


def test_workers_stop_when_their_sweep_is_killed(monkeypatch, tmp_path):
    """A sweep killed mid-pack (SIGKILL: it cannot ask them to stop) leaves no worker
    training on."""
    import multiprocessing
    import signal
    import time

    from pathbench.runners.sweep import executors

    _forked_workers(monkeypatch, _runs_forever)

    def sweep(report):
        pool = executors.LocalPool(2)
        handed = [[SimpleNamespace(run_id="a")], [SimpleNamespace(run_id="b")]]
        report.send([worker.process.pid for worker in pool.workers])
        pool.run(lambda: handed.pop() if handed else None, tmp_path, lambda *_: None)

    ours, theirs = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=sweep, args=(theirs,))
    process.start()
    workers = ours.recv()
    time.sleep(1)  # both workers are in their packs
    assert all(_alive(pid) for pid in workers)
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sweep_that_lost_runs_says_so_and_exits_1(monkeypatch, tmp_path, capsys):
    """A worker dies on the pack of seed 1; the other pack is recorded."""
    import signal

    def dies_on_seed_1(runs, out, progress):
        if any(run.seed == 1 for run in runs):
            os.kill(os.getpid(), signal.SIGKILL)
        return [{"run_id": run.run_id, "status": "ok", "reason": None} for run in runs]

    _forked_workers(monkeypatch, dies_on_seed_1)
    code, stdout, stderr = cli(capsys, "sweep", "flipflop", "--models", "rope", "--seeds", "0,1",
                               "--d-model", "16", "--workers", "2", "--device", "cpu",
                               "--out", tmp_path)
    assert code == 1
    assert sweep_counts(stdout) == {"ok": 1, "lost": 1}
    assert "lost: its worker died" in stderr and "run the same command again" in stderr


def test_sweep_in_one_process_stops_when_a_failed_pack_took_the_gpu(monkeypatch, tmp_path):
    from pathbench.runners.sweep import executors, orchestrate as sweep

    monkeypatch.setattr(executors, "execute_runs", _failing_runs)
    monkeypatch.setattr(executors, "_cuda_lost", lambda: True)
    grid = Grid(task="flipflop", models=["rope", "path"], seeds=[0, 1], d_model=16)
    counts = run_grids([grid], out=tmp_path, device="cpu", workers=1, executor="local",
                       slurm_params={})
    assert counts["failed"] == 1 and counts[sweep.GPU_LOST] == 1  # the other three not tried


def test_tasks_bring_their_cpu_presets():
    """A task's presets lie over its run_defaults under the cpu preset."""
    cpu, paper = (resolve_run("mqrar", device="cpu").config,
                  resolve_run("mqrar", device="cuda").config)
    assert (cpu["task"]["config"]["length"], cpu["task"]["config"]["num_keys"]) == (64, 4)
    assert cpu["model"]["d_model"] == 64 and cpu["train"]["steps"] == 600
    assert paper["task"]["config"]["length"] == 768 and paper["model"]["d_model"] == 256
    a5 = resolve_run("a5", device="cpu").config
    paper_a5 = resolve_run("a5", device="cpu", preset="paper").config
    assert a5["task"]["config"]["length"] == 3 and paper_a5["task"]["config"]["length"] == 20
    assert a5["train"]["schedule"] == "constant" and a5["model"] == paper_a5["model"]
    s5 = resolve_run("s5", device="cpu").config  # S5 has its own: words of 2, one layer
    assert (s5["task"]["config"]["length"], s5["model"]["layers"]) == (2, 1)
    from pathbench.registry import BUILTIN
    from pathbench.tasks import TASKS

    builtins = [name for name, entry in TASKS.entries().items() if entry.origin == BUILTIN]
    assert len(builtins) == 6 and all("cpu" in TASKS.get(name).presets for name in builtins)
