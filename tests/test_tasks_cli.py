"""`pathbench ls` and `pathbench data`, run as a user runs them (in a subprocess)."""

import json

import numpy as np
import pandas as pd
import pytest

from pathbench.tasks import make_task


def test_ls_lists_every_built_in_with_version_description_and_defaults(pathbench_cli):
    result = pathbench_cli("ls")
    assert result.returncode == 0, result.stderr
    for name in ["flipflop", "a5", "s5", "a4xz5", "z60"]:
        assert f"  {name}  (built-in, version 1)" in result.stdout
    assert "  mqrar  (built-in, version 2)" in result.stdout
    assert "defaults: length=512" in result.stdout
    assert "n_back=2" in result.stdout and "num_keys=32" in result.stdout
    # each task's presets, in the --set syntax
    assert "cpu preset: task.length=3 train.steps=3000 train.batch_size=256" in result.stdout
    assert "train.eval_sizes=sparse:8192" in result.stdout


def test_npz_round_trip(pathbench_cli, tmp_path):
    result = pathbench_cli("data", "mqrar", "--split", "test", "--num", "40", "--seed", "3",
                           "--set", "task.length=90", "--set", "task.n_back=3", "--out", "d.npz")
    assert result.returncode == 0, result.stderr
    expected = make_task("mqrar", {"length": 90, "n_back": 3}).generate(40, seed=3, split="test")
    with np.load(tmp_path / "d.npz") as saved:
        assert saved["inputs"].dtype == saved["targets"].dtype == np.int64
        assert np.array_equal(saved["inputs"], expected.inputs)
        assert np.array_equal(saved["targets"], expected.targets)
        assert saved["vocab"].tolist() == expected.vocab
        metadata = json.loads(str(saved["metadata"]))
    assert metadata["config"]["n_back"] == 3 and metadata["split"] == "test"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]  # no temporary file left


def test_parquet_round_trip(pathbench_cli, tmp_path):
    result = pathbench_cli("data", "a5", "--num", "25", "--set", "task.length=7", "--out", "d.parquet")
    assert result.returncode == 0, result.stderr
    expected = make_task("a5", {"length": 7}).generate(25, seed=0, split="train")
    frame = pd.read_parquet(tmp_path / "d.parquet")
    assert list(frame.columns) == ["inputs", "targets"] and len(frame) == 25
    assert np.array_equal(np.stack(frame["inputs"]), expected.inputs)
    assert np.array_equal(np.stack(frame["targets"]), expected.targets)
    assert frame.attrs["vocab"] == expected.vocab
    assert json.loads(frame.attrs["metadata"])["task"] == "a5"


def test_show_prints_tokens_and_marks_scored_positions(pathbench_cli):
    result = pathbench_cli("data", "flipflop", "--set", "task.length=12", "--show", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "scored positions are shown as input=>target" in lines[0]
    assert [line for line in lines if line.startswith("[")] == ["[0]", "[1]", "[2]"]
    expected = make_task("flipflop", {"length": 12}).generate(1000, seed=0, split="train")
    vocab = expected.vocab
    first = [vocab[t] if s == -100 else f"{vocab[t]}=>{vocab[s]}"
             for t, s in zip(expected.inputs[0], expected.targets[0])]
    assert lines[2].split() == first


def test_show_mqrar_marks_each_query_key_with_its_answer(pathbench_cli):
    result = pathbench_cli("data", "mqrar", "--split", "val", "--set", "task.length=40",
                           "--set", "task.num_keys=3", "--set", "task.num_values=4", "--show", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("mqrar (version 2) split=val seed=0, first 2 of 1000 sequences")
    assert [line for line in lines if line.startswith("[")] == ["[0]", "[1]"]
    expected = make_task("mqrar", {"length": 40, "num_keys": 3, "num_values": 4}).generate(
        1000, seed=0, split="val")
    vocab = expected.vocab
    shown = " ".join(lines[2:lines.index("[1]")]).split()
    assert shown == [vocab[t] if s == -100 else f"{vocab[t]}=>{vocab[s]}"
                     for t, s in zip(expected.inputs[0], expected.targets[0])]
    # A query reads "? Kx=>Vy": the answer is shown only as the target of the key.
    for before, word in zip(shown, shown[1:]):
        assert ("=>" in word) == (before == "?")
        if "=>" in word:
            key, answer = word.split("=>")
            assert key.startswith("K") and answer.startswith("V")


@pytest.mark.parametrize(
    "args, words",
    [
        (["data", "nope", "--show", "1"], ["unknown task 'nope'", "flipflop"]),
        (["data", "flipflop", "--set", "task.colour=red", "--show", "1"], ["'colour'", "length"]),
        (["data", "flipflop", "--set", "task.length=-2", "--show", "1"], ["'length'", ">= 4"]),
        (["data", "flipflop", "--set", "task.length", "--show", "1"],
         ["--set expects", "task.KEY=VALUE"]),
        (["data", "flipflop", "--set", "length=8", "--show", "1"], ["--set expects", "task.KEY"]),
        (["data", "flipflop", "--set", "model.layers=2", "--show", "1"],
         ["task settings only", "model.layers"]),
        (["data", "flipflop", "--set", "task.length=8", "--set", "task.length=16", "--show", "1"],
         ["task.length", "twice"]),
        (["data", "flipflop", "--split", "validation", "--show", "1"],
         ["'validation'", "train, val, test, sparse"]),
        (["data", "flipflop", "--out", "missing/d.npz"], ["cannot write", "missing/d.npz"]),
        (["data", "flipflop", "--out", "d.csv"], ["'.csv'", ".npz or .parquet"]),
        (["data", "flipflop", "--num", "0", "--show", "1"], ["--num"]),
        (["data", "flipflop"], ["--out", "--show"]),
        (["data", "flipflop", "--num", "10000000000", "--show", "1"],
         ["10,000,000,000 sequences of 512 tokens", "at most 268,435,456"]),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(pathbench_cli, tmp_path, args, words):
    result = pathbench_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pathbench: error: ")
    assert all(word in lines[0] for word in words), lines[0]
    assert list(tmp_path.iterdir()) == []
