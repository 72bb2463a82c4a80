"""The paper-style figure of `pathbench plot`: one panel per experiment found in the records.

The panels follow from what varies among a task's runs, the first of ``LAYOUTS`` that applies:

- the layer count and the sequence length (word problems) -> the minimum depth that solves the
  task against length, a line per model, beside accuracy against layers at the longest length;
- the layer count and the head count -> a heatmap over layers x heads per model: the solve
  rate where the task has a threshold, otherwise accuracy;
- the layer count -> accuracy against layers, a line per model;
- otherwise one task setting (e.g. mqrar's n_back) -> accuracy against that setting;
- otherwise -> a bar per model and test split (flip-flop's Table 1), showing the error in
  percent where the task reports one;
- where depth varies and the task records them (word problems), the final position's accuracy
  (against chance) and the solved length (the longest prefix of positions solved) against
  layers, at the longest length trained;
- and, where the runs were also tested on longer sequences (``task.eval_lengths``: splits
  ``test_N``), the primary metric (or the error) against the evaluation length, a line per
  model and training length, at the fewest layers that solved the training length (or, if
  none did or the task has no threshold, the deepest run).

Every value is at the learning rate that val picked (`pathbench.runners.analysis.tables`); lines show the
mean over seeds and every seed as a point, bars the mean and the min..max over seeds. A cell
that did not run (a depth --until-solved skipped) gets no point and no line through it. The
solved threshold and the task's baselines (chance, and e.g. mqrar's latest assignment) are
drawn in every panel that has them; a model has the same colour in every figure. Each panel
also becomes a markdown table (beside each mean, where the task has a threshold, the seeds
that solved and the 95% Wilson interval of that rate); all tables are printed and written to
FILE.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pathbench.files import write_atomic, write_text_atomic
from pathbench.runners.analysis.cells import aggregate, varying_config_columns
from pathbench.runners.analysis.records import length_column
from pathbench.runners.analysis.tables import (
    fixed_settings,
    model_family,
    min_depth_by_length,
    min_layers_table,
    model_order,
    reading_depth,
    solve_rate_text,
    tidy,
    to_markdown,
)

# A model looks the same in every figure: the built-ins by name, other models in the order they
# appear, first from OTHER_COLOURS, then hues that no model has taken.
MODEL_COLOURS = {"nope": "#7f7f7f", "rope": "#1f77b4", "sba": "#2ca02c", "fox": "#ff7f0e",
                 "path": "#d62728", "path_fox": "#9467bd",
                 # the recurrent mixers: darker hues, apart from the attention variants'
                 "deltanet": "#0b6e4f", "gated_deltanet": "#6b8e23", "deltaproduct": "#b8860b",
                 "rwkv7": "#8b008b"}
OTHER_COLOURS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78"]
BASELINE_STYLES = ["--", "-.", (0, (1, 2)), (0, (5, 2, 1, 2))]


def colour(model: str, models: list[str]) -> str:
    """``model``'s colour in a figure of ``models``; no two models of a figure share one."""
    if model in MODEL_COLOURS:
        return MODEL_COLOURS[model]
    index = [m for m in models if m not in MODEL_COLOURS].index(model)
    if index < len(OTHER_COLOURS):
        return OTHER_COLOURS[index]
    from matplotlib.colors import hsv_to_rgb, to_hex

    # hues a golden-ratio step apart never repeat; pale and dark enough to tell from the above
    hue = (0.5 + 0.618034 * (index - len(OTHER_COLOURS))) % 1.0
    return to_hex(hsv_to_rgb((hue, 0.55, 0.55)))


def _single(runs: pd.DataFrame, column: str):
    values = runs[column].dropna().unique() if column in runs else []
    return tidy(values[0]) if len(values) == 1 else None


@dataclass(frozen=True)
class Layout:
    """A task's panels: what must vary among its runs for this layout to apply, and the panels
    (a kind of `PANELS` and its x column) it draws. Each is a function of the runs' varying
    task settings and the column of the task's length setting."""

    applies: Callable[[pd.DataFrame, list[str], str | None], bool]
    panels: Callable[[list[str], str | None], list[tuple[str, str | None]]]  # (kind, x)
    axes: Callable[[list[str], str | None], list[str]] = lambda keys, length: []


