"""Executors: where a sweep's packs of runs train.

- `run_here`: one pack after another in this process.
- `LocalPool`: ``workers`` spawned processes, each training one pack at a time, so that several
  small runs share one GPU or the CPU cores (torch threads are divided among the workers). A
  worker that dies (killed, out of memory) costs only the runs it was training: it is replaced,
  the sweep goes on, and those runs are redone on the next invocation.
- `run_slurm`: one Slurm array job per pack through submitit (``pip install 'pathbench[slurm]'``),
  at most ``workers`` at a time; ``--slurm KEY=VALUE`` passes executor parameters such as
  ``slurm_partition=gpu`` or ``timeout_min=60``.

Each takes ``next_pack()`` (a pack to train, or None while none may start) and calls
``report(run_id, summary or None)`` for each run as its pack ends (None: no record was made).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.connection import wait
from pathlib import Path

from tqdm import tqdm

from pathbench import UserError
from pathbench.runners.config import run_id
from pathbench.runners.run import execute_runs

EXECUTORS = ("local", "slurm")
# submitit's cluster for --executor slurm; the tests set "local" to run the same path without
# a Slurm installation.
SUBMITIT_CLUSTER = "slurm"


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


def _serve(connection, threads: int) -> None:
    """A local worker: trains the packs it is sent, one at a time, and reports their outcomes."""
    import torch

    torch.set_num_threads(threads)
    try:
        while (message := connection.recv()) is not None:
            configs, out = message
            records = execute_runs(configs, Path(out), progress=False)
            gpu_lost = _gpu_lost(records)
            connection.send((_summaries(records), gpu_lost))
            if gpu_lost:
                return  # the pool starts a fresh worker in its place
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        # The sweep is gone (killed) or interrupted: stop quietly. A run cut short has no
        # result.json and is redone when the sweep runs again.
        return


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
    """One spawned worker process (spawned, not forked, so that CUDA works in it) and the runs
    of the pack it is training, if any."""

    def __init__(self, context, threads: int):
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_serve, args=(child_end, threads), daemon=True)
        self.process.start()
        child_end.close()
        self.runs: list[str] = []


class LocalPool:
    """``workers`` processes that train packs of runs in parallel, one pack each at a time."""

    def __init__(self, workers: int):
        self.context = multiprocessing.get_context("spawn")
        self.threads = max(1, (os.cpu_count() or 1) // workers)  # torch threads per worker
        self.workers = [_Worker(self.context, self.threads) for _ in range(workers)]

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
                    self.workers[index] = worker = _Worker(self.context, self.threads)
                worker.runs = [run_id(config) for config in pack]
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
                for name, summary in zip(worker.runs, summaries):
                    report(name, summary)
                worker.runs = []
                if gpu_lost:  # it has ended, or is ending: replace it
                    worker.process.join()
                    self.workers[index] = _Worker(self.context, self.threads)

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


def _submitit_job(configs: list[dict], out: str) -> list[dict]:
    return _summaries(execute_runs(configs, Path(out), progress=False))


def run_slurm(next_pack, out: Path, workers: int, params: dict, report) -> None:
    """One submitit array job per pack, submitted as packs may start (``next_pack()``, None
    when none may now); waits for all of them, reporting each run as its pack ends."""
    try:
        import submitit
    except ModuleNotFoundError:
        raise UserError("--executor slurm needs submitit: pip install 'pathbench[slurm]'") from None
    import time

    executor = submitit.AutoExecutor(folder=out / ".submitit", cluster=SUBMITIT_CLUSTER)
    try:
        executor.update_parameters(name="pathbench", **params)
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad --slurm parameter: {' '.join(str(exc).split())}") from None
    remaining: dict = {}  # job -> its runs
    while True:
        packs = []  # at most `workers` jobs at once, across the arrays submitted
        while len(remaining) + len(packs) < workers and (pack := next_pack()) is not None:
            packs.append(pack)
        if packs:
            jobs = executor.map_array(_submitit_job, packs, [str(out)] * len(packs))
            remaining.update(zip(jobs, ([run_id(config) for config in pack] for pack in packs)))
        if not remaining:
            return
        for job in [job for job in remaining if job.done()]:
            names = remaining.pop(job)
            try:
                summaries = job.result()
            except Exception as exc:  # the job itself died: timeout, preemption, node failure
                tqdm.write(f"{', '.join(names)}: job {job.job_id} ended without a record "
                           f"({exc})", file=sys.stderr)
                summaries = [None] * len(names)
            for name, summary in zip(names, summaries):
                report(name, summary)
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
