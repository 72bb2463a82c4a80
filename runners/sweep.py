"""`pathbench sweep`: a grid of runs, resumable, in parallel processes or on Slurm.

The grid is the product of models x layers x heads x learning rates x seeds (x any ``--grid``
key). Every grid point is resolved up front, so a typo fails before anything runs. A run whose
``result.json`` exists is skipped, unless its status is "failed" (a crash, not an outcome of
training): records are written atomically and only once a run is over, so a sweep killed at any
moment (SIGKILL included) loses nothing written, and running the same command again finishes
the rest and retries the failures.

``--pack N`` trains up to N runs that differ only in seed and learning rate as one model
(``pathbench.models.pack``): a small model's step is hundreds of kernels too small to fill a
GPU, and a pack's kernels do the work of all its runs in less time than they take one by one.
Models large enough to fill the GPU gain nothing and need N times the memory. Every run still
has its own record, exactly as if it had trained alone.

Executors:

- ``local`` (default): ``--workers N`` worker processes, each training one pack at a time, so
  several small runs share one GPU or the CPU cores (torch threads are divided among the
  workers). A worker that dies (killed, out of memory) costs only the runs it was training: it
  is replaced, the sweep goes on, and those runs are redone on the next invocation.
- ``slurm``: one Slurm array job per pack through submitit (``pip install 'pathbench[slurm]'``),
  at most ``--workers`` at a time; ``--slurm KEY=VALUE`` passes executor parameters such as
  ``slurm_partition=gpu`` or ``timeout_min=60``.

``--until-solved`` runs layer counts in ascending order and skips a model's deeper layer
counts once it has solved the task (mean over seeds at the best learning rate >= the task's
solved threshold), which is what a min-layers-to-solve table needs and no more.

``--file runners/sweeps/NAME.toml`` runs the sweeps a file defines (see runners/sweeps/); options
given on the command line override the file's values.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
from collections import Counter
from dataclasses import dataclass, field, fields
from multiprocessing.connection import wait
from pathlib import Path

import click
from tqdm import tqdm

from pathbench import UserError
from pathbench.runners import store
from pathbench.runners.config import (
    DEVICES,
    PRESETS,
    SECTIONS,
    cell_key,
    parse_float_list,
    parse_int_list,
    parse_sets,
    resolve_device,
    resolve_run,
    run_id,
)
from pathbench.runners.run import execute_runs, shared_options

EXECUTORS = ("local", "slurm")
# submitit's cluster for --executor slurm; the tests set "local" to run the same path without
# a Slurm installation.
SUBMITIT_CLUSTER = "slurm"
SWEEPS_DIR = Path(__file__).parent / "sweeps"
# The outcome counted when a sweep training in its own process stops because a failed run left
# that process unable to use the GPU (workers in separate processes are replaced instead).
GPU_LOST = "stopped (GPU lost)"


@dataclass
class Grid:
    """One grid of runs over a single task; None means the task's default."""

    task: str
    models: list[str] | None = None
    layers: list[int] | None = None
    heads: list[int] | None = None
    lrs: list[float] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    d_model: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    preset: str | None = None
    sets: list[str] = field(default_factory=list)
    grid: dict[str, list[str]] = field(default_factory=dict)  # "task.n_back" -> ["1", "2"]
    until_solved: bool = False
    pack: int = 1  # runs trained as one model (those differing only in seed and lr)

    def configs(self, device: str) -> list[dict]:
        """Every grid point, resolved; duplicates (same run id) appear once."""
        if self.until_solved:
            from pathbench.tasks import make_task

            if make_task(self.task).solved_threshold is None:
                raise UserError(f"until_solved needs a task with a solved threshold; "
                                f"{self.task!r} has none")
        axes = [self.models or [None], self.layers or [None], self.heads or [None],
                self.lrs or [None], self.seeds]
        extra_keys = list(self.grid)
        configs = {}
        for model, layers, heads, lr, seed, *extra in itertools.product(
            *axes, *(self.grid[key] for key in extra_keys)
        ):
            sets = parse_sets([*self.sets, *(f"{k}={v}" for k, v in zip(extra_keys, extra))])
            config = resolve_run(
                self.task,
                options={"model": model, "layers": layers, "heads": heads, "lr": lr,
                         "d_model": self.d_model, "steps": self.steps,
                         "batch_size": self.batch_size},
                sets=sets, seed=seed, device=device, preset=self.preset,
            )
            configs.setdefault(run_id(config), config)
        return list(configs.values())