def _varies(runs: pd.DataFrame, column: str) -> bool:
    return runs[column].nunique() > 1


# The first layout that applies to a task's runs is drawn, in this order.
LAYOUTS = {
    "depth against length": Layout(
        lambda runs, keys, length: _varies(runs, "layers") and length in keys,
        lambda keys, length: [("depth_vs_length", length), ("lines", "layers")],
        lambda keys, length: [length]),
    "layers x heads": Layout(
        lambda runs, keys, length: _varies(runs, "layers") and _varies(runs, "heads"),
        lambda keys, length: [("heatmap", "layers")]),
    "against layers": Layout(lambda runs, keys, length: _varies(runs, "layers"),
                             lambda keys, length: [("lines", "layers")]),
    "against a task setting": Layout(lambda runs, keys, length: bool(keys),
                                     lambda keys, length: [("lines", keys[0])],
                                     lambda keys, length: keys[:1]),
    "per split": Layout(lambda runs, keys, length: True, lambda keys, length: [("bars", None)]),
}


def plan_panels(frame: pd.DataFrame) -> list[dict]:
    """(title, kind, x column, runs) for every panel, in task order. Settings that vary other
    than the panel's axes and the model split a task into several panels."""
    panels = []
    for task, runs in frame.groupby("task", sort=True):
        # longer test splits add columns, not a setting that splits panels; nor does a setting
        # each model has one value of (model.backend, say): it tells the models apart
        varying = [c for c in varying_config_columns(runs) if c != "task.eval_lengths"
                   and runs.groupby("model")[c].agg(lambda v: v.astype(str).nunique()).max() > 1]
        if runs["d_model"].nunique() > 1:
            varying.append("d_model")
        task_keys = [c for c in varying if c.startswith("task.")]
        length = length_column(task)
        layout = next(layout for layout in LAYOUTS.values()
                      if layout.applies(runs, task_keys, length))
        kinds, axes = layout.panels(task_keys, length), layout.axes(task_keys, length)
        split_by = [c for c in varying if c not in axes]
        groups = runs.groupby(split_by, sort=True, dropna=False) if split_by else [((), runs)]
        for values, group in groups:
            values = values if isinstance(values, tuple) else (values,)
            named = ", ".join(f"{k.split('.')[-1]}={tidy(v)}" for k, v in zip(split_by, values))
            for kind, x in kinds:
                shown = group
                if kind == "lines" and x == "layers" and length in axes:
                    longest = group[length].max()  # accuracy against depth at one length
                    shown = group[group[length] == longest]
                if kind == "heatmap":  # a panel per model
                    for model in model_order(group["model"]):
                        own = group[group["model"] == model]
                        panels.append(dict(title=f"{_title(task, named, own)}: {model}",
                                           kind=kind, x=x, runs=own))
                    continue
                panels.append(dict(title=_title(task, named, shown), kind=kind, x=x, runs=shown))
            # the final position's accuracy (against chance) and the longest prefix solved,
            # against depth at the longest length trained, for tasks that record them
            longest = (group[group[length] == group[length].max()] if length in group
                       else group)
            for metric, baselines in (("last_accuracy", ["chance"]), ("solved_length", [])):
                if (_varies(group, "layers") and f"test:{metric}" in group
                        and group[f"test:{metric}"].notna().any()):
                    panels.append(dict(title=_title(task, named, longest), kind="lines",
                                       x="layers", runs=longest, metric=metric,
                                       baselines=baselines))
            if _longer_splits(group):
                title = _title(task, named, group) + ", longer tests"
                panels.append(dict(title=title, kind="generalisation", x=None, runs=group))
    return panels


def _longer_splits(runs: pd.DataFrame) -> list[str]:
    """The test_N splits among the runs', in order of N."""
    names = {s for split_list in runs["splits"] for s in split_list
             if s.startswith("test_") and s[5:].isdigit()}
    return sorted(names, key=lambda split: int(split[5:]))


def _title(task: str, named: str, runs: pd.DataFrame) -> str:
    """The task, the settings that split its panels, its length and its step budget."""
    parts = ([named] if named else []) + fixed_settings(task, runs)
    return f"{task} ({', '.join(parts)})" if parts else task


