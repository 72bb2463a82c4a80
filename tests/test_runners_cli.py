"""The main job end to end on tiny configurations: run, sweep (local workers, a SIGKILLed
worker, resume, a corrupt record; Slurm in test_slurm.py), results, plot and inspect, and
one-line errors for bad input."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathbench.runners.training import store
from conftest import cli, sweep_counts

# A few seconds per run on a CPU: short flip-flop sequences, a narrow model, a handful of steps.
TINY = ["--d-model", "16", "--steps", "4", "--batch-size", "8", "--set", "task.length=16",
        "--set", "train.eval_num=16", "--set", "train.eval_every=2"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from more threads, and spare threads make runs wait for each
    other on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def results_of(out: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in out.glob("*/result.json")}


def test_run_trains_evaluates_and_records(tmp_path, capsys):
    out = tmp_path / "runs"
    code, stdout, _ = cli(capsys, "run", "flipflop", "--model", "rope", "--layers", "1", *TINY,
                          "--seed", "3", "--out", out)
    assert code == 0, stdout
    [run_dir] = list(out.iterdir())
    assert run_dir.name.startswith("flipflop-rope-L1-H2-D16-lr0.001-s3-")
    assert {p.name for p in run_dir.iterdir()} == {
        "config.json", "curve.jsonl", "result.json", "model.pt"}
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 4
    assert list(result["metrics"]) == ["test", "sparse", "dense"]
    assert 0 <= result["metrics"]["sparse"]["error"] <= 100
    assert result["config"] == json.loads((run_dir / "config.json").read_text())
    assert result["config"]["train"]["steps"] == 4 and result["config"]["seed"] == 3
    provenance = result["provenance"]
    for key in ("pathbench_version", "git_commit", "torch_version", "triton_version",
                "device_name", "task_version", "dataset_hash", "seed", "wall_time_s"):
        assert key in provenance
    assert len(provenance["dataset_hash"]) == 64 and provenance["wall_time_s"] > 0
    assert provenance["training_data"] == "cpu"  # a CPU run keeps numpy's data
    assert provenance["attention_backend"] == "torch" and result["config"]["model"]["backend"] == "auto"
    curve = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    assert [point["step"] for point in curve] == [2, 4]
    # The summary table: one row per evaluation split.
    assert "error" in stdout and all(split in stdout for split in ("test", "sparse", "dense"))


def test_absurd_learning_rate_diverges_with_the_step(tmp_path, capsys):
    code, stdout, _ = cli(capsys, "run", "flipflop", *TINY, "--lr", "1e30",
                          "--set", "train.warmup=0", "--out", tmp_path)
    assert code == 1
    [result] = results_of(tmp_path).values()
    assert result["status"] == "diverged" and result["metrics"] == {}
    assert result["reason"] == f"loss became nan at step {result['steps']}"
    assert "diverged" in stdout
    [run_dir] = list(tmp_path.iterdir())
    code, _, stderr = cli(capsys, "inspect", run_dir)
    assert code == 2 and "has no trained weights (status 'diverged')" in stderr


def test_a_crash_is_recorded_as_failed(tmp_path, capsys, monkeypatch):
    import pathbench.models

    def broken(config):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(pathbench.models, "build_model", broken)
    code, stdout, _ = cli(capsys, "run", "flipflop", *TINY, "--out", tmp_path)
    assert code == 1
    [result] = results_of(tmp_path).values()
    assert result["status"] == "failed"
    assert result["reason"] == "RuntimeError: out of memory (simulated)"
    assert "Traceback" in result["traceback"]

    # A sweep over the same run retries the failure (a crash is not an outcome of training).
    monkeypatch.undo()
    code, _, stderr = cli(capsys, "sweep", "flipflop", *TINY, "--out", tmp_path)
    assert code == 0, stderr
    assert "1 runs, 0 already done" in stderr
    [result] = results_of(tmp_path).values()
    assert result["status"] == "ok"


@pytest.mark.parametrize("args, message", [
    (["run", "nosuch"], "unknown task 'nosuch'; valid choices:"),
    (["run", "flipflop", "--model", "nosuch"], "unknown attention 'nosuch'"),
    (["run", "flipflop", "--set", "lr=3"], "--set expects task.KEY=VALUE"),
    (["run", "flipflop", "--set", "task.lenght=3"], "unknown config key 'lenght'"),
    (["run", "flipflop", "--set", "train.steps=-1"], "train.steps must be >= 1"),
    (["run", "flipflop", "--device", "tpu"], "'tpu' is not one of"),
    (["sweep", "flipflop", "--layers", "6-1"], "--layers expects integers and ranges"),
    (["sweep", "flipflop", "--lrs", "fast"], "--lrs expects numbers"),
    (["sweep", "flipflop", "--grid", "n_back=1,2"], "--grid expects SECTION.KEY"),
    (["sweep", "--file", "nosuch"], "sweep file 'nosuch' not found"),
    (["sweep", "flipflop", "--until-solved"], "until_solved needs a task with a solved"),
    (["sweep"], "give a TASK to sweep over, or --file NAME"),
    (["results", "does-not-exist"], "results directory does-not-exist does not exist"),
    (["run", "flipflop", "--set", "task.length=16", "--set", "task.length=32"],
     "--set task.length is given twice (16 and 32); give it once"),
    (["sweep", "flipflop", "--grid", "task.length=16,32", "--set", "task.length=16"],
     "task.length is both swept (--grid) and set (--set); give one"),
    (["run", "flipflop", "--out", ""], "must name a folder, got an empty string"),
    (["run", "flipflop", "--seed", str(2**64)], "seed must be an integer from 0 to 2^64 - 1"),
    (["sweep", "flipflop", "--seeds", f"0,{2**64}", "--dry-run"],
     "seed must be an integer from 0 to 2^64 - 1"),
    (["data", "flipflop", "--seed", str(2**64)], "is not in the range 0<=x<=18446744073709551615"),
    (["sweep", "flipflop", "--seeds", "0-10000000", "--dry-run"],
     "--seeds 0-10000000 holds more than 100,000 values"),
    (["sweep", "flipflop", "--models", "rope,path", "--layers", "1-200", "--heads", "1-100",
      "--seeds", "0-9", "--dry-run"], "has 400,000 runs; a grid may have at most 100,000"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = cli(capsys, *args)
    assert code == 2
    assert stderr.startswith("pathbench: error: ") and stderr.count("\n") == 1, stderr
    assert message in stderr
    assert not (tmp_path / "results").exists()  # nothing was written


@pytest.mark.parametrize("text, message", [
    ('workers = "many"\n', 'workers must be a positive integer, got \'many\''),
    ("out = 5\n", "out must be a non-empty string, got 5"),
    ('include = "flipflop.toml"\n', "include must be a list of file names"),
    (b"\xff\xfe workers = 2\n", "is not UTF-8 text"),
])
def test_a_sweep_file_of_the_wrong_types_is_a_one_line_error(tmp_path, capsys, text, message):
    path = tmp_path / "grids.toml"
    table = b'[[sweep]]\ntask = "flipflop"\n'
    path.write_bytes((text if isinstance(text, bytes) else text.encode()) + table)
    code, _, stderr = cli(capsys, "sweep", "--file", path, "--dry-run")
    assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr


def test_the_command_lines_set_replaces_the_sweep_files_set_of_the_same_key(tmp_path, capsys):
    path = tmp_path / "grids.toml"
    path.write_text('[[sweep]]\ntask = "flipflop"\nset = ["task.length=16", "train.steps=4"]\n')
    code, stdout, stderr = cli(capsys, "sweep", "--file", path, "--set", "task.length=32",
                               "--device", "cpu", "--dry-run", "--out", tmp_path / "runs")
    assert code == 0, stderr
    from pathbench.runners.sweep.grid import load_sweep_file

    [name] = [line.split()[1] for line in stdout.splitlines() if line.startswith("todo")]
    _, [grid] = load_sweep_file(path)
    grid.sets = ["task.length=32", "train.steps=4"]
    assert name == grid.runs("cpu")[0].run_id


def test_sweep_file_resume_results_plot_inspect(tmp_path, capsys, monkeypatch):
    out = tmp_path / "runs"
    grids = tmp_path / "grids.toml"
    (tmp_path / "flipflop.toml").write_text(
        '[[sweep]]\ntask = "flipflop"\nmodels = ["path", "rope"]\nseeds = "0-1"\nsteps = 50\n'
        'd_model = 16\nbatch_size = 8\n'
        'set = ["task.length=16", "train.eval_num=16", "train.eval_every=2"]\n')
    grids.write_text(f'include = ["flipflop.toml"]\nout = "{out}"\nworkers = 2\n')
    # The command line overrides the file (steps 50 -> 4).
    code, stdout, stderr = cli(capsys, "sweep", "--file", grids, "--steps", "4")
    assert code == 0, stderr
    assert sweep_counts(stdout) == {"ok": 4}
    records = results_of(out)
    assert len(records) == 4 and {r["config"]["train"]["steps"] for r in records.values()} == {4}
    written = {name: (out / name / "result.json").stat().st_mtime_ns for name in records}

    code, stdout, stderr = cli(capsys, "sweep", "--file", grids, "--steps", "4")
    assert code == 0 and sweep_counts(stdout) == {"already done": 4}
    assert {name: (out / name / "result.json").stat().st_mtime_ns for name in records} == written

    code, stdout, _ = cli(capsys, "results", out, "--format", "csv")
    lines = stdout.strip().splitlines()
    assert lines[0].startswith(
        "task,model,layers,heads,d_model,lr,metric,ok/seeds,budget_limited,chance (test),test,"
        "test_std,")
    assert len(lines) == 3  # path and rope, each averaged over two seeds
    code, stdout, _ = cli(capsys, "results", out, "--model", "path", "--runs",
                          "--format", "markdown")
    assert stdout.startswith("### flipflop") and stdout.count("| path | 1 | 2 | 16 |") == 2

    code, stdout, _ = cli(capsys, "plot", out, "-o", tmp_path / "figures" / "flipflop")
    assert code == 0
    for suffix in (".png", ".pdf", ".md"):
        assert (tmp_path / "figures" / f"flipflop{suffix}").stat().st_size > 0
    assert "error per split" in stdout and "| path |" in stdout

    # A plot interrupted while it draws leaves the earlier figures whole, and no temporary files.
    from matplotlib.figure import Figure

    drawn = {path.name: path.read_bytes() for path in (tmp_path / "figures").iterdir()}

    def interrupted(self, file, **options):
        if isinstance(file, (str, os.PathLike)):
            file = open(file, "wb")
        file.write(b"half a pict")
        file.flush()
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Figure, "savefig", interrupted)
        code, _, stderr = cli(capsys, "plot", out, "-o", tmp_path / "figures" / "flipflop")
    assert code == 130, stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "figures").iterdir()} == drawn

    run_dir = next(out.glob("flipflop-path-*"))
    code, stdout, _ = cli(capsys, "inspect", run_dir, "--tokens", "16")
    assert code == 0 and (run_dir / "attention.png").stat().st_size > 0
    # every label and tick label lies inside the figure, in a font of at least 5 points
    from pathbench.runners.analysis.attention_maps import attention_figure

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = attention_figure(run_dir, "test", 0, 16)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    for ax in figure.axes[:-1]:  # the maps (the last is the colour bar)
        texts = [ax.xaxis.label, ax.yaxis.label, ax.title, *ax.get_xticklabels(),
                 *ax.get_yticklabels()]
        assert len(texts) == 3 + 2 * 16 and min(t.get_fontsize() for t in texts) >= 5
        for text in texts:
            box = text.get_window_extent(renderer)
            assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1, text.get_text()
            assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1, text.get_text()
    code, _, stderr = cli(capsys, "inspect", run_dir, "-o", tmp_path / "maps.xyz")
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "unknown picture format '.xyz'" in stderr and ".png" in stderr and ".pdf" in stderr
    assert not (tmp_path / "maps.xyz").exists()


def test_packed_sweep_records_every_run_as_its_own(tmp_path, capsys):
    out = tmp_path / "runs"
    # 2 models x 2 learning rates x 3 seeds = 12 runs in packs of up to 4: each model's six
    # runs make a pack of four and one of two.
    code, stdout, stderr = cli(capsys, "sweep", "flipflop", "--models", "path,nope",
                               "--lrs", "1e-3,3e-3", "--seeds", "0-2", "--pack", "4", *TINY,
                               "--out", out)
    assert code == 0, stderr
    assert sweep_counts(stdout) == {"ok": 12}
    records = results_of(out)
    assert len(records) == 12
    packs = Counter(tuple(record["provenance"]["pack"]) for record in records.values())
    assert sorted(len(pack) for pack in packs) == [2, 2, 4, 4]
    assert all(count == len(pack) for pack, count in packs.items())
    for name, record in records.items():
        assert name in record["provenance"]["pack"] and (out / name / "model.pt").exists()
        assert record["steps"] == 4 and record["metrics"].keys() == {"test", "sparse", "dense"}
    # A pack is an execution detail: the same command without packs finds every run done.
    code, stdout, _ = cli(capsys, "sweep", "flipflop", "--models", "path,nope",
                          "--lrs", "1e-3,3e-3", "--seeds", "0-2", *TINY, "--out", out)
    assert code == 0 and sweep_counts(stdout) == {"already done": 12}


@pytest.mark.parametrize("pack, message", [
    ("0", '--pack must be "auto" or an integer >= 1, got 0'),
    ("two", '--pack must be "auto" or an integer >= 1, got \'two\'')])
def test_bad_pack_size_is_a_one_line_error(tmp_path, capsys, pack, message):
    code, _, stderr = cli(capsys, "sweep", "flipflop", "--pack", pack, *TINY,
                          "--out", tmp_path / "runs")
    assert code == 2 and message in stderr and "Traceback" not in stderr


def test_corrupt_record_is_skipped_by_results_left_by_a_dry_run_and_redone_by_the_sweep(
        tmp_path, capsys):
    out = tmp_path / "runs"
    sweep = ["sweep", "flipflop", "--models", "path", "--seeds", "0-1", *TINY, "--out", out]
    assert cli(capsys, *sweep)[0] == 0
    damaged = sorted(out.glob("*/result.json"))[0]
    damaged.write_text(damaged.read_text()[:50])  # as if half-written

    code, stdout, stderr = cli(capsys, "results", out)
    assert code == 0 and stderr.count("\n") == 1
    assert f"warning: skipped {damaged} is not a valid record" in stderr
    assert "1/1" in stdout  # the other seed is shown

    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    code, stdout, _ = cli(capsys, *sweep, "--dry-run")
    assert code == 0 and sorted(line.split()[0] for line in stdout.splitlines()) == ["done", "todo"]
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before

    code, stdout, stderr = cli(capsys, *sweep)
    assert code == 0 and sweep_counts(stdout) == {"ok": 1, "already done": 1}
    assert f"{damaged} is not a valid record" in stderr
    assert damaged.with_name("result.json.corrupt").exists()  # kept, not lost
    assert store.read_result(damaged.parent)["status"] == "ok"
    assert cli(capsys, "results", out)[0] == 0


def _worker_processes(pid: int) -> list[int]:
    """The sweep's worker processes: its children started by multiprocessing's spawn."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


