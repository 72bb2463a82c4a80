"""Smoke test: a 1-layer, 2-head PaTH model learns flip-flop on the CPU, trained by the library's
training loop (`pathbench.runners.training.loop.train`).

It asserts only that the loss on the scored (read) positions falls well below chance
(ln 2 for a random bit), nothing about how variants compare.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pathbench.models import build_model, model_config
from pathbench.runners.training.config import train_config
from pathbench.runners.training.loop import Member, train
from pathbench.tasks import IGNORE_INDEX, make_task


pytestmark = pytest.mark.usefixtures("one_thread")


def read_loss(model, dataset):
    inputs, targets = torch.from_numpy(dataset.inputs), torch.from_numpy(dataset.targets)
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def test_path_model_learns_flipflop():
    task = make_task("flipflop", {"length": 64})
    torch.manual_seed(0)
    model = build_model(model_config(
        {"attention": "path", "layers": 1, "heads": 2, "d_model": 64, "vocab_size": len(task.vocab)}
    ))
    settings = train_config({"steps": 200, "batch_size": 32, "lr": 3e-3, "warmup": 0,
                             "schedule": "constant", "weight_decay": 0.0, "eval_every": 200,
                             "eval_num": 64, "early_stop": None})
    curve = []
    [outcome] = train(model, task, settings, [Member(0, 3e-3, curve)], torch.device("cpu"),
                      progress=False)
    assert outcome.status == "ok" and outcome.steps == 200 and len(curve) == 1
    with torch.no_grad():
        final = read_loss(model, task.generate(512, seed=0, split="test")).item()
    assert final < 0.25 * math.log(2), f"read-position loss {final:.3f} after 200 steps"
