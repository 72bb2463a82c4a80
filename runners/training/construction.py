"""Scoring a model with set weights (``pathbench.models.constructions``) the way a trained run is
scored: the same evaluation splits, sizes and fixed sequences, the same metrics and baselines,
recorded as a run of 0 steps whose table name is the construction's, so that tables and figures
show it beside the trained models of the same config."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from pathbench import UserError
from pathbench.models.constructions import CONSTRUCTIONS, Construction
from pathbench.runners.training import store
from pathbench.runners.training.config import DECISION_SPLIT, DECISIONS, Run, resolve_run
from pathbench.runners.training.execute import run_provenance
from pathbench.runners.training.loop import (
    activation_dtype,
    evaluate,
    evaluation_batch_tokens,
    evaluation_splits,
    hash_and_baselines,
    to_jsonable,
)


def construction_for(task_name: str) -> Construction:
    """The construction for a task; a UserError naming the tasks that have one."""
    if task_name not in CONSTRUCTIONS:
        raise UserError(f"task {task_name!r} has no construction; constructions exist for "
                        f"{', '.join(sorted(CONSTRUCTIONS))}")
    return CONSTRUCTIONS[task_name]


def construction_run(construction: Construction, sets: dict, device: str,
                     preset: str | None) -> Run:
    """The run whose config a construction is scored under: its task with ``sets`` (task.* and
    train.* evaluation settings), its model's shape, seed 0."""
    if sets.get("model"):
        raise UserError(f"the construction sets the model; --set model.{next(iter(sets['model']))}"
                        f" cannot change it")
    from pathbench.tasks import make_task

    shape = construction.build(make_task(construction.task).vocab).config
    return resolve_run(construction.task,
                       options={"model": shape.attention, "layers": shape.layers,
                                "heads": shape.heads, "d_model": shape.d_model},
                       sets=sets, device=device, preset=preset)


def record_id(construction: Construction, run: Run) -> str:
    """``flipflop-path_construction-L2-H2-D64-<digest>``: readable, unique per config."""
    config = record_config(construction, run)
    model = config["model"]
    identity = {key: config[key] for key in ("task", "model", "train", "construction")}
    return (f"{construction.task}-{construction.name}-L{model['layers']}-H{model['heads']}"
            f"-D{model['d_model']}-{store.config_digest(identity)[:10]}")


def record_config(construction: Construction, run: Run) -> dict:
    """The config a construction's record carries: ``run``'s, with 0 training steps and the
    construction's name."""
    return {**run.config, "train": {**run.config["train"], "steps": 0},
            "construction": construction.name}


def score_construction(construction: Construction, run: Run, out: Path,
                       progress: bool = True) -> dict:
    """Score ``construction`` on every evaluation split of ``run``'s task (val and the test
    splits, at the run's evaluation sizes) and write its record to ``out/<id>/result.json``."""
    model = construction.build(run.task.vocab)
    if dataclasses.asdict(model.config) != run.config["model"]:
        raise ValueError(f"{construction.name}'s model is not the run's: "
                         f"{model.config} != {run.model}")
    device = torch.device(run.device)
    config = record_config(construction, run)
    run_dir = Path(out) / record_id(construction, run)
    started, clock = datetime.now(timezone.utc), time.perf_counter()
    task = run.task
    splits = evaluation_splits(task, run.train)
    data_hash, baselines = hash_and_baselines(task, splits)
    batch_tokens = evaluation_batch_tokens(run.train, splits[0])
    model.to(device)
    metrics = {data.split: evaluate(model, 1, task, data, batch_tokens, device, progress=progress)[0]
               for data in splits}
    validation = metrics.pop(DECISION_SPLIT)
    record = {
        "run_id": run_dir.name, "status": "ok", "reason": None, "steps": 0,
        "stopped_early": False, "stop_reason": "construction", "budget_limited": False,
        "primary_metric": task.primary_metric, "solved_threshold": task.solved_threshold,
        "metrics": to_jsonable(metrics), "validation": validation,
        "baselines": baselines, "decisions": DECISIONS, "construction": construction.name,
        "claim": construction.claim, "config": config,
        "provenance": {
            **run_provenance(run, device), "seed": run.seed, "dataset_hash": data_hash,
            "attention_backend": model.attention_backend(device, activation_dtype(device)),
            "training_data": None, "started_at": started.isoformat(timespec="seconds"),
            "wall_time_s": round(time.perf_counter() - clock, 3)},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    store.write_json_atomic(run_dir / store.CONFIG_FILE, config)
    store.write_json_atomic(run_dir / store.RESULT_FILE, record)
    record["run_dir"] = str(run_dir)
    return record