def _picked_runs(runs: pd.DataFrame, row) -> pd.DataFrame:
    """The runs of a table row's cell at the learning rate val picked."""
    return runs[(runs["cell"] == row["cell"]) & (runs["lr"] == row["lr"])]


def _spread_note(table: pd.DataFrame) -> str:
    seeds = sorted(set(table["ok"]))
    counts = "/".join(map(str, seeds)) if seeds else "0"
    return (f"Learning rate picked on val; mean over the seeds that finished (n = {counts}); "
            f"spread: min..max over seeds in figures, sample standard deviation (n - 1) in "
            f"tables.")


def draw_baselines(ax, runs: pd.DataFrame, split: str, x: str | None,
                   only: list[str] | None = None) -> list[dict]:
    """The task's baselines on ``split`` (or ``only`` the named ones): a dashed line each (over
    x, when it varies with x); their values, for the panel's table."""
    rows = []
    prefix = f"baseline:{split}:"
    # a column another task's runs brought into the frame is all NaN here
    columns = [c for c in runs.columns if c.startswith(prefix) and runs[c].notna().any()
               and (only is None or c[len(prefix):] in only)]
    for number, column in enumerate(columns):
        name = column[len(prefix):].replace("_", " ")
        style = dict(color="black", lw=1, alpha=0.6,
                     ls=BASELINE_STYLES[number % len(BASELINE_STYLES)], label=name)
        if x is None:
            value = runs[column].mean()
            ax.axhline(value, **style)
            rows.append({"model": f"baseline: {name}", "value": f"{value:.3g}"})
        else:
            values = runs.groupby(x)[column].mean()
            if values.nunique() == 1 or x == "layers":
                ax.axhline(values.mean(), **style)
            else:
                ax.plot(values.index, values.values, marker="x", ms=4, **style)
            rows.append({"model": f"baseline: {name}",
                         **{_x_label(x, v): f"{m:.3f}" for v, m in values.items()}})
    return rows


def _x_label(x: str, value) -> str:
    return f"{x.split('.')[-1]}={tidy(value)}"


def draw_lines(ax, panel: dict) -> str:
    """The primary metric (or the panel's "metric") against x, a line per model; the baselines
    and the solved line where the metric is the primary one."""
    runs, x = panel["runs"], panel["x"]
    table = aggregate(runs, panel.get("metric"))
    primary = panel.get("metric") is None
    table[x] = [runs.loc[runs["cell"] == cell, x].iloc[0] for cell in table["cell"]]
    headline, metric = table["headline"].iloc[0], table["metric"].iloc[0]
    grid = sorted(table[x].unique())
    several_heads = table["heads"].nunique() > 1
    models = model_order(table["model"])
    markdown_rows = []
    for model in models:
        for heads, cells in table[table["model"] == model].groupby("heads"):
            cells = cells.sort_values(x)
            label = f"{model}, {heads} heads" if several_heads else model
            colour_ = colour(model, models)
            # NaN where a cell did not run: the line breaks there instead of bridging it
            means = cells.set_index(x)[headline].reindex(grid)
            ax.plot(grid, means.values, marker="o", lw=1.8, ms=4, label=label, color=colour_,
                    ls="-" if heads == table["heads"].max() else "--")
            for _, row in cells.iterrows():
                seeds = _picked_runs(runs, row)[f"{headline}:{metric}"].dropna()
                ax.scatter([row[x]] * len(seeds), seeds, s=9, color=colour_, alpha=0.45, lw=0)
            sds = cells.set_index(x)[f"{headline}_std"].reindex(grid)
            solves = (cells.set_index(x)[["solved_seeds", "seeds", "solve_low", "solve_high"]]
                      .reindex(grid) if primary and cells["solved_threshold"].notna().any()
                      else None)
            markdown_rows.append({"model": label, **{
                _x_label(x, v): _cell_text(m, sd, None if solves is None else solves.loc[v])
                for v, m, sd in zip(grid, means, sds)}})
    if primary or panel.get("baselines"):
        markdown_rows += draw_baselines(ax, runs, headline, x,
                                        None if primary else panel["baselines"])
    threshold = table["solved_threshold"].dropna() if primary else pd.Series(dtype=float)
    if len(threshold):
        ax.axhline(threshold.iloc[0], color="black", ls=":", lw=1,
                   label=f"solved ({threshold.iloc[0]:.0%})")
    ax.set_xlabel("layers" if x == "layers" else x.split(".", 1)[1])
    ax.set_xticks(grid)
    ax.set_ylabel(f"{metric} ({headline})")
    ax.set_ylim(-0.02, 1.02) if metric in ("accuracy", "last_accuracy") else None
    if metric == "solved_length":  # positions, from none to the whole word
        ax.set_ylim(-0.5, _single(runs, length_column(runs["task"].iloc[0])) + 0.5)
    ax.grid(alpha=0.3)
    title = f"{panel['title']}: {metric} ({headline}) against {ax.get_xlabel()}"
    text = f"## {title}\n\n{_spread_note(table)}\n\n"
    text += to_markdown(pd.DataFrame(markdown_rows).fillna(""))
    if x == "layers" and len(threshold):
        text += (f"\n\n## {panel['title']}: minimum layers to solve (two thirds of the seeds "
                 f"at {metric} >= {threshold.iloc[0]:g} on {headline}; min_layers_any: any "
                 f"seed)\n\n")
        text += to_markdown(min_layers_table(table))
    return text


