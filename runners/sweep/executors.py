"""Executors: where a sweep's packs of runs train. Each is an `Executor` registered by name in
``EXECUTORS`` (entry-point group ``pathbench.executors`` for other packages), and the sweep
drives every one the same way.

- ``local``: with one worker, one pack after another in this process (`run_here`); with more,
  ``workers`` spawned processes, each training one pack at a time (`LocalPool`), so that several
  small runs share one GPU or the CPU cores (torch threads are divided among the workers). A
  worker that dies (killed, out of memory) costs only the runs it was training: it is replaced,
  the sweep goes on, and those runs are redone on the next invocation.
- ``slurm``: one Slurm array job per pack through submitit (``pip install 'pathbench[slurm]'``),
  at most ``workers`` at a time; ``--slurm KEY=VALUE`` passes executor parameters such as
  ``slurm_partition=gpu`` or ``timeout_min=60``. A job that leaves the queue without a result
  (cancelled, timed out, its node lost) is noticed through squeue, with or without Slurm's
  accounting, and its runs are reported lost.

An executor takes ``next_pack()`` (a pack to train, or None while none may start) and calls
``report(run_id, summary or None)`` for each run as its pack ends (None: no record was made,
and the executor has said why, in one line for the pack).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

from tqdm import tqdm

from pathbench import UserError
from pathbench.registry import Registry
from pathbench.runners.training.config import Run, resolve_device
from pathbench.runners.training.execute import execute_runs

# The outcome counted when a sweep training in its own process stops because a failed run left
# that process unable to use the GPU (workers in separate processes are replaced instead).
GPU_LOST = "stopped (GPU lost)"


class Executor:
    """Where a sweep's packs train: ``workers`` packs at a time, with the executor's own
    ``params`` (``--slurm KEY=VALUE``)."""

    def __init__(self, workers: int, params: dict):
        self.workers, self.params = workers, params

    def device(self, device: str) -> str:
        """The device runs are resolved for, from ``--device`` (auto, cpu or cuda)."""
        raise NotImplementedError

    def plan(self, packs: list[list[str]]) -> list[str]:
        """Lines for ``--dry-run`` about how these packs (their run ids) would be run."""
        return []

    def run(self, next_pack, out: Path, report, runs: int) -> str | None:
        """Train the packs ``next_pack()`` hands out (``runs`` runs at most) until none is
        left, reporting every run; None, or the outcome that stopped the sweep early."""
        raise NotImplementedError


EXECUTORS = Registry("executor", "pathbench.executors", Executor)


def run_here(next_pack, out: Path, report) -> bool:
    """Train the packs in this process; False if a failed run left this process unable to use
    the GPU (the sweep must then stop: every later run would fail too)."""
    while (pack := next_pack()) is not None:
        records = execute_runs(pack, out, progress=False)
        for summary in _summaries(records):
            report(summary["run_id"], summary)
        if _gpu_lost(records):
            return False
    return True


def _serve(connection, threads: int, gpu: str | None, sweep: int) -> None:
    """A local worker: trains the packs it is sent, one at a time, and reports their outcomes;
    on GPU ``gpu`` alone (its index among the visible ones), if given. It exits as soon as the
    sweep (process ``sweep``) is gone, mid-pack too."""
    threading.Thread(target=_exit_without, args=(sweep,), daemon=True).start()
    if gpu is not None:  # before CUDA starts in this process: "cuda" is then that GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch

    torch.set_num_threads(threads)
    try:
        while (message := connection.recv()) is not None:
            runs, out = message
            records = execute_runs(runs, Path(out), progress=False)
            gpu_lost = _gpu_lost(records)
            connection.send((_summaries(records), gpu_lost))
            if gpu_lost:
                return  # the pool starts a fresh worker in its place
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        # The sweep is gone (killed) or interrupted: stop quietly. A run cut short has no
        # result.json and is redone when the sweep runs again.
        return


def _exit_without(sweep: int) -> None:
    """Ends this process once its parent, the sweep, has ended: a sweep killed (SIGTERM,
    SIGKILL) cannot ask its workers to stop, and they would train on. A run cut short has no
    result.json and is redone when the sweep runs again."""
    while os.getppid() == sweep:
        time.sleep(1)
    os._exit(1)


def _gpu_lost(records: list[dict]) -> bool:
    """Whether these runs failed and took this process's GPU with them."""
    return any(record["status"] == "failed" for record in records) and _cuda_lost()


def _cuda_lost() -> bool:
    """Whether this process can no longer use the GPU: an error such as an illegal memory
    access sticks to the process's CUDA context, and every later kernel would fail too."""
    import torch

    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").sum().item()
    except Exception:
        return True
    return False


def _summaries(records: list[dict]) -> list[dict]:
    return [{"run_id": record["run_id"], "status": record["status"], "reason": record["reason"]}
            for record in records]


