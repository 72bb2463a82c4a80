"""The training and evaluation loop of one run.

Training draws a fresh batch from ``task.generate`` every step, so a model never sees the same
sequence twice; the batch seeds form a stream derived from the run seed. Evaluation data is fixed
and shared by every run of a task config: a validation set (drawn from the train distribution
with a reserved seed) decides early stopping, and each evaluation split (``task.splits[1:]``) is
generated with the same fixed seed, so all runs are scored on identical sequences; the dataset
hash in every record proves it.

Optimisation: AdamW, linear warm-up then cosine decay to zero, global gradient-norm clipping,
bf16 autocast on CUDA (float32 on CPU). A NaN or infinite loss ends the run as "diverged".
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pathbench.runners.config import TrainConfig

IGNORE = -100  # target value of positions that are not scored
VALIDATION_SEED = 2**32 - 1  # reserved for the validation set; see batch_seed
EVALUATION_SEED = 0  # every evaluation split is generated with this seed


def batch_seed(run_seed: int, step: int) -> int:
    """The seed of training batch ``step``: a 32-bit value from a stream keyed by the run seed.
    It equals VALIDATION_SEED with probability 2**-32 per step, which we accept."""
    return int(np.random.SeedSequence([run_seed, step]).generate_state(1)[0])


@dataclass
class Outcome:
    status: str  # "ok" or "diverged"
    steps: int  # optimizer steps taken (for "diverged": the step whose loss was not finite)
    stopped_early: bool
    metrics: dict = field(default_factory=dict)  # split -> metrics (empty when diverged)
    validation: dict = field(default_factory=dict)  # the last validation metrics
    reason: str | None = None
    dataset_hash: str = ""


def dataset_hash(datasets: dict) -> str:
    """sha256 over the evaluation data (inputs and targets of every split, in order)."""
    digest = hashlib.sha256()
    for name, dataset in datasets.items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(dataset.inputs, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(dataset.targets, dtype=np.int64).tobytes())
    return digest.hexdigest()


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based). The warm-up
    is capped at a tenth of the run, so that a shortened run keeps the same shape."""
    warmup_steps = min(warmup, total // 10)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.AdamW:
    # Weight decay on matrices only: decaying gains and biases toward zero only hurts.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": train.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=train.lr,
        betas=(0.9, 0.98),
    )


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def evaluate(model, task, dataset, split: str, batch_size: int, device: torch.device) -> dict:
    """Task metrics of the model's argmax predictions on one fixed dataset."""
    model.eval()
    predictions = []
    for start in range(0, len(dataset.inputs), batch_size):
        inputs = torch.from_numpy(dataset.inputs[start : start + batch_size]).to(device)
        with _autocast(device):
            logits = model(inputs)
        predictions.append(logits.argmax(dim=-1).cpu().numpy())
    model.train()
    return to_jsonable(task.metrics(np.concatenate(predictions), dataset.targets, split))


def to_jsonable(value):
    """numpy scalars and arrays inside metric dicts -> plain Python numbers and lists."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def train(model, task, train_config: TrainConfig, seed: int, device: torch.device,
          curve, progress: bool = True, label: str = "train") -> Outcome:
    """Train ``model`` on ``task``, evaluate it on every evaluation split, return the outcome.

    ``curve`` receives one point per validation check: the step, the learning rate, the mean
    training loss and accuracy since the previous point, and the validation metrics.
    """
    config = train_config
    primary = task.primary_metric
    validation_set = task.generate(config.eval_num, VALIDATION_SEED, task.splits[0])
    evaluation_sets = {
        split: task.generate(config.eval_num, EVALUATION_SEED, split) for split in task.splits[1:]
    }
    data_hash = dataset_hash({"validation": validation_set, **evaluation_sets})

    model.to(device).train()
    optimizer = make_optimizer(model, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.steps, config.warmup)
    )
    loss_sum, correct, scored, interval_steps = 0.0, torch.zeros((), dtype=torch.long, device=device), 0, 0
    validation: dict = {}
    stopped_early = False
    bar = tqdm(total=config.steps, desc=label, disable=not progress, dynamic_ncols=True,
               leave=True, mininterval=0.5)
    start = time.perf_counter()
    step = 0
    for step in range(1, config.steps + 1):
        batch = task.generate(config.batch_size, batch_seed(seed, step), task.splits[0])
        inputs = torch.from_numpy(batch.inputs).to(device, non_blocking=True)
        targets = torch.from_numpy(batch.targets).to(device, non_blocking=True)
        with _autocast(device):
            logits = model(inputs)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE
        )
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            bar.close()
            return Outcome("diverged", step, False, validation=validation,
                           reason=f"loss became {loss_value} at step {step}",
                           dataset_hash=data_hash)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()

        mask = targets != IGNORE
        correct += (logits.argmax(dim=-1) == targets)[mask].sum()
        scored += int(mask.sum())
        loss_sum += loss_value
        interval_steps += 1
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss_value:.4f}", acc=f"{correct.item() / max(1, scored):.3f}",
                            **({"val": f"{validation[primary]:.3f}"} if validation else {}))

        if step % config.eval_every == 0 or step == config.steps:
            validation = evaluate(model, task, validation_set, task.splits[0],
                                  config.batch_size, device)
            curve.append({
                "step": step,
                "lr": schedule.get_last_lr()[0],
                "loss": loss_sum / interval_steps,
                "accuracy": correct.item() / max(1, scored),
                "validation": validation,
                "elapsed_s": round(time.perf_counter() - start, 3),
            })
            loss_sum, interval_steps, scored = 0.0, 0, 0
            correct.zero_()
            bar.set_postfix(loss=f"{loss_value:.4f}", val=f"{validation[primary]:.3f}")
            if config.early_stop is not None and validation[primary] >= config.early_stop:
                stopped_early = step < config.steps
                break
    bar.close()

    metrics = {
        split: evaluate(model, task, dataset, split, config.batch_size, device)
        for split, dataset in evaluation_sets.items()
    }
    return Outcome("ok", step, stopped_early, metrics=metrics, validation=validation,
                   dataset_hash=data_hash)
