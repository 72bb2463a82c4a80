"""`pathbench run`: train and evaluate one model on one task, and record it.

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

import click

import pathbench
from pathbench import UserError
from pathbench.files import check_writable
from pathbench.runners import store
from pathbench.runners.config import (
    DECISIONS,
    DEVICES,
    PRESETS,
    cell_key,
    parse_sets,
    resolve_device,
    resolve_run,
    run_id,
    train_config,
)


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


def plugin_provenance(config: dict) -> dict:
    """The task and attention of a run that come from other packages: {"task": {"name",
    "package", "version"}, "attention": {...}}; empty for built-ins."""
    from pathbench.models import ATTENTIONS
    from pathbench.registry import BUILTIN
    from pathbench.tasks import TASKS

    plugins = {}
    for kind, registry, name in (("task", TASKS, config["task"]["name"]),
                                 ("attention", ATTENTIONS, config["model"]["attention"])):
        package = registry.origin(name)
        if package != BUILTIN:
            plugins[kind] = {"name": name, "package": package,
                             "version": _package_version(package)}
    return plugins


def execute_run(config: dict, out: Path, progress: bool = True) -> dict:
    """Run one resolved configuration into ``out/<run_id>/`` and return its result record."""
    return execute_runs([config], out, progress)[0]


def execute_runs(configs: list[dict], out: Path, progress: bool = True) -> list[dict]:
    """Run resolved configurations that differ only in seed and learning rate as one pack
    (``pathbench.models.pack``), each into its own ``out/<run_id>/``; their result records.

    A model that cannot be packed (a plugin module of unknown kind) trains its runs one after
    another instead.
    """
    import torch

    from pathbench.models import build_model, model_config
    from pathbench.models.pack import NotPackable, pack_models
    from pathbench.runners.train import Member, activation_dtype, train
    from pathbench.tasks import make_task

    if len({(cell_key(config), config["device"]) for config in configs}) != 1:
        raise ValueError("a pack's runs must differ only in seed and learning rate")
    shared = configs[0]
    run_dirs = [Path(out) / run_id(config) for config in configs]
    for config, run_dir in zip(configs, run_dirs):
        run_dir.mkdir(parents=True, exist_ok=True)
        # A rerun of the same configuration starts clean: without result.json it counts as not
        # done, and no weights of an earlier attempt stay behind.
        (run_dir / store.RESULT_FILE).unlink(missing_ok=True)
        (run_dir / store.WEIGHTS_FILE).unlink(missing_ok=True)
        store.write_json_atomic(run_dir / store.CONFIG_FILE, config)
    curves = [store.CurveWriter(run_dir) for run_dir in run_dirs]
    device = torch.device(shared["device"])
    started = datetime.now(timezone.utc)
    clock = time.perf_counter()
    shared_provenance = {
        "pathbench_version": pathbench.__version__,
        **git_state(),
        "torch_version": torch.__version__,
        "triton_version": _package_version("triton"),
        "python_version": platform.python_version(),
        "device": shared["device"],
        "device_name": device_name(device),
        "task_version": shared["task"]["version"],
        "attention_backend": None,  # what computed the attention: "torch" or "triton"
        "plugins": plugin_provenance(shared),
        "dataset_hash": None,
    }
    records = []
    for config, run_dir in zip(configs, run_dirs):
        provenance = {
            **shared_provenance,
            "seed": config["seed"],
            "started_at": started.isoformat(timespec="seconds"),
            "wall_time_s": None,
            "pack": [directory.name for directory in run_dirs],
        }
        records.append({"run_id": run_dir.name, "status": "failed", "reason": None, "steps": 0,
                        "stopped_early": False, "primary_metric": None,
                        "solved_threshold": None, "metrics": {}, "validation": {},
                        "baselines": {}, "decisions": DECISIONS,
                        "config": config, "provenance": provenance})
    try:
        task = make_task(shared["task"]["name"], shared["task"]["config"])
        if task.version != shared["task"]["version"]:
            raise RuntimeError(f"task version is {task.version}, the config was resolved "
                               f"against {shared['task']['version']}")
        models = []
        for config in configs:
            torch.manual_seed(config["seed"])
            models.append(build_model(model_config(config["model"])))
        backend = models[0].attention_backend(device, activation_dtype(device))
        for record in records:
            record["provenance"]["attention_backend"] = backend
        try:
            packs = [(pack_models(models), list(range(len(configs))))]
        except NotPackable:
            packs = [(model, [index]) for index, model in enumerate(models)]
        for model, indices in packs:
            members = [Member(configs[i]["seed"], configs[i]["train"]["lr"], curves[i])
                       for i in indices]
            label = run_dirs[indices[0]].name + (f" +{len(indices) - 1}" if len(indices) > 1
                                                 else "")
            outcomes = train(model, task, train_config(shared["train"]), members, device,
                             progress=progress, label=label)
            for index, outcome in zip(indices, outcomes):
                _record_outcome(records[index], outcome, task, run_dirs[index])
    except Exception as exc:  # any crash of these runs is recorded, the caller goes on
        for record in records:
            if record["status"] == "failed":
                record.update(reason=f"{type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc())
    finally:
        for curve in curves:
            curve.close()
    wall_time = round(time.perf_counter() - clock, 3)
    for record, run_dir in zip(records, run_dirs):
        record["provenance"]["wall_time_s"] = wall_time
        store.write_json_atomic(run_dir / store.RESULT_FILE, record)
        record["run_dir"] = str(run_dir)
    return records


def _record_outcome(record: dict, outcome, task, run_dir: Path) -> None:
    import torch

    record.update(status=outcome.status, reason=outcome.reason, steps=outcome.steps,
                  stopped_early=outcome.stopped_early, metrics=outcome.metrics,
                  validation=outcome.validation, baselines=outcome.baselines,
                  primary_metric=task.primary_metric,
                  solved_threshold=task.solved_threshold)
    record["provenance"]["dataset_hash"] = outcome.dataset_hash
    if outcome.status == "ok":
        weights = {"model_config": record["config"]["model"], "state_dict": outcome.weights}
        store.write_atomic(run_dir / store.WEIGHTS_FILE, lambda f: torch.save(weights, f))


def summary_table(record: dict) -> str:
    """The scalar metrics of every test split, one row per split; error in percent."""
    rows = [(split, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
            for split, metrics in record["metrics"].items()]
    if not rows:
        return ""
    columns = [key for key in rows[0][1]]
    header = ["split", *(f"{key} (%)" if key == "error" else key for key in columns)]

    def cell(value) -> str:
        return str(value) if isinstance(value, int) else f"{value:.4g}"

    body = [[split, *(cell(metrics.get(key, float("nan"))) for key in columns)]
            for split, metrics in rows]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) if i else cell.ljust(width)
                               for i, (cell, width) in enumerate(zip(row, widths)))
                     for row in [header, *body])


def describe(record: dict) -> str:
    """One line: status, steps, time, where the record is."""
    wall = record["provenance"]["wall_time_s"]
    status = record["status"]
    how = " (early stop)" if record.get("stopped_early") else ""
    line = f"{status} after {record['steps']} steps{how} in {wall:.1f} s: {record['run_dir']}"
    if record.get("reason"):
        line += f"\n  reason: {record['reason']}"
    return line


# Options shared by `run` and `sweep` (the sweep adds its grid options).
def shared_options(command):
    options = [
        click.option("--d-model", type=int, default=None, help="Model width (task default)."),
        click.option("--steps", type=int, default=None, help="Training steps (task default)."),
        click.option("--batch-size", type=int, default=None,
                     help="Sequences per step (task default)."),
        click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
                     help="Where to train; auto picks cuda when a GPU is visible."),
        click.option("--preset", type=click.Choice(PRESETS), default=None,
                     help="Setting size: paper, or the smaller cpu one. Default: paper on cuda, "
                          "cpu on cpu."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                     default=store.DEFAULT_OUT, show_default=True,
                     help="Directory that receives the run directories."),
        click.option("--set", "sets", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="Override any task., model. or train. setting (repeatable)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command()
@click.argument("task")
@click.option("--model", default=None, help="Attention variant (task default, e.g. path).")
@click.option("--layers", type=int, default=None, help="Number of layers (task default).")
@click.option("--heads", type=int, default=None, help="Attention heads per layer (task default).")
@click.option("--lr", type=float, default=None, help="Peak learning rate (task default).")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed.")
@click.option("--force", is_flag=True,
              help="Train again when OUT already holds this run finished (replacing it).")
@shared_options
def run(task, model, layers, heads, lr, seed, force, d_model, steps, batch_size, device, preset,
        out, sets):
    """Train and evaluate one model on TASK; print the metrics of every split.

    Writes OUT/<run id>/ with config.json, curve.jsonl, model.pt and result.json. Exit status
    1 if the run diverged or failed (the record says why).
    """
    device = resolve_device(device)
    config = resolve_run(
        task,
        options={"model": model, "layers": layers, "heads": heads, "d_model": d_model,
                 "steps": steps, "batch_size": batch_size, "lr": lr},
        sets=parse_sets(sets), seed=seed, device=device, preset=preset,
    )
    run_dir = out / run_id(config)
    if not force and store.is_done(run_dir):
        raise UserError(f"{run_dir} already holds this run, finished; `pathbench results "
                        f"{run_dir}` shows it, and --force trains it again, replacing it")
    check_writable(out)
    model_cfg, train_cfg = config["model"], config["train"]
    click.echo(
        f"{task}: {model_cfg['attention']}, layers {model_cfg['layers']}, heads "
        f"{model_cfg['heads']}, d_model {model_cfg['d_model']}; steps {train_cfg['steps']}, "
        f"batch {train_cfg['batch_size']}, lr {train_cfg['lr']:g}; {config['preset']} preset "
        f"on {device}",
        err=True,
    )
    record = execute_run(config, out)
    click.echo(describe(record))
    table = summary_table(record)
    if table:
        click.echo(table)
    if record["status"] != "ok":
        raise SystemExit(1)