def _start_sweep_and_wait_for_a_record(args, cwd, out, records_before=0):
    """Start the sweep; return it once it has written a new record and has busy workers."""
    sweep = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 600  # a bound against hanging, far above the few seconds
    while (len(list(out.glob("*/result.json"))) <= records_before
           and time.monotonic() < deadline and sweep.poll() is None):
        time.sleep(0.1)
    return sweep


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_sigkilled_worker_and_sigkilled_sweep_lose_nothing(tmp_path):
    out = tmp_path / "runs"
    args = [sys.executable, "-m", "pathbench.runners.cli", "sweep", "flipflop",
            "--models", "path,rope", "--seeds", "0-3", "--workers", "2", *TINY,
            "--steps", "60", "--out", str(out)]

    # 1. Kill one worker mid-sweep: the sweep goes on with the other runs.
    sweep = _start_sweep_and_wait_for_a_record(args, tmp_path, out)
    try:
        finished = {p: p.read_bytes() for p in out.glob("*/result.json")}
        workers = _worker_processes(sweep.pid)
        assert finished and workers, "the sweep did not get going"
        os.kill(workers[0], signal.SIGKILL)
        stdout, stderr = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    # The worker may have been between packs; if it held runs, each is reported lost, and the
    # sweep exits 1. Either way every run is recorded or reported lost.
    lost = [name for line in stderr.splitlines() if line.endswith(": lost: its worker died")
            for name in line.removesuffix(": lost: its worker died").split(", ")]
    recorded = set(results_of(out))
    assert not recorded & set(lost) and len(recorded) + len(lost) == 8, stderr
    assert sweep.returncode == (1 if lost else 0), stderr
    assert sweep_counts(stdout).get("lost", 0) == len(lost)
    for path, content in finished.items():
        assert path.read_bytes() == content  # nothing written was lost

    # 2. Kill the sweep itself (its workers finish their run, then exit).
    for run_dir in list(out.iterdir())[:3]:  # make work for the next sweep
        (run_dir / "result.json").unlink(missing_ok=True)
    finished = {p: p.read_bytes() for p in out.glob("*/result.json")}
    sweep = _start_sweep_and_wait_for_a_record(args, tmp_path, out, len(finished))
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.communicate(timeout=600)
    for path, content in finished.items():
        assert path.read_bytes() == content

    # 3. The same command finishes the rest: every run once, nothing lost or duplicated.
    rerun = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    records = results_of(out)
    assert len(records) == 8 and len(list(out.iterdir())) == 8
    assert all(record["status"] == "ok" for record in records.values())


