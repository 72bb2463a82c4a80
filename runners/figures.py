"""The paper-style figure of `pathbench plot`: one panel per experiment found in the records.

The panel kind follows from what varies among a task's runs:

- the layer count -> accuracy against layers, a line per model (mean over seeds at the best
  learning rate, shaded min..max over seeds), with the solved threshold as a dashed line;
- otherwise one task setting (e.g. mqrar's n_back) -> accuracy against that setting;
- otherwise -> a bar per model and evaluation split (flip-flop's Table 1), showing the error in
  percent where the task reports one.

Each panel also becomes a markdown table, and tasks with a solved threshold get the
minimum-layers-to-solve table; all tables are printed and written to FILE.md.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pathbench.files import write_atomic, write_text_atomic
from pathbench.runners import store
from pathbench.runners.report import (
    load_filtered,
    aggregate,
    builtin_models,
    filter_options,
    min_layers_table,
    model_order,
    tidy,
    to_markdown,
    varying_config_columns,
)

# The built-in models' colours, in the registry's order (nope, rope, sba, fox, path,
# path_fox), so that a model looks the same in every figure; other models take FALLBACK_COLOURS.
BUILTIN_COLOURS = ["#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd"]
FALLBACK_COLOURS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78"]


def colour(model: str, models: list[str]) -> str:
    builtins = builtin_models()
    if model in builtins:
        return BUILTIN_COLOURS[builtins.index(model) % len(BUILTIN_COLOURS)]
    others = [m for m in models if m not in builtins]
    return FALLBACK_COLOURS[others.index(model) % len(FALLBACK_COLOURS)]


def plan_panels(frame: pd.DataFrame) -> list[dict]:
    """(title, kind, x column, runs) for every panel, in task order. Settings that vary other
    than the x axis, the model and the head count split a task into several panels."""
    panels = []
    for task, runs in frame.groupby("task", sort=True):
        varying = varying_config_columns(runs)
        if runs["d_model"].nunique() > 1:
            varying.append("d_model")
        task_keys = [c for c in varying if c.startswith("task.")]
        if runs["layers"].nunique() > 1:
            kind, x = "lines", "layers"
        elif task_keys:
            kind, x = "lines", task_keys[0]
        else:
            kind, x = "bars", None
        split_by = [c for c in varying if c != x]
        groups = runs.groupby(split_by, sort=True, dropna=False) if split_by else [((), runs)]
        for values, group in groups:
            values = values if isinstance(values, tuple) else (values,)
            suffix = ", ".join(f"{k.split('.')[-1]}={tidy(v)}" for k, v in zip(split_by, values))
            title = f"{task} ({suffix})" if suffix else task
            panels.append(dict(title=title, kind=kind, x=x, runs=group))
    return panels


def _series_label(model: str, heads, several_heads: bool) -> str:
    return f"{model}, {heads} heads" if several_heads else model


def draw_lines(ax, panel: dict) -> str:
    runs, x = panel["runs"], panel["x"]
    table = aggregate(runs)
    table[x] = [runs.loc[runs["cell"] == cell, x].iloc[0] for cell in table["cell"]]
    headline = table["headline"].iloc[0]
    metric = table["metric"].iloc[0]
    several_heads = table["heads"].nunique() > 1
    models = model_order(table["model"])
    markdown_rows = []
    for model in models:
        for heads, cells in table[table["model"] == model].groupby("heads"):
            cells = cells.sort_values(x)
            label = _series_label(model, heads, several_heads)
            ax.plot(cells[x], cells[headline], marker="o", lw=1.8, ms=4, label=label,
                    color=colour(model, models), ls="-" if heads == table["heads"].max() else "--")
            ax.fill_between(cells[x], cells[f"{headline}_min"], cells[f"{headline}_max"],
                            color=colour(model, models), alpha=0.15, lw=0)
            markdown_rows.append({"model": label, **{f"{x.split('.')[-1]}={tidy(v)}": f"{m:.3f}"
                                  for v, m in zip(cells[x], cells[headline])}})
    threshold = table["solved_threshold"].dropna()
    if len(threshold):
        ax.axhline(threshold.iloc[0], color="black", ls=":", lw=1,
                   label=f"solved ({threshold.iloc[0]:.0%})")
    ax.set_xlabel("layers" if x == "layers" else x.split(".", 1)[1])
    ax.set_xticks(sorted(table[x].unique()))
    ax.set_ylabel(f"{metric} ({headline})")
    ax.set_ylim(-0.02, 1.02) if metric == "accuracy" else None
    ax.grid(alpha=0.3)
    title = f"{panel['title']}: {metric} ({headline}) against {ax.get_xlabel()}"
    text = f"## {title}\n\nMean over seeds at the best learning rate.\n\n"
    text += to_markdown(pd.DataFrame(markdown_rows).fillna(""))
    if x == "layers" and len(threshold):
        text += "\n\n## " + panel["title"] + ": minimum layers to solve " \
                f"({metric} >= {threshold.iloc[0]:g} on {headline})\n\n"
        text += to_markdown(min_layers_table(table))
    return text


def draw_bars(ax, panel: dict) -> str:
    runs = panel["runs"]
    has_error = any(c.endswith(":error") for c in runs.columns)
    metric = "error" if has_error else None
    table = aggregate(runs, metric)
    metric = table["metric"].iloc[0]
    splits = list(dict.fromkeys(s for split_list in runs["splits"] for s in split_list))
    models = model_order(table["model"])
    width = 0.8 / max(1, len(models))
    positions = np.arange(len(splits))
    markdown_rows = []
    for i, model in enumerate(models):
        row = table[table["model"] == model].iloc[0]
        means = np.array([row.get(split, np.nan) for split in splits], dtype=float)
        low = means - np.array([row.get(f"{s}_min", np.nan) for s in splits], dtype=float)
        high = np.array([row.get(f"{s}_max", np.nan) for s in splits], dtype=float) - means
        bars = ax.bar(positions + (i - (len(models) - 1) / 2) * width, means, width,
                      yerr=[low, high], capsize=2, color=colour(model, models), label=model,
                      error_kw={"lw": 0.8})
        ax.bar_label(bars, labels=[_bar_text(m) for m in means], fontsize=6, padding=2,
                     rotation=90)
        markdown_rows.append({"model": model, **{
            split: f"{row.get(split, np.nan):.3g} ± {row.get(f'{split}_std', np.nan):.2g}"
            for split in splits}})
    ax.set_xticks(positions, splits)
    ax.set_ylabel(f"{metric}{' (%)' if metric == 'error' else ''}")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)  # room for the rotated value labels
    title = f"{panel['title']}: {metric} per split"
    text = (f"## {title}\n\nMean ± std over seeds at the best learning rate "
            f"({metric}{' in %' if metric == 'error' else ''}).\n\n")
    return text + to_markdown(pd.DataFrame(markdown_rows))


def _bar_text(value: float) -> str:
    if np.isnan(value):
        return ""
    return "0" if value == 0 else "<0.01" if abs(value) < 0.01 else f"{value:.2g}"


def draw(frame: pd.DataFrame, output: Path) -> tuple[list[Path], str]:
    """Draw every panel into one figure; write OUTPUT.png, OUTPUT.pdf and OUTPUT.md, each through a
    temporary file renamed into place."""
    panels = plan_panels(frame)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(4.6 * columns, 3.6 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    texts = []
    for ax, panel in zip(axes, panels):
        draw_panel = draw_lines if panel["kind"] == "lines" else draw_bars
        texts.append(draw_panel(ax, panel))
        ax.set_title(panel["title"], fontsize=10)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    # One legend for the whole figure: a model has the same colour in every panel.
    legend = {}
    for ax in axes[: len(panels)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    # about four entries fit under one panel's width
    figure.legend(legend.values(), legend.keys(), loc="outside lower center",
                  ncols=min(4 * columns, len(legend)), frameon=False, fontsize=8)
    stem = output.with_suffix("") if output.suffix in (".png", ".pdf", ".md") else output
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("png", "pdf"):
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_atomic(path, lambda file: figure.savefig(file, format=fmt, dpi=200))
        written.append(path)
    tables = "\n\n".join(texts)
    markdown = stem.with_name(stem.name + ".md")
    write_text_atomic(markdown, tables + "\n")
    written.append(markdown)
    return written, tables


@click.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path),
                default=store.DEFAULT_OUT)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Figure path; FILE.png, FILE.pdf and FILE.md (the tables) are written.")
@filter_options
def plot(directory, output, task, model, layers, heads, status):
    """Draw paper-style figures of the runs under DIRECTORY (default results/runs)."""
    frame = load_filtered(directory, dict(task=task, model=model, layers=layers, heads=heads,
                                           status=status))
    written, tables = draw(frame, output)
    if tables:
        click.echo(tables)
    for path in written:
        click.echo(f"wrote {path}")