def parse_grid_options(items) -> dict[str, list[str]]:
    """``["task.n_back=1,2,3"]`` -> ``{"task.n_back": ["1", "2", "3"]}``."""
    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not _is_setting_key(key.strip()) or not values.strip():
            raise UserError(f"--grid expects SECTION.KEY=V1,V2,... with SECTION one of "
                            f"{', '.join(SECTIONS)}, got {item!r}")
        grid[key.strip()] = [value.strip() for value in values.split(",")]
    return grid


def _is_setting_key(key: str) -> bool:
    section, dot, name = key.partition(".")
    return bool(dot and name) and section in SECTIONS


# --- sweep files ----------------------------------------------------------------------------

FILE_KEYS = {"include", "sweep", "out", "workers", "device", "executor"}
TABLE_KEYS = {f.name for f in fields(Grid)} - {"sets"} | {"set"}


def find_sweep_file(name: str) -> Path:
    """A path, or the name of a file shipped in runners/sweeps/ (``paper``, ``flipflop.toml``)."""
    for candidate in (Path(name), SWEEPS_DIR / name, SWEEPS_DIR / f"{name}.toml"):
        if candidate.is_file():
            return candidate
    shipped = ", ".join(sorted(path.stem for path in SWEEPS_DIR.glob("*.toml")))
    raise UserError(f"sweep file {name!r} not found; shipped sweep files: {shipped}")