def _cell_text(mean: float, sd: float, solves=None) -> str:
    """"mean ± sd" of a cell, and where the task has a threshold the seeds that solved it with
    the 95% Wilson interval of that rate: "0.953 ± 0.01; 3/3 solved [0.44, 1.00]"."""
    if np.isnan(mean):
        return ""
    text = f"{mean:.3f}" if np.isnan(sd) else f"{mean:.3f} ± {sd:.2g}"
    if solves is None or np.isnan(solves["seeds"]):
        return text
    return f"{text}; {solve_rate_text(solves, ' solved')}"


def draw_depth_vs_length(ax, panel: dict) -> str:
    """The fewest layers that solve the task at each length, a line per model: solid where two
    thirds of the seeds solve it, dashed where any seed does. Models are drawn a little apart
    along the length axis, so that equal depths stay visible and every marker stays on its
    integer layer count. A model that solves a length at none of the depths it ran (">N") is an
    open triangle half a layer above its own deepest, N; one that solves with N while a
    shallower depth is unresolved ("≤N?") has an open triangle pointing down half a layer
    below N."""
    runs = panel["runs"]
    readings = min_depth_by_length(runs)
    minimum, any_seed = readings["min_layers"], readings["min_layers_any"]
    deepest = int(runs["layers"].max())
    lengths = [c for c in minimum.columns if c.startswith("length=")]
    xs = [int(c.split("=")[1]) for c in lengths]
    models = model_order(minimum["model"])
    several_heads = minimum["heads"].nunique() > 1
    rows, evidence = [], []
    logarithmic = _length_axis(ax, xs)
    for number, model in enumerate(models):
        shifted = _apart(xs, number, len(models), logarithmic)
        for heads, cells in minimum[minimum["model"] == model].groupby("heads"):
            found = cells.iloc[0][lengths].tolist()
            loose = any_seed.loc[cells.index[0], lengths].tolist()
            label = f"{model}, {heads} heads" if several_heads else model
            for values, style, name in ((found, "-", label), (loose, "--", f"_{label} any")):
                ax.plot(shifted, [reading_depth(v) if v and not v.startswith(">") else np.nan
                                  for v in values],
                        marker="o", lw=1.8 if style == "-" else 1.0, ms=4, ls=style,
                        color=colour(model, models), label=name)
            for sign, marker, offset in ((">", "^", 0.5), ("≤", "v", -0.5)):
                marked = [(x, reading_depth(v)) for x, v in zip(shifted, found)
                          if v.startswith(sign)]
                ax.scatter([x for x, _ in marked], [depth + offset for _, depth in marked],
                           marker=marker, s=24, facecolors="none",
                           edgecolors=colour(model, models))
            rows.append({"model": label, **{length: f"{r} ({a})" if str(r) else ""
                                            for length, r, a in zip(lengths, found, loose)}})
            evidence.append({"model": label,
                             **readings["evidence"].loc[cells.index[0], lengths].to_dict()})
    ax.plot([], [], ls="--", lw=1.0, color="black", label="dashed: any seed solves")
    ax.scatter([], [], marker="^", s=24, facecolors="none", edgecolors="black",
               label="open triangle at N + 1/2: not solved up to N layers")
    if any(str(v).startswith("≤") for v in minimum[lengths].to_numpy().ravel()):
        ax.scatter([], [], marker="v", s=24, facecolors="none", edgecolors="black",
                   label="open triangle at N - 1/2: solved with N, fewer unresolved")
    ax.set_xlabel("length")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_ylabel("minimum layers to solve")
    ax.set_yticks(range(1, deepest + 1))
    ax.set_ylim(0.5, deepest + 0.9)
    ax.grid(alpha=0.3)
    threshold = runs["solved_threshold"].dropna()
    line = f"{threshold.iloc[0]:g}" if len(threshold) else "its threshold"
    text = (f"## {panel['title']}: minimum layers to solve against length\n\n"
            f"Solved: two thirds of the seeds at or above {line} on test, at the learning rate "
            f"val picked (solid); in brackets, and dashed, where any seed is; >N: not solved up "
            f"to N layers (drawn open above the deepest); >N?: unresolved, some runs still "
            f"improving when their budget ended; ≤N?: solved with N, but a shallower depth "
            f"unresolved in that way (drawn open below N).\n\n")
    text += to_markdown(pd.DataFrame(rows))
    text += ("\n\nThe solve rates behind the first reading: seeds that solved out of those run, "
             "with the 95% Wilson interval, at the fewest layers that solve reliably and at "
             "one layer fewer (LAYERS: k/n [low, high]); where none does, at the deepest run."
             "\n\n" + to_markdown(pd.DataFrame(evidence)))
    return text