class _Worker:
    """One spawned worker process (spawned, not forked, so that CUDA works in it), the GPU it
    trains on (None: whatever it sees), and the runs of the pack it is training, if any."""

    def __init__(self, context, threads: int, gpu: str | None):
        self.gpu = gpu
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_serve,
                                       args=(child_end, threads, gpu, os.getpid()), daemon=True)
        self.process.start()
        child_end.close()
        self.runs: list[str] = []


class LocalPool:
    """``workers`` processes that train packs of runs in parallel, one pack each at a time;
    given ``gpus`` (indices of visible GPUs), worker i trains on gpus[i % len(gpus)]."""

    def __init__(self, workers: int, gpus: list[str] | None = None):
        self.context = multiprocessing.get_context("spawn")
        self.threads = max(1, (os.cpu_count() or 1) // workers)  # torch threads per worker
        self.workers = [self._start(gpus[i % len(gpus)] if gpus else None)
                        for i in range(workers)]

    def _start(self, gpu: str | None) -> _Worker:
        return _Worker(self.context, self.threads, gpu)

    def run(self, next_pack, out: Path, report) -> None:
        """Train the packs ``next_pack()`` hands out (None: none may start now) until none is
        left or training; ``report(run_id, summary or None)`` is called for each run as its pack
        ends (None: the worker died, and the run is not done)."""
        while True:
            for index, worker in enumerate(self.workers):
                if worker.runs:
                    continue
                pack = next_pack()
                if pack is None:
                    break
                if not worker.process.is_alive():  # it died while idle
                    self.workers[index] = worker = self._start(worker.gpu)
                worker.runs = [run.run_id for run in pack]
                worker.connection.send((pack, str(out)))
            busy = [worker for worker in self.workers if worker.runs]
            if not busy:
                return
            ready = wait([w.connection for w in busy] + [w.process.sentinel for w in busy])
            for index, worker in enumerate(self.workers):
                if not worker.runs or not (
                        worker.connection in ready or worker.process.sentinel in ready):
                    continue
                try:
                    summaries, gpu_lost = worker.connection.recv()
                except (EOFError, OSError):  # the worker died mid-pack
                    summaries, gpu_lost = [None] * len(worker.runs), True
                    tqdm.write(f"{', '.join(worker.runs)}: lost: its worker died",
                               file=sys.stderr)
                for name, summary in zip(worker.runs, summaries):
                    report(name, summary)
                worker.runs = []
                if gpu_lost:  # it has ended, or is ending: replace it
                    worker.process.join()
                    self.workers[index] = self._start(worker.gpu)

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive():
                try:
                    worker.connection.send(None)  # asks the worker to exit
                except OSError:
                    pass
        for worker in self.workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()


# The job's Python starts with SIGUSR2 ignored (an ignored signal stays ignored across exec):
# Slurm sends submitit's warning at once when the time limit is shorter than its delay, and
# Python's default action for it, while the job still imports pathbench, is to die.
_PYTHON_IGNORING_USR2 = (f"sh -c 'trap \"\" USR2; exec \"$0\" \"$@\"' "
                         f"{shlex.quote(sys.executable)}")


def _submitit_job(runs: list[Run], out: str) -> list[dict]:
    # submitit signals USR2 `signal_delay_s` before the time limit and, for a function that
    # cannot checkpoint, raises inside it: the pack's runs would be recorded as crashed. They
    # cannot resume anyway, so they train on until Slurm ends the job, which the sweep then
    # reports as lost (TIMEOUT).
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    return _summaries(execute_runs(runs, Path(out), progress=False))


# How often squeue is asked about the jobs in flight, and how long a job may have been out of
# the queue before its missing result file counts as lost: a shared file system's attribute
# cache (NFS's, by default) can hide a new file for up to a minute.
QUEUE_POLL_S = 15
RESULT_GRACE_S = 60
# Slurm's states of a job that has ended
ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
         "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}


def squeue(job_ids: list[str]) -> str | None:
    """squeue's line ("ID STATE REASON") for each of these jobs Slurm still knows, ended ones
    included; None if Slurm did not answer."""
    command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i %T %r",
               "--jobs=" + ",".join(job_ids)]
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError("--executor slurm needs Slurm's squeue on this host") from None
    if result.returncode == 0:
        return result.stdout
    if "Invalid job id" in result.stderr:  # asked about one job, which Slurm has forgotten
        return ""
    return None