def test_triton_backend_on_the_cpu_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, _, stderr = cli(capsys, "run", "flipflop", "--set", "model.backend=triton", *TINY,
                          "--device", "cpu", "--out", tmp_path)
    assert code == 2 and "model.backend 'triton' needs --device cuda" in stderr
    assert not any(tmp_path.iterdir())


def test_a_restarted_run_starts_its_curve_again(tmp_path, capsys):
    """A run killed before its record was written is trained again from the start, and its
    curve with it: the old points are not kept."""
    out = tmp_path / "runs"
    args = ["run", "flipflop", "--model", "rope", *TINY, "--out", out]
    assert cli(capsys, *args)[0] == 0
    [run_dir] = out.iterdir()
    curve = run_dir / store.CURVE_FILE

    def steps():
        return [json.loads(line)["step"] for line in curve.read_text().splitlines()]

    assert steps() == [2, 4]  # a point every eval_every = 2 of the 4 steps
    (run_dir / store.RESULT_FILE).unlink()  # as if killed before the end
    with curve.open("a") as file:
        file.write(json.dumps({"step": 6, "loss": 0.5}) + "\n")
    assert cli(capsys, *args)[0] == 0
    assert steps() == [2, 4]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_forced_rerun_cut_short_leaves_the_finished_run_as_it_was(tmp_path, capsys,
                                                                   monkeypatch, stop):
    """Ctrl-C, or a crash, while --force trains a finished run again: its record, weights and
    curve stay as they were."""
    from pathbench.runners.training import loop

    out = tmp_path / "runs"
    args = ["run", "flipflop", "--model", "rope", *TINY, "--out", out]
    assert cli(capsys, *args)[0] == 0
    [run_dir] = out.iterdir()
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    assert {"result.json", "model.pt", "curve.jsonl", "config.json"} <= set(before)

    def cut_short(*args, **kwargs):
        args[3][0].curve.append({"step": 1})  # the new curve had begun
        raise stop("cut short")

    monkeypatch.setattr(loop, "train", cut_short)
    code, stdout, stderr = cli(capsys, *args, "--force")
    assert code == (130 if stop is KeyboardInterrupt else 1)
    if stop is RuntimeError:
        assert "failed" in stdout and "the finished record in" in stderr
    after = {path.name: path.read_bytes() for path in run_dir.iterdir()
             if not path.name.endswith(".partial")}
    assert after == before


