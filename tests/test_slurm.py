"""The Slurm executor's bookkeeping, against fake jobs and a fake squeue."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import cli

from pathbench import UserError
from pathbench.runners import executors
from pathbench.runners.config import run_id
from pathbench.runners.executors import QueueWatch, run_slurm, squeue
from pathbench.runners.grid import Grid

# A few seconds per run on a CPU, as in test_runners_cli.py.
TINY = ["--d-model", "16", "--steps", "4", "--batch-size", "8", "--set", "task.length=16",
        "--set", "train.eval_num=16", "--set", "train.eval_every=2", "--device", "cpu"]


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
        return [{"run_id": run_id(config), "status": "ok", "reason": None}
                for config in self.pack]


def fake_slurm(monkeypatch, clock, ends, queue_says):
    """submitit and squeue replaced: the n-th job submitted (from 0) writes its result at
    ``ends(n, now)`` on the clock (never if None); squeue says ``queue_says(job)`` about a job
    ("STATE REASON", or None: it has forgotten the job). Returns the jobs submitted."""
    submitit = pytest.importorskip("submitit")
    jobs = []

    class Executor:
        def __init__(self, folder, cluster):
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
    packs = iter([[config] for config in grid.configs("cpu")])
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
    assert sorted(reported) == sorted((run_id(c), "ok") for c in grid.configs("cpu"))


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
    names = [run_id(job.pack[0]) for job in jobs]
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
    assert "2 lost" in stdout and "run the same command again" in stderr