def load_sweep_file(path: Path, seen: tuple = ()) -> tuple[dict, list[Grid]]:
    """(top-level settings, grids) of a sweep file and the files it includes."""
    import tomllib

    path = Path(path).resolve()
    if path in seen:
        raise UserError(f"sweep file {path} includes itself")
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read sweep file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise UserError(f"sweep file {path}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                        f"{', '.join(sorted(FILE_KEYS))}")
    settings = {key: data[key] for key in ("out", "workers", "device", "executor") if key in data}
    grids = []
    for included in data.get("include", []):
        included_settings, included_grids = load_sweep_file(path.parent / included,
                                                            (*seen, path))
        settings = {**included_settings, **settings}
        grids += included_grids
    for number, table in enumerate(data.get("sweep", []), start=1):
        grids.append(_grid_from_table(table, f"sweep file {path}, [[sweep]] #{number}"))
    if not grids:
        raise UserError(f"sweep file {path} defines no [[sweep]] table")
    return settings, grids


def _grid_from_table(table: dict, where: str) -> Grid:
    unknown = set(table) - TABLE_KEYS
    if unknown:
        raise UserError(f"{where}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                        f"{', '.join(sorted(TABLE_KEYS))}")
    if "task" not in table:
        raise UserError(f"{where}: 'task' is required")

    def listed(key):  # a TOML list or the command line's comma-separated text
        value = table.get(key)
        return None if value is None else ",".join(map(str, value)) if isinstance(
            value, list) else str(value)

    sets, grid_table = table.get("set", []), table.get("grid", {})
    if not (isinstance(sets, list) and all(isinstance(item, str) for item in sets)):
        raise UserError(f'{where}: set must be a list like ["task.length=64"], got {sets!r}')
    if not isinstance(grid_table, dict):
        raise UserError(f'{where}: grid must be a table like {{"task.n_back" = [1, 2]}}, '
                        f"got {grid_table!r}")
    grid = Grid(task=table["task"])
    return _apply(grid, f"{where}: ", models=listed("models"), layers=listed("layers"),
                  heads=listed("heads"), lrs=listed("lrs"), seeds=listed("seeds"),
                  d_model=table.get("d_model"), steps=table.get("steps"),
                  batch_size=table.get("batch_size"), preset=table.get("preset"),
                  sets=sets,
                  grid={key: [str(v) for v in (values if isinstance(values, list) else [values])]
                        for key, values in grid_table.items()},
                  until_solved=table.get("until_solved"), pack=table.get("pack"))


def _apply(target: Grid, prefix: str, **values) -> Grid:
    """Set the given (not None) values on a grid, parsing the comma-separated list options.
    ``prefix`` + key names a value in messages: "--layers" or "sweep file F: layers"."""
    parsers = {
        "models": lambda text: [name.strip() for name in text.split(",") if name.strip()],
        "layers": lambda text: parse_int_list(text, f"{prefix}layers"),
        "heads": lambda text: parse_int_list(text, f"{prefix}heads"),
        "seeds": lambda text: parse_int_list(text, f"{prefix}seeds"),
        "lrs": lambda text: parse_float_list(text, f"{prefix}lrs"),
    }
    for key, value in values.items():
        if value is None:
            continue
        if key in parsers:
            value = parsers[key](value)
        elif key in ("d_model", "steps", "batch_size", "pack") and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{prefix}{key} must be an integer, got {value!r}")
        elif key == "pack" and value < 1:
            raise UserError(f"{prefix}pack must be >= 1, got {value}")
        elif key == "preset" and value not in PRESETS:
            raise UserError(f"{prefix}preset: unknown preset {value!r}; valid choices: "
                            f"{', '.join(PRESETS)}")
        elif key == "until_solved" and not isinstance(value, bool):
            raise UserError(f"{prefix}until_solved must be true or false, got {value!r}")
        elif key == "grid" and not all(_is_setting_key(name) for name in value):
            raise UserError(f"{prefix}grid keys must be SECTION.KEY with SECTION one of "
                            f"{', '.join(SECTIONS)}, got {', '.join(value)}")
        setattr(target, key, value)
    return target


# --- executors ------------------------------------------------------------------------------


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


# --- the sweep ------------------------------------------------------------------------------


def run_grids(grids: list[Grid], *, out: Path, device: str, workers: int, executor: str,
              slurm_params: dict, dry_run: bool = False) -> Counter:
    """Resolve every grid, skip finished runs, run the rest (in packs of up to each grid's
    ``pack`` runs); returns counts by outcome."""
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    device = resolve_device(device) if executor == "local" else device
    if device == "auto":  # on Slurm the compute node decides; presets must then be explicit
        device = "cuda"
    planned = [(grid, grid.configs(device)) for grid in grids]
    total = sum(len(configs) for _, configs in planned)
    counts: Counter = Counter()
    done: set[str] = set()
    for grid, configs in planned:
        done_here = {run_id(config) for config in configs if _is_done(out / run_id(config))}
        done |= done_here
        counts["already done"] += len(done_here)
        click.echo(f"sweep {grid.task}: {len(configs)} runs, {len(done_here)} already done",
                   err=True)
    if dry_run:
        # what a run would do now: skip a deeper layer count already known to be unnecessary
        dropped: set[str] = set()
        schedule = _Schedule(planned, out, lambda configs: dropped.update(map(run_id, configs)))
        while (pack := schedule.next_pack()) is not None:
            for config in pack:  # as if it had ended without a record
                schedule.ended(run_id(config))
        for _, configs in planned:
            for config in configs:
                name = run_id(config)
                needless = name in dropped and name not in schedule.handed_out
                mark = "done" if name in done else "skip" if needless else "todo"
                reason = "  (solved at fewer layers)" if mark == "skip" else ""
                click.echo(f"{mark}  {name}{reason}")
        return counts

    bar = tqdm(total=total, initial=counts["already done"], desc="sweep", unit="run",
               dynamic_ncols=True)

    def skip(configs: list[dict]) -> None:
        counts["skipped (solved at fewer layers)"] += len(configs)
        bar.total -= len(configs)
        bar.refresh()

    schedule = _Schedule(planned, out, skip)

    def report(name: str, summary: dict | None) -> None:
        status = summary["status"] if summary else "lost"
        counts[status] += 1
        if status != "ok":
            reason = summary["reason"] if summary else "its worker died; rerun the sweep"
            tqdm.write(f"{name}: {status}: {reason}", file=sys.stderr)
        bar.update(1)
        bar.set_postfix({key: value for key, value in counts.items() if key != "already done"})
        schedule.ended(name)

    # One worker trains in this process; more are separate processes.
    remaining = total - counts["already done"]
    pool = (LocalPool(min(workers, remaining))
            if executor == "local" and workers > 1 and remaining else None)
    try:
        if pool is not None:
            pool.run(schedule.next_pack, out, report)
        elif executor == "local":
            while (pack := schedule.next_pack()) is not None:
                records = execute_runs(pack, out, progress=False)
                for summary in _summaries(records):
                    report(summary["run_id"], summary)
                if _gpu_lost(records):
                    counts[GPU_LOST] += 1
                    break
        else:
            run_slurm(schedule.next_pack, out, workers, slurm_params, report)
    finally:
        if pool is not None:
            pool.close()
        bar.close()
    return counts


class _Schedule:
    """The runs a sweep has still to train, handed out as packs once they may start.

    A grid is a chain of steps: a plain grid is one step, all its runs; an --until-solved grid
    is a chain per model (per depth-free cell), one step per layer count, and a step starts
    once every run of the step before it has ended and the model has not solved the task
    there; once it has, the chain's deeper runs are dropped (unless another grid needs them).
    Chains wait for nothing else: not for other models, nor other grids, so that workers freed
    by one finish the work of another. An --until-solved grid's packs go first, those with the
    most layer counts still ahead first, because their chains are the longest paths through the
    sweep; then the rest, longest runs first.
    """

    def __init__(self, planned: list[tuple[Grid, list[dict]]], out: Path, drop):
        self.out = out
        self.drop = drop  # called with the runs (not yet done) that a solved model never needs
        self.ready: list[tuple[tuple, list[dict]]] = []  # (priority, pack)
        # run id -> the chains waiting for it, for each run handed out and not ended (two
        # grids of one sweep may share runs; each is trained once)
        self.waiting: dict[str, list[_Chain]] = {}
        self.handed_out: set[str] = set()  # every run id ever queued
        # plain grids first: a run one of them needs is never dropped by a chain
        for grid, configs in sorted(planned, key=lambda item: item[0].until_solved):
            if not grid.until_solved:
                self._advance(_Chain(grid, [configs]))
                continue
            cells: dict[str, dict[int, list[dict]]] = {}
            for config in configs:
                depths = cells.setdefault(cell_key(config, with_layers=False), {})
                depths.setdefault(config["model"]["layers"], []).append(config)
            for depths in cells.values():
                self._advance(_Chain(grid, [depths[layers] for layers in sorted(depths)]))

    def next_pack(self) -> list[dict] | None:
        """The pack to train next, or None while none may start."""
        if not self.ready:
            return None
        self.ready.sort(key=lambda item: item[0])  # stable: equals keep the order handed out
        return self.ready.pop(0)[1]

    def ended(self, name: str) -> None:
        """A run handed out has ended, with a record or without (its worker died)."""
        for chain in self.waiting.pop(name, []):
            chain.running.discard(name)
            if not chain.running:
                self._advance(chain)

    def _advance(self, chain: _Chain) -> None:
        """Hand out the chain's next step that has runs to do, or drop the rest if solved."""
        while chain.steps:
            if chain.last is not None and chain.grid.until_solved and self._solved(chain.last):
                self.drop([config for step in chain.steps for config in step
                           if run_id(config) not in self.handed_out
                           and not _is_done(self.out / run_id(config))])
                chain.steps = []
                return
            chain.last = step = chain.steps.pop(0)
            todo = [config for config in step if not _is_done(self.out / run_id(config))]
            new = [config for config in todo if run_id(config) not in self.waiting]
            self.handed_out.update(run_id(config) for config in new)
            steps_ahead = len(chain.steps) + 1 if chain.grid.until_solved else 0
            for pack in in_packs(in_run_order(new), chain.grid.pack):
                self.ready.append(((-steps_ahead, *_run_order(pack[0])), pack))
            chain.running = {run_id(config) for config in todo}
            for name in chain.running:
                self.waiting.setdefault(name, []).append(chain)
            if chain.running:
                return

    def _solved(self, step: list[dict]) -> bool:
        from pathbench.runners.report import load_frame, solved_cells

        recorded = {run_id(config) for config in step if _is_done(self.out / run_id(config))}
        if not recorded:  # a dry run before any record, or every worker died
            return False
        return cell_key(step[0], with_layers=False) in solved_cells(load_frame(self.out, recorded))


@dataclass
class _Chain:
    grid: Grid
    steps: list[list[dict]]  # the steps not yet handed out, in order
    last: list[dict] | None = None  # the step handed out (or found done) last
    running: set[str] = field(default_factory=set)  # its runs that have not ended


def in_run_order(configs: list[dict]) -> list[dict]:
    """Longest runs first, so that the last ones to finish are short; among equals, seed 0 of
    every configuration before any seed 1, so that a sweep cut short has every cell."""
    return sorted(configs, key=_run_order)


def _run_order(config: dict) -> tuple:
    return -run_cost(config), config["seed"]


def in_packs(configs: list[dict], size: int) -> list[list[dict]]:
    """Runs that differ only in seed and learning rate, grouped in packs of up to ``size``, in
    the order of each pack's first run."""
    groups: dict[str, list[dict]] = {}
    for config in configs:
        groups.setdefault(cell_key(config), []).append(config)
    return [group[start : start + size] for group in groups.values()
            for start in range(0, len(group), size)]


def run_cost(config: dict) -> int:
    """A rough measure of a run's work: tokens trained times layers times width."""
    train, model = config["train"], config["model"]
    length = config["task"]["config"].get("length", 1)
    return train["steps"] * train["batch_size"] * length * model["layers"] * model["d_model"]


def _is_done(run_dir: Path) -> bool:
    """store.is_done, with a corrupt record set aside (and the run redone)."""
    try:
        return store.is_done(run_dir)
    except store.CorruptRecord as exc:
        aside = store.set_aside_corrupt(run_dir)
        tqdm.write(f"{exc}\n  moved to {aside}; that run is redone", file=sys.stderr)
        return False


@click.command()
@click.argument("task", required=False)
@click.option("--models", default=None, help="Attention variants, comma-separated (path,rope).")
@click.option("--layers", default=None, help="Layer counts: 1-6, 1,2,4 or 1-3,6.")
@click.option("--heads", default=None, help="Head counts, e.g. 1,2.")
@click.option("--lrs", default=None, help="Learning rates, e.g. 1e-3,3e-4.")
@click.option("--seeds", default="0", show_default=True, help="Seeds, e.g. 0-2.")
@click.option("--grid", "grid_options", multiple=True, metavar="SECTION.KEY=V1,V2",
              help="Also sweep any task./model./train. setting (repeatable).")
@click.option("--until-solved", is_flag=True, default=None,
              help="Stop adding layers to a model once it solves the task.")
@shared_options
@click.option("--workers", type=int, default=1, show_default=True,
              help="Runs (or packs) trained at once: local processes, or concurrent Slurm jobs.")
@click.option("--pack", type=int, default=None,
              help="Train up to N runs that differ only in seed and learning rate as one "
                   "batched model (keeps a GPU busy with small models). Default 1.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: worker processes here; slurm: one job per pack through submitit.")
@click.option("--slurm", "slurm_options", multiple=True, metavar="KEY=VALUE",
              help="submitit executor parameter, e.g. slurm_partition=gpu (repeatable).")
@click.option("--file", "sweep_file", default=None,
              help="Run the sweeps a TOML file defines (a path, or a shipped name: paper).")
@click.option("--dry-run", is_flag=True,
              help="List the runs as done, todo or skip (solved at fewer layers); run none.")
@click.pass_context
def sweep(ctx, task, models, layers, heads, lrs, seeds, grid_options, until_solved, d_model,
          steps, batch_size, device, preset, out, sets, workers, pack, executor, slurm_options,
          sweep_file, dry_run):
    """Run a grid of runs over TASK, or the sweeps a --file defines.

    A run whose result.json exists is skipped, so running the same command again resumes an
    interrupted sweep. Exit status 1 if a worker died before finishing its run.
    """

    def given(name):
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    grid_values = dict(models=models, layers=layers, heads=heads, lrs=lrs, d_model=d_model,
                       steps=steps, batch_size=batch_size, preset=preset,
                       grid=parse_grid_options(grid_options) or None,
                       until_solved=until_solved, seeds=seeds, pack=pack)
    if sweep_file is not None:
        if task is not None:
            raise UserError("give either TASK or --file, not both")
        settings, grids = load_sweep_file(find_sweep_file(sweep_file))
        overrides = {key: value for key, value in grid_values.items()
                     if given("grid_options" if key == "grid" else key)}
        for grid in grids:
            _apply(grid, "--", **overrides)
            grid.sets = [*grid.sets, *sets]
        out = out if given("out") else Path(settings.get("out", out))
        workers = workers if given("workers") else settings.get("workers", workers)
        device = device if given("device") else settings.get("device", device)
        executor = executor if given("executor") else settings.get("executor", executor)
        if device not in DEVICES or executor not in EXECUTORS:
            raise UserError(f"sweep file: device must be one of {', '.join(DEVICES)} and "
                            f"executor one of {', '.join(EXECUTORS)}")
    else:
        if task is None:
            raise UserError("give a TASK to sweep over, or --file NAME")
        grids = [_apply(Grid(task=task, sets=list(sets)), "--", **grid_values)]

    counts = run_grids(grids, out=out, device=device, workers=workers, executor=executor,
                       slurm_params=parse_slurm_params(slurm_options), dry_run=dry_run)
    if dry_run:
        return
    summary = ", ".join(f"{value} {key}" for key, value in counts.items() if value)
    click.echo(f"sweep finished: {summary or 'nothing to do'}; records in {out}")
    if counts["lost"]:
        click.echo(f"{counts['lost']} runs did not finish; run the same command again to finish "
                   f"them", err=True)
        sys.exit(1)
    if counts[GPU_LOST]:
        click.echo("the sweep stopped: a failed run left this process unable to use the GPU; "
                   "run the same command again to go on", err=True)
        sys.exit(1)