def test_run_refuses_to_replace_a_finished_run_unless_forced(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["run", "flipflop", "--model", "rope", *TINY, "--out", out]
    assert cli(capsys, *args)[0] == 0
    [record] = out.glob("*/result.json")
    marked = {**json.loads(record.read_text()), "marked": True}  # tells the old record apart
    store.write_json_atomic(record, marked)
    finished = record.read_bytes()
    code, _, stderr = cli(capsys, *args)
    assert code == 2 and stderr.count("\n") == 1
    assert f"{record.parent} already holds this run, finished" in stderr and "--force" in stderr
    assert record.read_bytes() == finished
    assert cli(capsys, *args, "--force")[0] == 0
    rewritten = json.loads(record.read_text())
    assert "marked" not in rewritten and rewritten["status"] == "ok"  # trained again


@pytest.mark.parametrize("command", ["run", "sweep", "plot", "inspect"])
def test_unwritable_outputs_are_one_line_errors(tmp_path, capsys, command):
    blocked = tmp_path / "file"
    blocked.write_text("")
    target = blocked / "below"  # a path through a file
    runs = tmp_path / "runs"
    if command in ("plot", "inspect"):
        assert cli(capsys, "run", "flipflop", "--model", "rope", *TINY, "--out", runs)[0] == 0
    args = {"run": lambda: ["run", "flipflop", *TINY, "--out", target],
            "sweep": lambda: ["sweep", "flipflop", "--models", "rope", *TINY, "--out", target],
            "plot": lambda: ["plot", runs, "-o", target / "figure"],
            "inspect": lambda: ["inspect", next(runs.iterdir()), "-o", target / "maps.png"],
            }[command]()
    code, _, stderr = cli(capsys, *args)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "cannot write to" in stderr and "Not a directory" in stderr


def test_bounds_and_conflicts_are_one_line_errors(tmp_path, capsys):
    assert cli(capsys, "run", "flipflop", "--model", "rope", *TINY, "--out", tmp_path)[0] == 0
    for args, message in [
        (["run", "flipflop", "--layers", "100000"], "'layers' must be an integer from 1 to 256"),
        (["run", "flipflop", "--set", "task.length=100000000"], "it must be <= 1048576"),
        (["run", "flipflop", "--model", "path", "--set", "model.attention=rope"],
         "--model path and --set model.attention=rope both set model.attention; give one"),
        (["inspect", next(tmp_path.iterdir()), "--example", "99999999"],
         "--example must be in 0..15: the run was evaluated on 16 sequences of test"),
    ]:
        code, _, stderr = cli(capsys, *args)
        assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr


def test_a_sweep_whose_runs_all_failed_exits_1(tmp_path, capsys, monkeypatch):
    from pathbench.runners.training import loop

    def crash(*args, **kwargs):
        raise RuntimeError("no luck")

    monkeypatch.setattr(loop, "train", crash)
    code, stdout, stderr = cli(capsys, "sweep", "flipflop", "--models", "rope", "--seeds",
                               "0-1", *TINY, "--out", tmp_path)
    assert code == 1 and sweep_counts(stdout) == {"failed": 2}
    assert "every run of the sweep failed (2)" in stderr


def test_a_plugin_name_that_shadows_another_is_a_one_line_warning(capsys, monkeypatch):
    from importlib.metadata import entry_points
    from types import SimpleNamespace

    from pathbench import registry
    from pathbench.models import ATTENTIONS

    shadow = SimpleNamespace(name="rope", value="shadow_pkg:RoPE", load=lambda: None,
                             dist=SimpleNamespace(name="shadow-pkg"))
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [*entry_points(group=group), shadow])
    monkeypatch.setattr(ATTENTIONS, "_plugins", None)
    code, stdout, stderr = cli(capsys, "ls", "--models")
    assert code == 0
    assert stderr == ("pathbench: warning: plugin package 'shadow-pkg' registers attention "
                      "'rope', which pathbench (built-in) already registers; the name stays "
                      "pathbench (built-in)'s\n")
    assert ATTENTIONS.entries()["rope"].origin == "built-in"


