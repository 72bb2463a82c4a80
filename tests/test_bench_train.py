"""`pathbench bench train` on a CPU at a tiny shape: the table and CSV it writes, and the same
measurement of another git revision's engine beside it (speed is printed, never asserted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import cli

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_measures_this_tree_and_another_revision_side_by_side(tmp_path, capsys):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("needs a git checkout: --against reads a revision from git")
    out = tmp_path / "train.csv"
    code, stdout, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--attentions",
                               "rope", "--packs", "1,2", "--steps", "6", "--interval", "2",
                               "--device", "cpu", "--against", "HEAD", "--out", out)
    assert code == 0, stderr
    table = [line for line in stdout.splitlines() if line.startswith("| smoke |")]
    assert [line.split(" | ")[1:3] for line in table] == [["rope", "1"], ["rope", "2"]]
    for line in table:  # both engines measured, and their ratio
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[7]) > 0 and float(cells[-1]) > 0
    rows = out.read_text().splitlines()
    assert rows[0].startswith("engine,shape,attention,pack,run_steps_per_s")
    assert sorted(row.split(",")[0] for row in rows[1:]) == ["new", "new", "old", "old"]

    # Again with one more pack size: the rows measured are kept, only the new ones measured.
    code, stdout, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--attentions",
                               "rope", "--packs", "1,2,3", "--steps", "6", "--interval", "2",
                               "--device", "cpu", "--against", "HEAD", "--out", out)
    assert code == 0, stderr
    assert stdout.count("(2 kept from") == 2
    assert [line for line in stdout.splitlines() if line.startswith("  smoke")] == [
        line for line in stdout.splitlines() if line.startswith("  smoke rope pack 3:")] != []
    again = out.read_text().splitlines()
    assert set(rows) < set(again) and len(again) == 1 + 6

    # Another attention, this engine only: every row measured before stays in the file.
    code, stdout, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--attentions",
                               "nope", "--steps", "6", "--interval", "2", "--device", "cpu",
                               "--out", out)
    assert code == 0, stderr
    table = [line for line in stdout.splitlines() if line.startswith("| smoke |")]
    assert [line.split(" | ")[1:3] for line in table] == [["nope", "1"]]
    last = out.read_text().splitlines()
    assert set(again) < set(last) and len(last) == 1 + 7


def test_bench_train_refuses_bad_choices_in_one_line(capsys):
    code, _, stderr = cli(capsys, "bench", "train", "--shapes", "huge", "--device", "cpu")
    assert code == 2 and "unknown 'huge'" in stderr and "smoke" in stderr
    code, _, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--steps", "10",
                          "--interval", "8", "--device", "cpu")
    assert code == 2 and "--steps must be at least twice --interval" in stderr
    code, _, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--steps", "4",
                          "--interval", "2", "--device", "cpu", "--against", "no-such-rev")
    assert code == 2 and "--against no-such-rev: neither a folder holding a pathbench " \
        "checkout nor a revision git can archive" in stderr
    code, _, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--steps", "4",
                          "--interval", "2", "--device", "cpu", "--against", "")
    assert code == 2 and "--against is empty: give a git revision" in stderr


def test_bench_train_measures_the_checkout_in_a_folder(tmp_path, capsys):
    """For a machine without the repository's history: a checkout's folder instead of a
    revision (here this checkout's own)."""
    code, stdout, stderr = cli(capsys, "bench", "train", "--shapes", "smoke", "--attentions",
                               "nope", "--steps", "4", "--interval", "2", "--device", "cpu",
                               "--against", str(ROOT))
    assert code == 0, stderr
    [line] = [line for line in stdout.splitlines() if line.startswith("| smoke |")]
    assert float(line.strip("|").split("|")[-1]) > 0  # the ratio of the two


def test_bench_step_splits_a_step_by_kind_of_kernel(capsys):
    from pathbench.runners.bench.step import kind_of

    code, stdout, stderr = cli(capsys, "bench", "step", "--shape", "smoke", "--attention", "rope",
                               "--pack", "2", "--steps", "3", "--device", "cpu")
    assert code == 0, stderr
    assert stdout.startswith("smoke, rope, pack 2, cpu: ") and "busy" in stdout
    rows = [line.split(" | ") for line in stdout.splitlines()[3:]]
    assert float(next(row[1] for row in rows if row[0] == "| matrix products")) > 0
    # and the longest operators by name, with their calls a step
    assert "operator calls a step; the 12 longest operators:" in stdout
    assert "| `aten::bmm` | matrix products | " in stdout
    assert kind_of("nvjet_sm90_tst_128x192") == kind_of("aten::bmm") == "matrix products"
    assert kind_of("gemv2T_kernel_val") == kind_of("gemmSN_TN_kernel") == "matrix products"
    assert kind_of("triton_poi_fused_gelu_view_11") == "fused elementwise (compiled)"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kind_of("within_scan_kernel") == "attention"
    code, _, stderr = cli(capsys, "bench", "step", "--shape", "huge", "--device", "cpu")
    assert code == 2 and "unknown 'huge'" in stderr and "smoke" in stderr


def test_bench_step_takes_the_models_backend(capsys):
    code, stdout, stderr = cli(capsys, "bench", "step", "--shape", "smoke", "--attention", "path",
                               "--backend", "torch", "--steps", "2", "--device", "cpu")
    assert code == 0, stderr
    assert stdout.startswith("smoke, path (backend torch), pack 1, cpu: ")
    code, _, stderr = cli(capsys, "bench", "step", "--shape", "smoke", "--attention", "rope",
                          "--backend", "triton", "--device", "cpu")
    assert code == 2 and "'triton' is not available for attention 'rope'" in stderr
    assert "valid choices: auto, torch" in stderr