def draw_heatmap(ax, panel: dict) -> str:
    """One model over layers x heads: where the task has a solved threshold, each cell's solve
    rate (the seeds that reach it on the headline split, "k/n"), otherwise its mean metric. A
    cell that did not run stays blank."""
    table = aggregate(panel["runs"])
    headline, metric = table["headline"].iloc[0], table["metric"].iloc[0]
    threshold = table["solved_threshold"].dropna()
    if len(threshold):
        line = f"{metric} >= {threshold.iloc[0]:g} on {headline}"
        table["value"] = table["solved_seeds"] / table["seeds"]
        table["label"] = [f"{int(k)}/{int(n)}" for k, n in zip(table["solved_seeds"],
                                                              table["seeds"])]
        table["shown"] = [_cell_text(row[headline], row[f"{headline}_std"], row)
                          for _, row in table.iterrows()]
        title, scale = f"solve rate over layers x heads (seeds at {line})", f"solve rate ({line})"
        note = (" Each cell: mean ± sd of the seeds' metric; the seeds that solved, and the 95% "
                "Wilson interval of that rate.")
    else:
        table["value"] = table[headline]
        table["label"] = [f"{value:.2f}" for value in table[headline]]
        table["shown"] = [f"{value:.3f}" for value in table[headline]]
        title, scale = f"{metric} ({headline}) over layers x heads", f"{metric} ({headline})"
        note = ""
    grid = table.pivot(index="heads", columns="layers", values=["value", "label", "shown"])
    values = grid["value"].astype(float)
    image = ax.imshow(values.values, origin="lower", vmin=0, vmax=1, cmap="viridis",
                      aspect="auto")
    for (i, j), value in np.ndenumerate(values.values):
        if not np.isnan(value):
            ax.text(j, i, grid["label"].iat[i, j], ha="center", va="center", fontsize=7,
                    color="white" if value < 0.6 else "black")
    ax.set_xticks(range(len(values.columns)), [tidy(v) for v in values.columns])
    ax.set_yticks(range(len(values.index)), [tidy(v) for v in values.index])
    ax.set_xlabel("layers")
    ax.set_ylabel("heads")
    ax.figure.colorbar(image, ax=ax, label=scale)
    shown = grid["shown"].fillna("")
    shown.columns = [f"layers={tidy(v)}" for v in shown.columns]
    return (f"## {panel['title']}, {title}\n\n{_spread_note(table)}{note}\n\n"
            f"{to_markdown(shown.reset_index())}")