def test_results_warns_of_odd_records_and_says_why_runs_failed(tmp_path, capsys):
    """A record of an unknown status is skipped; a NaN or missing test metric is named and
    left out; a failed run's reason is printed; a run without result.json is unfinished."""
    from pathbench.runners.training.config import resolve_run

    def write(seed, status="ok", test=0.9, reason=None, result=True, longer=False):
        sets = {"task": {"eval_lengths": "16"}} if longer else None
        run = resolve_run("a5", options={"model": "path"}, sets=sets, seed=seed, device="cpu")
        (tmp_path / run.run_id).mkdir()
        store.write_json_atomic(tmp_path / run.run_id / "config.json", run.config)
        metrics = {} if test is None else {"test": {"accuracy": test, "scored": 10}}
        if longer:
            metrics["test_16"] = {"accuracy": 0.5, "scored": 10}
        if result:
            store.write_json_atomic(tmp_path / run.run_id / "result.json", {
                "run_id": run.run_id, "status": status, "reason": reason, "steps": 1,
                "primary_metric": "accuracy", "solved_threshold": 0.9,
                "validation": {"accuracy": 0.9}, "metrics": metrics,
                "config": run.config, "provenance": {"wall_time_s": 0.1}})
        return run.run_id

    write(0)
    nan = write(1, test=float("nan"))
    odd = write(2, status="finished")
    failed = write(3, status="failed", test=None, reason="RuntimeError: out of memory")
    unfinished = write(4, result=False)
    write(0, longer=True)  # a split of its own cell: the other cells do not lack it
    code, stdout, stderr = cli(capsys, "results", tmp_path)
    assert code == 0
    lines = stderr.splitlines()
    assert any(f"skipped {tmp_path / odd}/result.json" in line and
               "status 'finished' is not one of ok, diverged, failed" in line for line in lines)
    assert f"pathbench: warning: {tmp_path / nan}: test:accuracy is missing or NaN; left out " \
           f"of means and figures" in lines
    assert any("1 runs under" in line and unfinished in line and "have not finished" in line
               for line in lines)
    assert all(line.startswith("pathbench: warning: ") for line in lines)
    assert not any("test_16" in line for line in lines)
    assert f"- {failed}: failed: RuntimeError: out of memory" in stdout
    assert "0.9 ± nan" not in stdout and "3/3" not in stdout  # the NaN is not a value


