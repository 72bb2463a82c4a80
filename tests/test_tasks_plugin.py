"""The example plugin (tests/plugin), installed with pip and used through the command line."""

import numpy as np

PLUGIN = "pathbench-plugin-parity"


def test_ls_shows_plugin_tasks_with_their_package(plugin_cli):
    result = plugin_cli("ls")
    assert result.returncode == 0, result.stderr
    assert f"  parity  ({PLUGIN}, version 1)" in result.stdout
    assert "running parity of a bit string" in result.stdout
    # The broken plugin is listed with its error; it does not stop the listing.
    broken = result.stdout.split("  broken  ")[1].splitlines()
    assert PLUGIN in broken[0] and "pathbench_plugin_missing_dependency" in broken[1]
    # The colliding name is the built-in, listed once.
    assert result.stdout.count("  flipflop  ") == 1
    assert "  flipflop  (built-in, version 1)" in result.stdout


def test_plugin_task_generates_correct_data(plugin_cli, tmp_path):
    result = plugin_cli("data", "parity", "--num", "50", "--set", "task.length=24", "--out", "p.npz")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "p.npz") as saved:
        vocab = saved["vocab"].tolist()
        inputs, targets = saved["inputs"], saved["targets"]
    assert inputs.shape == (50, 24)
    for bits, answers in zip(inputs, targets):
        ones = 0
        for bit, answer in zip(bits, answers):
            ones += vocab[bit] == "1"
            assert vocab[answer] == ("odd" if ones % 2 else "even")


def test_plugin_task_that_names_its_length_is_tested_longer(plugin_cli, tmp_path):
    result = plugin_cli("data", "parity", "--split", "test_48", "--num", "5", "--set",
                        "task.length=24", "--set", "task.eval_lengths=48", "--out", "long.npz")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "long.npz") as saved:
        assert saved["inputs"].shape == (5, 48)


def test_plugin_task_has_a_val_split_on_its_own_stream(plugin_cli, tmp_path):
    arrays = {}
    for split in ["train", "val", "test"]:
        result = plugin_cli("data", "parity", "--split", split, "--num", "20",
                            "--set", "task.length=16", "--out", f"{split}.npz")
        assert result.returncode == 0, result.stderr
        with np.load(tmp_path / f"{split}.npz") as saved:
            arrays[split] = saved["inputs"]
    assert not np.array_equal(arrays["val"], arrays["train"])
    assert not np.array_equal(arrays["val"], arrays["test"])
    result = plugin_cli("data", "parity", "--split", "dev", "--show", "1")
    assert result.returncode == 2 and "valid splits: train, val, test" in result.stderr


def errors(stderr: str) -> list[str]:
    """stderr's lines but the warning every command of this plugin environment prints: its
    package registers "flipflop", a built-in's name, on purpose."""
    return [line for line in stderr.splitlines()
            if not (line.startswith("pathbench: warning: ") and "'flipflop'" in line)]


def test_broken_plugin_fails_only_when_used_and_is_named(plugin_cli):
    result = plugin_cli("data", "broken", "--show", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(errors(result.stderr)) == 1
    assert f"plugin package '{PLUGIN}'" in result.stderr
    assert "pathbench_plugin_missing_dependency" in result.stderr
    assert plugin_cli("data", "a5", "--show", "1").returncode == 0


def test_built_in_wins_a_name_collision(plugin_cli):
    result = plugin_cli("data", "flipflop", "--set", "task.length=8", "--show", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2].split()[0] == "w"  # flip-flop tokens, not bits
    assert result.stderr == (f"pathbench: warning: plugin package '{PLUGIN}' registers task "
                             f"'flipflop', which pathbench (built-in) already registers; the "
                             f"name stays pathbench (built-in)'s\n")


def test_plugin_task_and_attention_train_end_to_end_and_are_recorded(plugin_cli, tmp_path):
    """The guide's example (docs/plugins.md): a plugin task trained by a plugin attention, on
    the task's own cpu preset; the record names both packages and their version."""
    import json

    result = plugin_cli("run", "parity", "--model", "alibi", "--steps", "20", "--device", "cpu",
                        "--out", "runs")
    assert result.returncode == 0, result.stderr
    [path] = (tmp_path / "runs").glob("*/result.json")
    record = json.loads(path.read_text())
    assert record["config"]["task"]["config"]["length"] == 16  # the plugin's cpu preset
    assert record["config"]["train"]["eval_num"] == 256
    assert record["provenance"]["plugins"] == {
        "task": {"name": "parity", "package": PLUGIN, "version": "0.1.0"},
        "attention": {"name": "alibi", "package": PLUGIN, "version": "0.1.0"}}
    assert record["baselines"]["test"] == {"chance": 0.5}


def test_a_broken_attention_plugin_is_a_usage_error_naming_it(plugin_cli, tmp_path):
    result = plugin_cli("run", "parity", "--model", "broken", "--device", "cpu", "--out", "runs")
    assert result.returncode == 2 and len(errors(result.stderr)) == 1
    assert f"attention 'broken' from plugin package '{PLUGIN}' failed to load" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_the_guide_shows_the_installed_example_verbatim():
    """docs/plugins.md's code is the package these tests install, so the guide cannot drift."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    guide = (root / "docs" / "plugins.md").read_text()
    blocks = guide.split("```python\n")[1:]
    shown = [block.split("```")[0] for block in blocks]
    for name in ("pathbench_plugin_parity.py", "pathbench_plugin_attention.py"):
        assert (root / "tests" / "plugin" / name).read_text() in shown, name
    entry_points = guide.split("```toml\n")[1].split("```")[0]
    pyproject = (root / "tests" / "plugin" / "pyproject.toml").read_text()
    for line in entry_points.splitlines():
        assert line in pyproject, line
