"""The attention maps of every head of a trained model, on one example of an evaluation split.

The model of a run is rebuilt from its record and its weights loaded; the figure has a row per
layer and a column per head, query position down, key position across. Attention is causal, so
the first ``tokens`` positions of the example are exactly the top-left corner of the full maps.
On flip-flop, a model that solved the task shows each read (``r``) attending to the most recent
write (``w``); scored positions are marked on the query axis.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from pathbench import UserError
from pathbench.runners.training import store


def attention_figure(run_dir: Path, split: str | None, example: int, tokens: int) -> Figure:
    """The maps of the model in ``run_dir`` on example ``example`` of ``split`` (default: the
    first test split), its first ``tokens`` positions. Bad choices are a UserError naming the
    valid ones."""
    import torch

    from pathbench.models import build_model, model_config
    from pathbench.runners.training.loop import EVAL_CHUNK, EvaluationSplit
    from pathbench.tasks import IGNORE_INDEX, make_task

    record = store.read_result(run_dir)
    weights_path = run_dir / store.WEIGHTS_FILE
    if record["status"] != "ok" or not weights_path.exists():
        raise UserError(f"{run_dir} has no trained weights (status {record['status']!r})")
    if tokens < 2:
        raise UserError(f"--tokens must be >= 2, got {tokens}")
    config = record["config"]
    task = make_task(config["task"]["name"], config["task"]["config"])
    split = split or task.test_splits[0]
    evaluated = task.splits[1:]  # the splits with fixed evaluation sequences
    if split not in evaluated:
        raise UserError(f"unknown split {split!r}; valid splits: {', '.join(evaluated)}")
    train = config["train"]
    size = train.get("eval_sizes", {}).get(split, train["eval_num"])
    if not 0 <= example < size:
        raise UserError(f"--example must be in 0..{size - 1}: the run was evaluated on {size} "
                        f"sequences of {split}, got {example}")
    model = build_model(model_config(config["model"]))
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["state_dict"])
    except Exception as exc:  # a damaged or foreign file
        raise UserError(f"cannot load weights {weights_path}: {type(exc).__name__}") from None
    model.eval()

    dataset = EvaluationSplit(task, split, size).chunk(example // EVAL_CHUNK)
    example_in_chunk = example % EVAL_CHUNK
    inputs = torch.from_numpy(dataset.inputs[example_in_chunk : example_in_chunk + 1])
    with torch.no_grad():
        maps = [layer_map[0, :, :tokens, :tokens].float().numpy()
                for layer_map in model.attention_maps(inputs)]
    shown = min(tokens, inputs.shape[1])
    words = [task.vocab[i] for i in dataset.inputs[example_in_chunk, :shown]]
    scored = np.flatnonzero(dataset.targets[example_in_chunk, :shown] != IGNORE_INDEX)

    layers, heads = len(maps), maps[0].shape[0]
    side = max(3.4, 0.1 * shown)  # inches a map: a tenth of an inch a position, for its label
    figure = Figure(figsize=(side * heads + 1.2, side * layers + 0.6), layout="constrained")
    axes = figure.subplots(layers, heads, squeeze=False)
    for layer, layer_maps in enumerate(maps):
        for head, attention in enumerate(layer_maps):
            ax = axes[layer, head]
            image = ax.imshow(attention, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            if shown <= 64:  # token labels stay legible up to about 64 positions
                ax.set_xticks(range(shown), words, fontsize=5, rotation=90)
                ax.set_yticks(range(shown), words, fontsize=5)
            ax.scatter(np.full(len(scored), -1.2), scored, marker=">", s=6, color="red",
                       clip_on=False)
            ax.set_xlim(-0.5, shown - 0.5)  # the markers sit outside the map
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query position (red: scored)", fontsize=8)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    model_cfg = config["model"]
    figure.suptitle(f"{config['task']['name']}, {model_cfg['attention']}: {split} example "
                    f"{example}, first {shown} positions", fontsize=10)
    return figure