def test_data_that_break_the_contract_are_the_same_error_in_run_and_data(tmp_path, capsys,
                                                                          monkeypatch):
    import numpy as np

    from pathbench.tasks.flipflop import FlipFlop

    monkeypatch.setattr(FlipFlop, "sample", lambda self, rng, num, split: (
        np.zeros((num, 4)), np.zeros((num, 4))))
    errors = []
    for args in (["data", "flipflop", "--num", "2", "--show", "1"],
                 ["run", "flipflop", *TINY, "--out", tmp_path]):
        code, _, stderr = cli(capsys, *args)
        assert code == 2 and stderr.count("\n") == 1
        errors.append(stderr)
    assert errors[0] == errors[1] and "sample() returned arrays of float64" in errors[0]
    assert not any(tmp_path.iterdir())


def test_where_keeps_the_runs_of_one_setting_and_names_the_valid_ones(tmp_path, capsys):
    from pathbench.runners.training.config import resolve_run

    for length in (8, 16):
        for model in ("path", "rope"):
            run = resolve_run("a5", options={"model": model},
                              sets={"task": {"length": str(length)}}, device="cpu")
            store.write_json_atomic(tmp_path / run.run_id / "result.json", {
                "run_id": run.run_id, "status": "ok", "reason": None, "steps": 1,
                "primary_metric": "accuracy", "solved_threshold": 0.9,
                "validation": {"accuracy": 0.5},
                "metrics": {"test": {"accuracy": length / 100}},
                "config": run.config, "provenance": {"wall_time_s": 0.1}})
    code, stdout, _ = cli(capsys, "results", tmp_path, "--where", "task.length=16",
                          "--model", "path", "--format", "records")
    assert code == 0
    [row] = list(csv.DictReader(io.StringIO(stdout)))
    assert (row["model"], row["task.length"], row["test:accuracy"]) == ("path", "16", "0.16")
    for where, message in [
            ("task.length=12", "--where task.length=12: no run has it; these runs have 8, 16"),
            ("task.lenght=8", "--where: no setting task.lenght in these runs; they have "),
            ("length=8", "--where expects task.KEY=VALUE")]:
        code, _, stderr = cli(capsys, "results", tmp_path, "--where", where)
        assert code == 2 and stderr.startswith(f"pathbench: error: {message}"), stderr
        assert len(stderr.splitlines()) == 1