def draw_bars(ax, panel: dict) -> str:
    runs = panel["runs"]
    # a column another task's runs brought into the frame is all NaN here
    has_error = any(c.endswith(":error") and runs[c].notna().any() for c in runs.columns)
    metric = "error" if has_error else None
    table = aggregate(runs, metric)
    metric = table["metric"].iloc[0]
    unit = " (%)" if metric == "error" else ""
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
        offset = (i - (len(models) - 1) / 2) * width
        bars = ax.bar(positions + offset, means, width, yerr=[low, high], capsize=2,
                      color=colour(model, models), label=model, error_kw={"lw": 0.8})
        for j, split in enumerate(splits):  # every seed a point
            seeds = _picked_runs(runs, row)[f"{split}:{metric}"].dropna()
            ax.scatter([positions[j] + offset] * len(seeds), seeds, s=6, color="black",
                       alpha=0.5, lw=0, zorder=3)
        ax.bar_label(bars, labels=[_bar_text(m) for m in means], fontsize=6, padding=2,
                     rotation=90)
        markdown_rows.append({"model": model, **{
            f"{split}{unit}": _mean_sd(row.get(split, np.nan), row.get(f"{split}_std", np.nan))
            for split in splits}})
    ax.set_xticks(positions, splits)
    ax.set_ylabel(f"{metric}{unit}")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)  # room for the rotated value labels
    title = f"{panel['title']}: {metric} per split"
    text = f"## {title}\n\n{_spread_note(table)}\n\n"
    return text + to_markdown(pd.DataFrame(markdown_rows))


def draw_generalisation(ax, panel: dict) -> str:
    """Each model's metric at its training length (test, a square) and on every longer test
    split: a segment per model and training length."""
    runs = panel["runs"]
    has_error = any(c.endswith(":error") and runs[c].notna().any() for c in runs.columns)
    table = aggregate(runs, "error" if has_error else None)
    metric = table["metric"].iloc[0]
    unit = " (%)" if metric == "error" else ""
    column = length_column(runs["task"].iloc[0])
    table["length"] = [runs.loc[runs["cell"] == cell, column].iloc[0]
                       for cell in table["cell"]]
    models = model_order(table["model"])
    rows, segments = [], []
    for model in models:
        for (heads, length), cells in table[table["model"] == model].groupby(["heads", "length"]):
            solved = cells[cells["solved"]]
            row = (solved.loc[solved["layers"].idxmin()] if len(solved)
                   else cells.loc[cells["layers"].idxmax()])
            points = [(int(length), "test")] + [
                (int(split[5:]), split) for split in _longer_splits(_picked_runs(runs, row))]
            segments.append((model, [n for n, _ in points],
                             [row.get(split, np.nan) for _, split in points]))
            rows.append({"model": model, "heads": tidy(heads), "trained at": tidy(length),
                         "layers": tidy(row["layers"]), **{
                             f"length={n}": _mean_sd(row.get(split, np.nan),
                                                     row.get(f"{split}_std", np.nan))
                             for n, split in points}})
    xs = sorted({x for _, segment, _ in segments for x in segment})
    logarithmic = _length_axis(ax, xs)
    for model, x, y in segments:
        x = _apart(x, models.index(model), len(models), logarithmic, xs)
        ax.plot(x, y, marker="o", lw=1.5, ms=4, color=colour(model, models), label=model)
        # each segment starts at its training length: a square there says which it is
        ax.plot(x[:1], y[:1], marker="s", ms=6, ls="none", color=colour(model, models))
    ax.plot([], [], marker="s", ms=6, ls="none", color="black",
            label="square: the length a segment's runs trained at")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("evaluation length")
    ax.set_ylabel(f"{metric}{unit}")
    ax.set_ylim(-0.02, 1.02) if metric in ("accuracy", "last_accuracy") else None
    ax.grid(alpha=0.3)
    frame = pd.DataFrame(rows)
    frame = frame[[*frame.columns[:4], *sorted(frame.columns[4:], key=lambda c: int(c[7:]))]]
    layers = ("the fewest layers that solved the training length on test, else the deepest run"
              if table["solved_threshold"].notna().any() else "the layers trained")
    return (f"## {panel['title']}: {metric}{unit} against evaluation length\n\n"
            f"{_spread_note(table)} Each model at {layers}.\n\n"
            + to_markdown(frame.fillna("")))


def _length_axis(ax, xs: list[int]) -> bool:
    """A log2 axis for lengths that span a factor of four or more; whether it is one."""
    logarithmic = max(xs) / min(xs) >= 4
    if logarithmic:
        ax.set_xscale("log", base=2)
    return logarithmic


