"""Executing runs: train and evaluate resolved configurations, and record each.

``execute_runs`` is the single place where runs happen: the ``run`` command calls it for one
run (``execute_run``), sweep workers for each pack of runs. It never raises for a failing run:
a crash is recorded as status "failed" with the reason, a NaN loss as "diverged" with the step,
so a sweep goes on. Only an interrupt (Ctrl-C, a kill) leaves a run without result.json, i.e.
not done.
"""

from __future__ import annotations

import functools
import platform
import subprocess
import time
import traceback
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pathbench
from pathbench.runners.training import store
from pathbench.runners.training.config import DECISIONS, Run


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit of the source tree pathbench is imported from, if it is a git checkout."""
    source = Path(pathbench.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True,
                                text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=source, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": None, "git_dirty": None}
    if commit.returncode != 0:
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def plugin_provenance(run: Run) -> dict:
    """The task and attention of a run that come from other packages: {"task": {"name",
    "package", "version"}, "attention": {...}}; empty for built-ins."""
    from pathbench.models import ATTENTIONS
    from pathbench.registry import BUILTIN
    from pathbench.tasks import TASKS

    plugins = {}
    for kind, registry, name in (("task", TASKS, run.task.name),
                                 ("attention", ATTENTIONS, run.model.attention)):
        package = registry.origin(name)
        if package != BUILTIN:
            plugins[kind] = {"name": name, "package": package,
                             "version": _package_version(package)}
    return plugins


def run_provenance(run: Run, device) -> dict:
    """What produced a record of ``run`` on ``device`` (a torch.device): versions, commit,
    hardware, where training data came from; the dataset hash and wall time are filled later."""
    import torch

    from pathbench.runners.training.loop import on_device_data

    return {
        "pathbench_version": pathbench.__version__,
        **git_state(),
        "torch_version": torch.__version__,
        "triton_version": _package_version("triton"),
        "python_version": platform.python_version(),
        "device": run.device,
        "device_name": device_name(device),
        "task_version": run.task.version,
        "attention_backend": None,  # what computed the attention: "torch" or "triton"
        # where training batches were drawn: "device", or "cpu" (and why, on a GPU)
        "training_data": ("device" if on_device_data(run.task, device) else
                          "cpu (the task has no device sampler)" if device.type == "cuda"
                          else "cpu"),
        "plugins": plugin_provenance(run),
        "dataset_hash": None,
    }


def execute_run(run: Run, out: Path, progress: bool = True) -> dict:
    """Train and evaluate one run into ``out/<run_id>/`` and return its result record."""
    return execute_runs([run], out, progress)[0]


def execute_runs(runs: list[Run], out: Path, progress: bool = True) -> list[dict]:
    """Train runs that differ only in seed and learning rate as one pack
    (``pathbench.models.pack``), each into its own ``out/<run_id>/``; their result records.

    A model that cannot be packed (a plugin module of unknown kind) trains its runs one after
    another instead.
    """
    import torch

    from pathbench.models import build_model, count_parameters
    from pathbench.models.pack import NotPackable, pack_models
    from pathbench.runners.training.loop import Member, activation_dtype, train

    if len({(run.cell_key(), run.device) for run in runs}) != 1:
        raise ValueError("a pack's runs must differ only in seed and learning rate")
    shared = runs[0]
    run_dirs = [Path(out) / run.run_id for run in runs]
    for run, run_dir in zip(runs, run_dirs):
        run_dir.mkdir(parents=True, exist_ok=True)
        store.write_json_atomic(run_dir / store.CONFIG_FILE, run.config)
    # An earlier record of these runs stays until the new ones are complete (see store).
    curves = [store.CurveWriter(run_dir) for run_dir in run_dirs]
    weights: list[dict | None] = [None] * len(runs)  # each run's final weights ("ok" only)
    device = torch.device(shared.device)
    started = datetime.now(timezone.utc)
    clock = time.perf_counter()
    shared_provenance = run_provenance(shared, device)
    records = []
    for run, run_dir in zip(runs, run_dirs):
        provenance = {
            **shared_provenance,
            "seed": run.seed,
            "started_at": started.isoformat(timespec="seconds"),
            "wall_time_s": None,
            "pack": [directory.name for directory in run_dirs],
        }
        records.append({"run_id": run_dir.name, "status": "failed", "reason": None, "steps": 0,
                        "stopped_early": False, "stop_reason": None, "budget_limited": False,
                        "primary_metric": None,
                        "solved_threshold": None, "metrics": {}, "validation": {},
                        "baselines": {}, "decisions": DECISIONS,
                        "config": run.config, "provenance": provenance})
    try:
        task = shared.task
        models = []
        for run in runs:
            torch.manual_seed(run.seed)
            models.append(build_model(run.model))
        backend = models[0].attention_backend(device, activation_dtype(device))
        size = {"parameters": count_parameters(models[0]), "state_size": models[0].state_size()}
        for record in records:
            record["provenance"]["attention_backend"] = backend
            record["model_size"] = size
        try:
            packs = [(pack_models(models), list(range(len(runs))))]
        except NotPackable:
            packs = [(model, [index]) for index, model in enumerate(models)]
        for model, indices in packs:
            members = [Member(runs[i].seed, runs[i].train.lr, curves[i]) for i in indices]
            label = run_dirs[indices[0]].name + (f" +{len(indices) - 1}" if len(indices) > 1
                                                 else "")
            outcomes = train(model, task, shared.train, members, device, progress=progress,
                             label=label)
            for index, outcome in zip(indices, outcomes):
                _record_outcome(records[index], outcome, task)
                weights[index] = outcome.weights
    except Exception as exc:  # any crash of these runs is recorded, the caller goes on
        for record in records:
            if record["status"] == "failed":
                record.update(reason=f"{type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc())
    finally:
        for curve in curves:
            curve.close()
    wall_time = round(time.perf_counter() - clock, 3)
    for record, run_dir, curve, state in zip(records, run_dirs, curves, weights):
        record["provenance"]["wall_time_s"] = wall_time
        record["run_dir"] = str(run_dir)
        if record["status"] == "failed" and _finished(run_dir):  # a forced rerun that crashed
            curve.drop()
            continue
        curve.keep()
        if state is None:
            (run_dir / store.WEIGHTS_FILE).unlink(missing_ok=True)
        else:
            saved = {"model_config": record["config"]["model"], "state_dict": state}
            store.write_atomic(run_dir / store.WEIGHTS_FILE, lambda f: torch.save(saved, f))
        store.write_json_atomic(run_dir / store.RESULT_FILE, record)  # last: the run is done
    return records


def _finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished record (a damaged one counts as not)."""
    try:
        return store.is_done(run_dir)
    except store.CorruptRecord:
        return False


def _record_outcome(record: dict, outcome, task) -> None:
    record.update(status=outcome.status, reason=outcome.reason, steps=outcome.steps,
                  stopped_early=outcome.stopped_early, stop_reason=outcome.stop_reason,
                  budget_limited=outcome.budget_limited, metrics=outcome.metrics,
                  validation=outcome.validation, baselines=outcome.baselines,
                  primary_metric=task.primary_metric,
                  solved_threshold=task.solved_threshold)
    record["provenance"]["dataset_hash"] = outcome.dataset_hash