class QueueWatch:
    """Notices the jobs that have left Slurm's queue without a result, from squeue alone:
    without accounting (sacct), submitit never learns that such a job has ended."""

    def __init__(self):
        self.asked = -math.inf
        self.out_since: dict[str, tuple[float, str]] = {}  # job id -> (first seen out, why)

    def lost(self, job_ids: list[str]) -> dict[str, str]:
        """Those of these jobs (none with a result yet) out of the queue for RESULT_GRACE_S,
        each with Slurm's reason; asks squeue at most every QUEUE_POLL_S."""
        now = time.monotonic()
        if not job_ids or now - self.asked < QUEUE_POLL_S:
            return {}
        self.asked = now
        text = squeue(job_ids)
        if text is None:  # no news; Slurm is asked again next time
            return {}
        states = {}
        for line in text.splitlines():
            job_id, state, reason = (line.split(maxsplit=2) + ["", ""])[:3]
            states[job_id] = state, reason
        out_since = {}
        for job_id in job_ids:
            state, reason = states.get(job_id, (None, ""))
            if state is not None and state not in ENDED:
                continue  # still queued, or requeued
            since, why = self.out_since.get(job_id, (now, "left the queue without a result"))
            if state is not None:
                why = state if reason in ("", "None") else f"{state} ({reason})"
            out_since[job_id] = since, why
        self.out_since = out_since
        return {job_id: why for job_id, (since, why) in out_since.items()
                if now - since >= RESULT_GRACE_S}


def run_slurm(next_pack, out: Path, workers: int, params: dict, report) -> None:
    """One submitit array job per pack, submitted as packs may start (``next_pack()``, None
    when none may now); waits for all of them, reporting each run as its pack ends, or as lost
    (None) when its job ends without a result."""
    try:
        import submitit
    except ModuleNotFoundError:
        raise UserError("--executor slurm needs submitit: pip install 'pathbench[slurm]'") from None

    executor = submitit.AutoExecutor(folder=out / ".submitit", cluster="slurm",
                                     slurm_python=_PYTHON_IGNORING_USR2)
    try:
        executor.update_parameters(name="pathbench", **params)
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad --slurm parameter: {' '.join(str(exc).split())}") from None
    remaining: dict = {}  # job -> its runs
    queue = QueueWatch()

    def lose(job, why: str) -> None:
        names = remaining.pop(job)
        tqdm.write(f"job {job.job_id}: {why}; lost {', '.join(names)}", file=sys.stderr)
        for name in names:
            report(name, None)

    while True:
        packs = []  # at most `workers` jobs at once, across the arrays submitted
        while len(remaining) + len(packs) < workers and (pack := next_pack()) is not None:
            packs.append(pack)
        if packs:
            try:
                jobs = executor.map_array(_submitit_job, packs, [str(out)] * len(packs))
            except submitit.core.utils.FailedJobError as exc:  # sbatch's error, printed above
                reason = str(exc).strip().splitlines()[-1].removeprefix("sbatch: error: ")
                raise UserError(f"sbatch refused the job: {reason}") from None
            remaining.update(zip(jobs, ([run.run_id for run in pack] for pack in packs)))
        if not remaining:
            return
        # Job.done() would ask sacct, which fails without accounting (a warning each time)
        # and never reports a job that ended without a result: read the result file instead.
        for job in [job for job in remaining if job.paths.result_pickle.exists()]:
            try:
                summaries = job.result()
            except Exception:  # the job's Python process failed outside the runs
                lose(job, f"failed (its log: {job.paths.stderr})")
                continue
            for name, summary in zip(remaining.pop(job), summaries):
                report(name, summary)
        by_id = {job.job_id: job for job in remaining}
        for job_id, why in queue.lost(list(by_id)).items():
            lose(by_id[job_id], why)
        time.sleep(1)


def parse_slurm_params(items) -> dict:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--slurm expects KEY=VALUE, got {item!r}")
        for convert in (int, float):
            try:
                value = convert(value)
                break
            except ValueError:
                continue
        params[key.strip()] = value
    return params


def visible_gpus() -> list[str]:
    """The indices of the GPUs this process sees ("0", "1", ...)."""
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


@EXECUTORS.register("local")
class LocalExecutor(Executor):
    """This process for one worker; `LocalPool` for more, spread over the GPUs where more than
    one is visible (on one, nothing changes)."""

    def device(self, device: str) -> str:
        return resolve_device(device)

    def run(self, next_pack, out: Path, report, runs: int) -> str | None:
        if self.workers == 1 or not runs:
            return None if run_here(next_pack, out, report) else GPU_LOST
        gpus = visible_gpus()
        pool = LocalPool(min(self.workers, runs), gpus if len(gpus) > 1 else None)
        try:
            pool.run(next_pack, out, report)
        finally:
            pool.close()
        return None


@EXECUTORS.register("slurm")
class SlurmExecutor(Executor):
    """A Slurm array job per pack (`run_slurm`)."""

    def device(self, device: str) -> str:
        # the compute node decides what "auto" finds; presets must be fixed before, so cuda
        return "cuda" if device == "auto" else device

    def plan(self, packs: list[list[str]]) -> list[str]:
        return [f"{len(packs)} Slurm jobs, at most {self.workers} at a time:",
                *(f"job {number}: {', '.join(names)} (pack of {len(names)})"
                  for number, names in enumerate(packs, 1))]

    def run(self, next_pack, out: Path, report, runs: int) -> str | None:
        run_slurm(next_pack, out, self.workers, self.params, report)
        return None