def _apart(x: list[int], number: int, models: int, logarithmic: bool,
           xs: list[int] | None = None) -> list[float]:
    """Lengths ``x`` moved a little along the axis for the ``number``-th of ``models`` models,
    so that equal values do not hide each other: a twentieth of a doubling on a log axis, of
    the smallest gap between the lengths ``xs`` (default ``x``) on a linear one."""
    shift = (number - (models - 1) / 2) / 20
    gap = min(np.diff(sorted(xs or x)), default=1)
    return [n * 2**shift if logarithmic else n + shift * gap for n in x]


def _mean_sd(mean: float, sd: float) -> str:
    if np.isnan(mean):
        return ""
    return f"{mean:.3g}" if np.isnan(sd) else f"{mean:.3g} ± {sd:.2g}"


def _bar_text(value: float) -> str:
    if np.isnan(value):
        return ""
    return "0" if value == 0 else "<0.01" if abs(value) < 0.01 else f"{value:.2g}"


# Panel kinds by name: what draws each (into an axes) and returns its markdown table.
PANELS = {"lines": draw_lines, "bars": draw_bars, "depth_vs_length": draw_depth_vs_length,
          "heatmap": draw_heatmap, "generalisation": draw_generalisation}


def render(frame: pd.DataFrame) -> tuple[Figure, str]:
    """Every panel drawn into one figure (each axes titled with its panel's title), and the
    panels' markdown tables."""
    panels = plan_panels(frame)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(4.6 * columns, 3.6 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    texts = []
    for ax, panel in zip(axes, panels):
        texts.append(PANELS[panel["kind"]](ax, panel))
        ax.set_title(panel["title"], fontsize=10)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    # One legend for the whole figure: a model has the same colour in every panel.
    legend = {}
    for ax in axes[: len(panels)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    groups = grouped_by_family(legend)
    # as few rows as the figure's width holds, measured: long labels take more
    renderer = FigureCanvasAgg(figure).get_renderer()
    for rows in range(1, len(legend) + 1):
        entries = in_columns(groups, rows)
        box = figure.legend([handle for _, handle in entries], [label for label, _ in entries],
                            loc="outside lower center", ncols=len(entries) // rows,
                            frameon=False, fontsize=8)
        if rows == len(legend) or \
                box.get_window_extent(renderer).width <= 0.98 * figure.bbox.width:
            break
        box.remove()
    return figure, "\n\n".join(texts)


def grouped_by_family(legend: dict) -> list[list[tuple]]:
    """Legend entries (label -> handle) as groups of (label, handle): where models of more than
    one family are drawn, one group per family, headed by its name; then the rest (baselines,
    line styles) as they came."""
    families: dict[str, list] = {}
    rest = []
    for label, handle in legend.items():
        family = model_family(label.split(",")[0])
        (families.setdefault(family, []) if family else rest).append((label, handle))
    if len(families) < 2:
        return [list(legend.items())]
    heading = Line2D([], [], ls="none")  # no line, no marker
    groups = [[(f"{family}:", heading), *entries] for family, entries in families.items()]
    return [*groups, rest] if rest else groups


def in_columns(groups: list[list[tuple]], rows: int) -> list[tuple]:
    """The groups' entries in the order a legend of ``rows`` rows fills its columns (top to
    bottom, then left to right), each group padded with blank entries to whole columns, so
    that every group, and its heading, starts at the top of a column."""
    blank = ("", Line2D([], [], ls="none"))
    return [entry for group in groups
            for entry in [*group, *[blank] * (-len(group) % rows)]]


def draw(frame: pd.DataFrame, output: Path) -> tuple[list[Path], str]:
    """Draw every panel into one figure; write OUTPUT.png, OUTPUT.pdf and OUTPUT.md, each
    through a temporary file renamed into place."""
    figure, tables = render(frame)
    stem = output.with_suffix("") if output.suffix in (".png", ".pdf", ".md") else output
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("png", "pdf"):
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_atomic(path, lambda file: figure.savefig(file, format=fmt, dpi=200))
        written.append(path)
    markdown = stem.with_name(stem.name + ".md")
    write_text_atomic(markdown, tables + "\n")
    written.append(markdown)
    return written, tables
