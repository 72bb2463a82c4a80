"""The training and evaluation loop of one run.

Training draws fresh batches from ``task.generate``, so a model never sees the same sequence
twice; the seeds of the draws form a stream derived from the run seed. Evaluation data is fixed
and shared by every run of a task config: a validation set (drawn from the train distribution
with a reserved seed) decides early stopping, and each evaluation split (``task.splits[1:]``) is
generated with the same fixed seed, so all runs are scored on identical sequences; the dataset
hash in every record proves it.

Optimisation: AdamW, linear warm-up then cosine decay to zero, global gradient-norm clipping,
bf16 autocast on CUDA (float32 on CPU). A NaN or infinite loss ends the run as "diverged".

On CUDA the optimizer step is captured once as a CUDA graph and replayed (``TrainStep``): the
benchmark's models are small, and an eager step of them spends most of its time launching
kernels from Python rather than running them.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pathbench.runners.config import TrainConfig

IGNORE = -100  # target value of positions that are not scored
VALIDATION_SEED = 2**32 - 1  # reserved for the validation set; see draw_seed
EVALUATION_SEED = 0  # every evaluation split is generated with this seed


# Training sequences are drawn about this many at a time (one generate call feeds several
# steps): some generators have a fixed cost per call that would otherwise dominate a GPU step.
SEQUENCES_PER_DRAW = 1024
LOSS_READ_EVERY = 20  # steps between reads of the loss from the device (divergence checks)


def draw_seed(run_seed: int, draw: int) -> int:
    """The seed of the ``draw``-th training draw: a 32-bit value from a stream keyed by the run
    seed. It equals VALIDATION_SEED with probability 2**-32 per draw, which we accept."""
    return int(np.random.SeedSequence([run_seed, draw]).generate_state(1)[0])


def training_batches(task, batch_size: int, run_seed: int, device: torch.device):
    """Fresh training batches forever: (inputs, targets) tensors of ``batch_size`` rows on
    ``device``. Each draw is copied to the device whole, one transfer for several steps, and
    the next draw is generated in a background thread while the model trains on this one."""
    steps_per_draw = max(1, SEQUENCES_PER_DRAW // batch_size)

    def generate(draw: int):
        return task.generate(steps_per_draw * batch_size, draw_seed(run_seed, draw),
                             task.splits[0])

    with ThreadPoolExecutor(max_workers=1) as background:
        upcoming = background.submit(generate, 0)
        for draw in itertools.count():
            data = upcoming.result()
            upcoming = background.submit(generate, draw + 1)
            inputs = torch.from_numpy(data.inputs).to(device)
            targets = torch.from_numpy(data.targets).to(device)
            for start in range(0, steps_per_draw * batch_size, batch_size):
                yield inputs[start : start + batch_size], targets[start : start + batch_size]


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


def make_optimizer(model: torch.nn.Module, train: TrainConfig,
                   device: torch.device) -> torch.optim.AdamW:
    # Weight decay on matrices only: decaying gains and biases toward zero only hurts.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    # A graph-captured step reads the learning rate from device memory, so on CUDA it is a
    # tensor that TrainStep.set_lr overwrites in place.
    capturable = device.type == "cuda"
    lr = torch.tensor(train.lr, device=device) if capturable else train.lr
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": train.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.98),
        capturable=capturable,
    )


def _autocast(device: torch.device):
    # The autocast weight cache must be off while a CUDA graph is captured.
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda",
                          cache_enabled=False)


class TrainStep:
    """One training step on a batch: forward, loss, backward, clipping and the AdamW update.

    Calling it returns the step's loss (a device tensor) and adds the step's correct and
    scored target counts to ``correct`` and ``scored``. On CUDA the first EAGER_CUDA_STEPS
    steps run eagerly on a side stream (lazy initialisation, the Triton kernel's choice of
    launch configuration), the next one is captured as a CUDA graph, and every later step
    replays that graph on fresh data copied into the captured input buffers: the same
    computation, without the per-kernel launch cost of Python.
    """

    EAGER_CUDA_STEPS = 3

    def __init__(self, model, optimizer, grad_clip: float, device: torch.device):
        self.model, self.optimizer, self.grad_clip = model, optimizer, grad_clip
        self.device = device
        self.correct = torch.zeros((), dtype=torch.long, device=device)
        self.scored = torch.zeros((), dtype=torch.long, device=device)
        self.steps_taken = 0
        self.graph = None

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def __call__(self, inputs, targets) -> torch.Tensor:
        self.steps_taken += 1
        if self.device.type != "cuda":
            return self._step(inputs, targets)
        if self.graph is not None:
            self.graph_inputs.copy_(inputs)
            self.graph_targets.copy_(targets)
            self.graph.replay()
            return self.graph_loss.clone()  # the next replay overwrites graph_loss
        if self.steps_taken <= self.EAGER_CUDA_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                loss = self._step(inputs, targets)
            torch.cuda.current_stream(self.device).wait_stream(side)
            return loss
        # Capturing records the step without running it; the replay below runs it.
        # Gradients are set to None (not zeroed) first, so that the captured backward allocates
        # them in the graph's memory and every replay writes them afresh.
        self.graph_inputs, self.graph_targets = inputs.clone(), targets.clone()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.graph_loss = self._step(self.graph_inputs, self.graph_targets)
        self.graph.replay()
        return self.graph_loss.clone()

    def _step(self, inputs, targets) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with _autocast(self.device):
            logits = self.model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                               ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        mask = targets != IGNORE
        self.correct += ((logits.argmax(dim=-1) == targets) & mask).sum()
        self.scored += mask.sum()
        return loss.detach()


@torch.no_grad()
def evaluate(model, task, dataset, split: str, batch_size: int, device: torch.device) -> dict:
    """Task metrics of the model's argmax predictions on one fixed dataset."""
    model.eval()
    inputs = torch.from_numpy(dataset.inputs).to(device)
    predictions = []
    for start in range(0, len(inputs), batch_size):
        with _autocast(device):
            predictions.append(model(inputs[start : start + batch_size]).argmax(dim=-1))
    model.train()
    predictions = torch.cat(predictions).cpu().numpy()
    return to_jsonable(task.metrics(predictions, dataset.targets, split))


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
    step_fn = TrainStep(model, make_optimizer(model, config, device), config.grad_clip, device)
    correct, scored = step_fn.correct, step_fn.scored
    # Statistics stay on the device and are read back every LOSS_READ_EVERY steps: reading a
    # value each step would stall the GPU queue at every step.
    unread_losses: list[torch.Tensor] = []
    loss_sum, interval_steps, last_loss = 0.0, 0, math.nan
    validation: dict = {}
    stopped_early = False
    bar = tqdm(total=config.steps, desc=label, disable=not progress, dynamic_ncols=True,
               mininterval=0.5)
    start = time.perf_counter()
    batches = training_batches(task, config.batch_size, seed, device)
    step = 0
    for step in range(1, config.steps + 1):
        lr = config.lr * lr_factor(step - 1, config.steps, config.warmup)
        step_fn.set_lr(lr)
        unread_losses.append(step_fn(*next(batches)))

        evaluate_now = step % config.eval_every == 0 or step == config.steps
        if len(unread_losses) < LOSS_READ_EVERY and not evaluate_now:
            continue
        losses = torch.stack(unread_losses).tolist()
        unread_losses.clear()
        for offset, value in enumerate(losses):
            if not math.isfinite(value):
                bar.close()
                batches.close()
                bad_step = step - len(losses) + 1 + offset
                return Outcome("diverged", bad_step, False, validation=validation,
                               reason=f"loss became {value} at step {bad_step}",
                               dataset_hash=data_hash)
        loss_sum += sum(losses)
        interval_steps += len(losses)
        last_loss = losses[-1]
        bar.update(len(losses))
        bar.set_postfix(loss=f"{last_loss:.4f}",
                        acc=f"{correct.item() / max(1, scored.item()):.3f}",
                        **({"val": f"{validation[primary]:.3f}"} if validation else {}))
        if not evaluate_now:
            continue

        validation = evaluate(model, task, validation_set, task.splits[0],
                              config.batch_size, device)
        curve.append({
            "step": step,
            "lr": lr,
            "loss": loss_sum / interval_steps,
            "accuracy": correct.item() / max(1, scored.item()),
            "validation": validation,
            "elapsed_s": round(time.perf_counter() - start, 3),
        })
        loss_sum, interval_steps = 0.0, 0
        correct.zero_()
        scored.zero_()
        bar.set_postfix(loss=f"{last_loss:.4f}", val=f"{validation[primary]:.3f}")
        if config.early_stop is not None and validation[primary] >= config.early_stop:
            stopped_early = step < config.steps
            break
    bar.close()
    batches.close()  # stops the background draw

    metrics = {
        split: evaluate(model, task, dataset, split, config.batch_size, device)
        for split, dataset in evaluation_sets.items()
    }
    return Outcome("ok", step, stopped_early, metrics=metrics, validation=validation,
                   dataset_hash=data_hash)
