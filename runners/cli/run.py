"""`pathbench run`: train and evaluate one model on one task, and record it."""

from __future__ import annotations

import click

from pathbench import UserError
from pathbench.files import check_writable
from pathbench.runners.cli.options import shared_options
from pathbench.runners.training import store
from pathbench.runners.training.config import parse_sets, resolve_device, resolve_run


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
    resolved = resolve_run(
        task,
        options={"model": model, "layers": layers, "heads": heads, "d_model": d_model,
                 "steps": steps, "batch_size": batch_size, "lr": lr},
        sets=parse_sets(sets), seed=seed, device=device, preset=preset,
    )
    run_dir = out / resolved.run_id
    if not force and store.is_done(run_dir):
        raise UserError(f"{run_dir} already holds this run, finished; `pathbench results "
                        f"{run_dir}` shows it, and --force trains it again, replacing it")
    check_writable(out)
    for split in resolved.task.splits:  # data that break the contract: `data`'s error, exit 2
        resolved.task.generate(1, 0, split)
    model_cfg, train_cfg = resolved.model, resolved.train
    click.echo(
        f"{task}: {model_cfg.attention}, layers {model_cfg.layers}, heads {model_cfg.heads}, "
        f"d_model {model_cfg.d_model}; steps {train_cfg.steps}, batch {train_cfg.batch_size}, "
        f"lr {train_cfg.lr:g}; {resolved.preset} preset on {device}",
        err=True,
    )
    from pathbench.runners.training.execute import execute_run  # imports torch

    record = execute_run(resolved, out)
    click.echo(describe(record))
    if record["status"] == "failed" and store.is_done(run_dir):
        click.echo(f"  the finished record in {run_dir} is kept", err=True)
    table = summary_table(record)
    if table:
        click.echo(table)
    if record["status"] != "ok":
        raise SystemExit(1)
