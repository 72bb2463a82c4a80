"""Models with set weights: the two-layer PaTH flip-flop construction makes no error on any
split at any length, breaks when its erasing Householders are taken out, and is recorded by
`pathbench construct` as a run that the tables read beside trained ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pathbench.models.constructions import (
    CONSTRUCTIONS,
    LOOK,
    UNUSED,
    flipflop_two_layer_path,
)
from pathbench.tasks import IGNORE_INDEX, make_task
from pathbench.tasks.flipflop import VOCAB, WRITE
from conftest import cli


def construction():
    return flipflop_two_layer_path(VOCAB)


def read_errors(model, length: int, split: str, num: int, seed: int) -> tuple[int, int]:
    """(wrong reads, reads) of ``model`` on ``num`` fresh flip-flop sequences."""
    data = make_task("flipflop", {"length": length}).generate(num, seed, split)
    with torch.no_grad():
        predictions = model(torch.from_numpy(data.inputs)).argmax(-1).numpy()
    scored = data.targets != IGNORE_INDEX
    return int((predictions[scored] != data.targets[scored]).sum()), int(scored.sum())


def test_the_construction_is_the_flipflop_model_of_two_path_layers():
    config = construction().config
    assert (config.attention, config.layers, config.heads, config.d_model) == ("path", 2, 2, 64)
    assert CONSTRUCTIONS["flipflop"].build is flipflop_two_layer_path


def test_the_construction_follows_the_tokens_not_their_order():
    """Built for the vocabulary in another order, it reads the same sequences, renumbered."""
    order = [3, 0, 4, 1, 2]
    model = flipflop_two_layer_path([VOCAB[i] for i in order])
    data = make_task("flipflop", {"length": 256}).generate(16, 0, "dense")
    renumber = np.argsort(order)  # old token id -> new
    with torch.no_grad():
        predictions = model(torch.from_numpy(renumber[data.inputs])).argmax(-1).numpy()
    scored = data.targets != IGNORE_INDEX
    assert (predictions[scored] == renumber[data.targets[scored]]).all()


@pytest.mark.parametrize("split", ["train", "val", "test", "sparse", "dense"])
def test_no_read_error_on_any_split(split):
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh sequences every time
    errors, reads = read_errors(construction(), 512, split, 64, seed)
    assert reads > 0 and errors == 0, f"{errors} of {reads} reads wrong (seed {seed})"


@pytest.mark.parametrize("length, num", [(4096, 2), (16384, 1)])
def test_no_read_error_far_beyond_any_training_length(length, num):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    errors, reads = read_errors(construction(), length, "test", num, seed)
    assert reads > 100 * num and errors == 0, f"{errors} of {reads} reads wrong (seed {seed})"


def test_without_erasing_the_last_write_is_not_found():
    """Layer 2's ``w`` tokens keep instead of erase: the reads see every written bit, and many
    go wrong; so the zero errors above come from the erasure, not from easy data."""
    model = construction()
    with torch.no_grad():
        w_up = model.blocks[1].attn.w_up.weight
        w_up[LOOK, WRITE], w_up[UNUSED, WRITE] = 0.0, 1.0
    errors, reads = read_errors(model, 512, "test", 64, seed=0)
    assert errors > reads / 10


def test_construct_records_a_run_that_tables_show_beside_trained_ones(capsys, tmp_path):
    from pathbench.runners.analysis.records import load_frame

    code, out, err = cli(capsys, "construct", "flipflop", "--device", "cpu", "--out", tmp_path,
                         "--set", "train.eval_num=8", "--set", "train.eval_sizes=sparse:16",
                         "--set", "task.eval_lengths=1024")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[2:]] == [
        "test", "sparse", "dense", "test_1024"]
    [row] = load_frame(tmp_path).to_dict("records")
    assert (row["model"], row["layers"], row["steps"], row["status"]) == (
        "path_construction", 2, 0, "ok")
    assert row["val:accuracy"] == row["test_1024:accuracy"] == 1.0


def test_construct_refuses_tasks_without_a_construction_and_model_settings(capsys, tmp_path):
    code, _, err = cli(capsys, "construct", "a5", "--out", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "constructions exist for flipflop" in err
    code, _, err = cli(capsys, "construct", "flipflop", "--out", tmp_path,
                       "--set", "model.layers=3")
    assert code == 2 and err.count("\n") == 1 and "model.layers" in err
    assert not any(tmp_path.iterdir())


def test_a_sweep_file_scores_its_constructions_once_beside_its_runs(capsys, tmp_path):
    """A [[construct]] table: the dry run lists the construction as todo, the sweep scores it
    with the same record `construct` writes, and the same command again finds it done."""
    sweep_file = tmp_path / "grids.toml"
    sets = '["train.eval_num=8", "train.eval_sizes=sparse:16", "task.eval_lengths=1024"]'
    sweep_file.write_text(f'[[sweep]]\ntask = "flipflop"\nmodels = ["rope"]\nlayers = [1]\n'
                          f'set = ["train.steps=2", "train.eval_num=8", '
                          f'"train.eval_sizes=sparse:16"]\n\n'
                          f'[[construct]]\ntask = "flipflop"\npreset = "cpu"\nset = {sets}\n')
    out = tmp_path / "runs"
    sweep = ("sweep", "--file", sweep_file, "--device", "cpu", "--out", out)
    code, stdout, _ = cli(capsys, *sweep, "--dry-run")
    assert code == 0
    assert [line.split()[0] for line in stdout.splitlines()
            if "construction" in line] == ["todo"]
    code, stdout, stderr = cli(capsys, *sweep)
    assert code == 0, stderr
    assert "sweep finished: 2 ok; records" in stdout  # the trained run and the construction
    code, _, _ = cli(capsys, "construct", "flipflop", "--device", "cpu", "--preset", "cpu",
                     "--out", tmp_path / "alone", "--set", "train.eval_num=8",
                     "--set", "train.eval_sizes=sparse:16", "--set", "task.eval_lengths=1024")
    assert code == 0
    [alone] = [path.name for path in (tmp_path / "alone").iterdir()]
    assert (out / alone / "result.json").is_file()  # the same record, by the same name
    code, stdout, _ = cli(capsys, *sweep)
    assert "2 already done" in stdout
    code, _, stderr = cli(capsys, "sweep", "--file", _bad(tmp_path), "--dry-run")
    assert code == 2 and "a [[construct]] table has a task" in stderr


def _bad(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[sweep]]\ntask = "flipflop"\n\n[[construct]]\nmodels = ["path"]\n')
    return path


def test_a_sweep_without_constructions_asks_nothing_of_its_device(tmp_path):
    """A Slurm sweep plans --device cuda on a login node without a GPU: no construction, no
    device to resolve."""
    from pathbench.runners.sweep.orchestrate import score_constructions

    assert score_constructions([], out=tmp_path, device="cuda") == {}
