"""The Slurm executor: its bookkeeping against fake jobs and a fake squeue, then sweeps through a
real single-node Slurm, cancelled and timed-out jobs included.

The real Slurm is Debian's slurmctld, slurmd and munged (``apt-get install slurmctld slurmd
munge``; .ci/run installs them), started as root for this module with a configuration, ports
and state of their own, and stopped afterwards. Without root or the packages those tests skip.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cli, sweep_counts

from pathbench import UserError
from pathbench.runners.sweep import executors
from pathbench.runners.sweep.executors import QueueWatch, run_slurm, squeue
from pathbench.runners.sweep.grid import Grid
from pathbench.runners.sweep.orchestrate import run_grids

# A few seconds per run on a CPU, as in test_runners_cli.py.
TINY = ["--d-model", "16", "--steps", "4", "--batch-size", "8", "--set", "task.length=16",
        "--set", "train.eval_num=16", "--set", "train.eval_every=2", "--device", "cpu"]


# --- against fakes ------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(executors, "time", clock)
    return clock


class FakeJob:
    """A submitit job whose result file appears at ``ends`` on the clock (never if None)."""

    def __init__(self, number, pack, clock, ends):
        self.job_id, self.pack, self.ends, self.clock = f"{number}_0", pack, ends, clock
        self.paths = SimpleNamespace(result_pickle=SimpleNamespace(exists=self.has_ended),
                                     stderr=f"{number}_0_log.err")

    def has_ended(self):
        return self.ends is not None and self.clock.now >= self.ends

    def result(self):
        return [{"run_id": run.run_id, "status": "ok", "reason": None}
                for run in self.pack]


def fake_slurm(monkeypatch, clock, ends, queue_says):
    """submitit and squeue replaced: the n-th job submitted (from 0) writes its result at
    ``ends(n, now)`` on the clock (never if None); squeue says ``queue_says(job)`` about a job
    ("STATE REASON", or None: it has forgotten the job). Returns the jobs submitted."""
    submitit = pytest.importorskip("submitit")
    jobs = []

    class Executor:
        def __init__(self, folder, cluster, **options):
            assert cluster == "slurm"

        def update_parameters(self, **params):
            pass

        def map_array(self, function, packs, outs):
            new = [FakeJob(len(jobs) + index, pack, clock, ends(len(jobs) + index, clock.now))
                   for index, pack in enumerate(packs)]
            jobs.extend(new)
            return new

    def fake_squeue(job_ids):
        by_id = {job.job_id: job for job in jobs}
        said = {job_id: queue_says(by_id[job_id]) for job_id in job_ids}
        return "".join(f"{job_id} {line}\n" for job_id, line in said.items() if line)

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    monkeypatch.setattr(executors, "squeue", fake_squeue)
    return jobs


def job_lines(stderr: str) -> list[str]:
    """What the executor said about lost jobs."""
    return [line for line in stderr.splitlines() if line.startswith("job ")]


def running_until_done(job):
    return "COMPLETED None" if job.has_ended() else "RUNNING None"


def packs_of(grid):
    packs = iter([[run] for run in grid.runs("cpu")])
    return lambda: next(packs, None)


def test_slurm_keeps_at_most_workers_jobs_in_flight(tmp_path, monkeypatch, clock):
    jobs = fake_slurm(monkeypatch, clock, lambda n, now: now + 3, running_until_done)
    most, reported = [0], []

    def report(name, summary):
        reported.append((name, summary["status"]))

    original_sleep = clock.sleep

    def sleep(seconds):  # count the jobs submitted and not yet reported, once a poll
        in_flight = len(jobs) - len(reported)
        most[0] = max(most[0], in_flight)
        original_sleep(seconds)

    clock.sleep = sleep
    grid = Grid(task="flipflop", models=["nope", "rope", "path"], seeds=[0, 1], d_model=16)
    run_slurm(packs_of(grid), tmp_path, 2, {}, report)
    assert len(jobs) == 6 and most[0] == 2
    assert sorted(reported) == sorted((run.run_id, "ok") for run in grid.runs("cpu"))


def test_jobs_that_leave_the_queue_without_a_result_are_lost_once_each(tmp_path, monkeypatch,
                                                                      clock, capsys):
    says = {1: "CANCELLED None", 2: None, 3: "COMPLETED None"}  # 2: Slurm has forgotten it
    # job 0 ends normally; 1 and 2 never write a result; 3's result shows up late, within the
    # grace a shared file system may need
    ends = {0: 5, 1: None, 2: None, 3: executors.RESULT_GRACE_S - 5}
    jobs = fake_slurm(monkeypatch, clock, lambda n, now: ends[n],
                      lambda job: says.get(jobs.index(job), running_until_done(job)))
    reported = {}

    def report(name, summary):
        reported[name] = (summary and summary["status"], clock.now)

    grid = Grid(task="flipflop", models=["nope", "rope"], seeds=[0, 1], d_model=16)
    run_slurm(packs_of(grid), tmp_path, 4, {}, report)
    names = [job.pack[0].run_id for job in jobs]
    assert {name: status for name, (status, _) in reported.items()} == {
        names[0]: "ok", names[1]: None, names[2]: None, names[3]: "ok"}
    for lost in names[1:3]:  # noticed after the grace, within a poll more
        assert executors.RESULT_GRACE_S <= reported[lost][1] <= (
            executors.RESULT_GRACE_S + 2 * executors.QUEUE_POLL_S)
    assert capsys.readouterr().err.splitlines() == [
        f"job 1_0: CANCELLED; lost {names[1]}",
        f"job 2_0: left the queue without a result; lost {names[2]}"]


def test_queue_watch_keeps_slurms_reason_and_forgives_a_requeued_job(monkeypatch, clock):
    answers = iter([
        "5_0 TIMEOUT TimeLimit\n6_0 CANCELLED None\n7_0 RUNNING None\n",
        None,  # Slurm did not answer: no news
        "6_0 PENDING BeginTime\n7_0 RUNNING None\n",  # 6_0 requeued; 5_0 forgotten
        "6_0 RUNNING None\n7_0 NODE_FAIL None\n",
        "6_0 RUNNING None\n",
    ])
    monkeypatch.setattr(executors, "squeue", lambda job_ids: next(answers))
    watch, ids = QueueWatch(), ["5_0", "6_0", "7_0"]
    assert watch.lost(ids) == {}  # out of the queue, but only just
    clock.now += executors.RESULT_GRACE_S
    assert watch.lost(ids) == {}
    assert watch.lost(ids) == {}  # squeue is asked again only QUEUE_POLL_S later
    clock.now += executors.QUEUE_POLL_S
    assert watch.lost(ids) == {"5_0": "TIMEOUT (TimeLimit)"}
    clock.now += executors.QUEUE_POLL_S
    assert watch.lost(["6_0", "7_0"]) == {}  # 7_0 has only just ended
    clock.now += executors.RESULT_GRACE_S
    assert watch.lost(["6_0", "7_0"]) == {"7_0": "NODE_FAIL"}


def test_squeue_reads_slurms_answer_and_says_when_there_is_none(tmp_path, monkeypatch):
    def fake_squeue_command(script):
        (tmp_path / "squeue").write_text(f"#!/bin/sh\n{script}\n")
        (tmp_path / "squeue").chmod(0o755)

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="needs Slurm's squeue"):
        squeue(["1_0"])
    fake_squeue_command('echo "$@"')
    assert squeue(["1_0", "2_3"]) == ("--noheader --array --states=all --format=%i %T %r "
                                      "--jobs=1_0,2_3\n")
    # one job asked about, which Slurm has forgotten: squeue fails rather than list nothing
    fake_squeue_command('echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')
    assert squeue(["1_0"]) == ""
    fake_squeue_command('echo "slurm_load_jobs error: Socket timed out" >&2; exit 1')
    assert squeue(["1_0"]) is None


def test_a_lost_job_fails_the_sweep_with_one_line_for_it(tmp_path, monkeypatch, clock, capsys):
    fake_slurm(monkeypatch, clock, lambda n, now: None, lambda job: "TIMEOUT TimeLimit")
    out = tmp_path / "runs"
    code, stdout, stderr = cli(capsys, "sweep", "flipflop", "--models", "rope", "--seeds", "0,1",
                               "--pack", "2", *TINY, "--executor", "slurm", "--out", out)
    assert code == 1
    [line] = job_lines(stderr)  # one for the job, none for each of its runs
    assert line.startswith("job 0_0: TIMEOUT (TimeLimit); lost flipflop-rope-")
    assert ": lost" not in stderr
    assert sweep_counts(stdout) == {"lost": 2} and "run the same command again" in stderr


def test_dry_run_shows_the_slurm_jobs(tmp_path, capsys):
    grid = Grid(task="flipflop", models=["rope"], seeds=[0, 1, 2], d_model=16, pack=2)
    run_grids([grid], out=tmp_path, device="cpu", workers=4, executor="slurm", slurm_params={},
              dry_run=True)
    names = [run.run_id for run in grid.runs("cpu")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == ["2 Slurm jobs, at most 4 at a time:",
                          f"job 1: {names[0]}, {names[1]} (pack of 2)",
                          f"job 2: {names[2]} (pack of 1)"]
    assert not any(tmp_path.iterdir())


# --- through a real Slurm -----------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=pathbench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
# a job past its time limit is killed 2 s after SIGTERM, which submitit ignores
KillWait=2
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_the_tests():
    """Run in each daemon before it starts: pytest killed outright takes the daemons along."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_for(condition, seconds: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}"
                             for log in sorted(root.glob("*.log")))
            pytest.fail(f"Slurm: {what} within {seconds} s\n{logs}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A single-node Slurm of its own, for this module's tests: SLURM_CONF points at it."""
    if os.geteuid() != 0:
        pytest.skip("a real Slurm: starting its daemons needs root")
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"a real Slurm: {', '.join(missing)} not installed "
                    f"(apt-get install slurmctld slurmd munge)")
    pytest.importorskip("submitit")
    root = tmp_path_factory.mktemp("slurm")
    (root / "state").mkdir()
    (root / "spool").mkdir()
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]  # NodeName=... CPUs=... RealMemory=...
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], root=root,
                                      controller_port=_free_port(), node_port=_free_port(),
                                      node=node))
    key = root / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
    daemons = []

    def start(*command):
        with open(root / f"{command[0]}.out", "w") as output:
            daemons.append(subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                            preexec_fn=_die_with_the_tests))

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(conf))
        try:
            start("munged", "--foreground", "--force", f"--socket={root}/munge.socket",
                  f"--key-file={key}", f"--log-file={root}/munged.log",
                  f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed")
            _wait_for((root / "munge.socket").exists, 10, "munged did not start", root)
            start("slurmctld", "-D")
            start("slurmd", "-D", "-N", node.split()[0].removeprefix("NodeName="))

            def node_idle():
                state = subprocess.run(["sinfo", "--noheader", "--format=%T"],
                                       check=False, capture_output=True, text=True)
                return state.stdout.strip() == "idle"

            _wait_for(node_idle, 60, "the node was not idle", root)
            yield root
        finally:
            subprocess.run(["scancel", "--full", "--user=root"], check=False, capture_output=True)
            for daemon in reversed(daemons):
                daemon.terminate()
                try:
                    daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()


@pytest.fixture
def quick_watch(monkeypatch):
    """Poll squeue every second and allow 2 s for a result file: the file system is local."""
    monkeypatch.setattr(executors, "QUEUE_POLL_S", 1)
    monkeypatch.setattr(executors, "RESULT_GRACE_S", 2)


# Far longer than any of these sweeps takes; only a stuck Slurm reaches it.
SWEEP_DEADLINE_S = 300


@contextlib.contextmanager
def within(seconds: float = SWEEP_DEADLINE_S):
    """Bound a sweep through Slurm: past ``seconds`` its jobs are cancelled (the sweep then
    ends, reporting them lost), and 60 s later the test is interrupted; either way it fails
    saying so, instead of hanging the suite."""
    fired = []

    def cancel():
        fired.append("cancelled")
        subprocess.run(["scancel", "--full", "--user=root"], check=False, capture_output=True)
        if not finished.wait(60):
            fired.append("interrupted")
            _thread.interrupt_main()

    finished = threading.Event()
    timer = threading.Timer(seconds, cancel)
    timer.start()
    try:
        yield
    except KeyboardInterrupt:
        if not fired:
            raise
    finally:
        finished.set()
        timer.cancel()
    if fired:
        pytest.fail(f"the sweep through Slurm was not over within {seconds} s: its jobs were "
                    f"{' and then the test '.join(fired)}")


def results_of(out: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in out.glob("*/result.json")}


def cancel_the_first_job_to_run(cancelled: list, stop: threading.Event) -> threading.Thread:
    """In the background until ``stop``: scancel the first pathbench job that runs; appends its
    job id."""

    def watch():
        while not stop.is_set():
            running = subprocess.run(
                ["squeue", "--noheader", "--array", "--states=RUNNING", "--name=pathbench",
                 "--format=%i"], check=False, capture_output=True, text=True).stdout.split()
            if running:
                subprocess.run(["scancel", running[0]], check=True)
                cancelled.append(running[0])
                return
            stop.wait(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_sweep_on_slurm_records_what_the_local_executor_records(slurm, tmp_path, capsys,
                                                                  quick_watch):
    args = ["sweep", "flipflop", "--models", "path,rope", "--seeds", "0,1", *TINY]
    code, _, stderr = cli(capsys, *args, "--out", tmp_path / "local")
    assert code == 0, stderr
    with within():
        code, stdout, stderr = cli(capsys, *args, "--executor", "slurm", "--workers", "2",
                                   "--slurm", "timeout_min=5", "--out", tmp_path / "slurm")
    assert code == 0, stderr
    assert sweep_counts(stdout) == {"ok": 4}
    assert "sacct" not in stderr and "Bypassing" not in stderr  # submitit kept quiet
    local, on_slurm = results_of(tmp_path / "local"), results_of(tmp_path / "slurm")
    assert len(local) == 4 and sorted(local) == sorted(on_slurm)
    for name, record in local.items():
        assert on_slurm[name]["metrics"] == record["metrics"], name


def test_a_cancelled_job_is_lost_and_the_same_command_trains_only_its_runs(slurm, tmp_path,
                                                                          capsys, quick_watch):
    out = tmp_path / "runs"
    args = ["sweep", "flipflop", "--models", "path,rope", *TINY, "--executor", "slurm",
            "--workers", "2", "--out", out]
    cancelled, sweep_over = [], threading.Event()
    canceller = cancel_the_first_job_to_run(cancelled, sweep_over)
    with within():
        code, stdout, stderr = cli(capsys, *args)
    sweep_over.set()
    canceller.join()
    assert cancelled, f"no job was seen running before the sweep ended\n{stderr}"
    [job_id] = cancelled
    assert code == 1 and sweep_counts(stdout) == {"ok": 1, "lost": 1}, stderr
    [line] = job_lines(stderr)
    assert line.startswith(f"job {job_id}: CANCELLED; lost flipflop-")
    assert "sacct" not in stderr and "Bypassing" not in stderr
    [kept] = results_of(out)
    kept_record = (out / kept / "result.json").read_bytes()

    with within():
        code, stdout, stderr = cli(capsys, *args)
    assert code == 0, stderr
    assert "2 runs, 1 already done" in stderr
    assert sweep_counts(stdout) == {"ok": 1, "already done": 1}
    assert (out / kept / "result.json").read_bytes() == kept_record  # not trained again
    assert len(results_of(out)) == 2


def test_a_job_past_its_time_limit_is_lost_with_slurms_reason(slurm, tmp_path, capsys,
                                                             quick_watch):
    # Slurm's limits are whole minutes, checked every 30 s: the job ends 60 to 90 s in
    out = tmp_path / "runs"
    with within():
        code, stdout, stderr = cli(capsys, "sweep", "flipflop", "--models", "rope",
                                   "--d-model", "16", "--batch-size", "8", "--device", "cpu",
                                   "--set", "task.length=16", "--set", "train.eval_num=16",
                                   "--steps", "1000000", "--set", "train.eval_every=1000000",
                                   "--executor", "slurm", "--slurm", "timeout_min=1",
                                   "--out", out)
    assert code == 1 and sweep_counts(stdout) == {"lost": 1}, stderr
    [line] = job_lines(stderr)
    assert "TIMEOUT (TimeLimit); lost flipflop-rope-" in line
    assert not results_of(out)


def test_a_partition_slurm_refuses_is_a_one_line_error(slurm, tmp_path, capsys):
    with within():
        code, _, stderr = cli(capsys, "sweep", "flipflop", "--models", "rope", *TINY,
                              "--executor", "slurm", "--slurm", "slurm_partition=nowhere",
                              "--out", tmp_path)
    assert code == 2 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == ("pathbench: error: sbatch refused the job: Batch "
                                               "job submission failed: Invalid partition name "
                                               "specified")
