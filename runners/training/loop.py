"""The training and evaluation loop of one run, or of a pack of runs trained as one model.

Training draws fresh batches from ``task.generate``, so a model never sees the same sequence
twice; the seeds of the draws form a stream derived from the run seed. Evaluation data is fixed
and shared by every run of a task config: the ``val`` split decides early stopping, and the test
splits (``task.test_splits``) only report; each is generated from fixed seeds, so all runs are
scored on identical sequences, and the dataset hash in every record proves it. Evaluation goes
a chunk of sequences at a time and adds up the task's tallies (``Task.tally``), so memory stays
flat at any evaluation size; the task's baselines are scored on the same sequences.

Optimisation: AdamW, linear warm-up then cosine decay to zero, global gradient-norm clipping,
bf16 autocast on CUDA (float32 on CPU). A NaN or infinite loss ends the run as "diverged".

A pack (``pathbench.models.pack``) trains several runs that differ only in seed and learning
rate as one model, its members stacked along the batch: each kernel then does the work of
every member, which is how a sweep of small models keeps a GPU busy. Every member keeps its own
data stream, learning rate, clipping, early stop and record.

On CUDA the forward and loss are compiled (torch.compile) and the whole step (the batch, forward,
backward, the schedule, clipping and AdamW) is captured once as a CUDA graph and replayed
(``TrainStep``): the benchmark's models are small, and an eager step of them spends most of
its time launching kernels, many of them small elementwise ones that compilation fuses. The
host only refills the training data every few hundred steps, reads the losses every
LOSS_READ_EVERY steps and evaluates.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pathbench.models.pack import is_packed, member_state_dict
from pathbench.runners.training.config import DECISION_SPLIT, TrainConfig
from pathbench.runners.training.optimizer import PackedAdamW
from pathbench.tasks import IGNORE_INDEX

EVALUATION_SEED = 0  # chunk c of every evaluation split is generated with seed EVALUATION_SEED + c
EVAL_CHUNK = 8192  # evaluation sequences generated and scored at a time


# Training sequences are drawn many steps' worth at a time: a draw has a fixed cost per call
# (launches, and for some generators a read of the device) that would otherwise dominate a
# step. numpy draws hold SEQUENCES_PER_DRAW sequences; device draws about TOKENS_PER_DEVICE_DRAW
# tokens. Both depend on the run's shape only, never on the pack it trains in.
SEQUENCES_PER_DRAW = 1024
TOKENS_PER_DEVICE_DRAW = 2**20
LOSS_READ_EVERY = 20  # steps between reads of the loss from the device (divergence checks)


def draw_seed(run_seed: int, draw: int) -> int:
    """The seed of the ``draw``-th training draw: a 32-bit value from a stream keyed by the run
    seed (on the train split's own random stream, apart from every evaluation split's)."""
    return int(np.random.SeedSequence([run_seed, draw]).generate_state(1)[0])


def on_device_data(task, device: torch.device) -> bool:
    """Whether training batches are drawn on ``device`` (a GPU, for a task with a device
    sampler); otherwise on the CPU with numpy, and copied over. CPU runs keep numpy's data."""
    return device.type == "cuda" and task.samples_on_device


class TrainingData:
    """Fresh training batches of a pack's members, ``steps_per_draw`` steps at a time.

    ``inputs`` and ``targets`` [S, E * B, T] hold the next S steps: step s reads row s, member
    e's batch in rows e * B to (e + 1) * B of it (the pack's layout). `refill` overwrites them
    with the members' next draws, in place, so that a captured CUDA graph keeps reading them.
    Member e's draw d is ``S * B`` sequences drawn with seed ``draw_seed(seed_e, d)``, step s of
    it its sequences s * B onwards: a run's batches depend on its seed alone.

    On a GPU a task with a device sampler draws there (`Task.generate_tensors`); otherwise each
    draw is generated with numpy in a background thread while the model trains on the one
    before, and copied over whole.
    """

    def __init__(self, task, batch_size: int, seeds: list[int], length: int,
                 device: torch.device):
        self.task, self.batch_size, self.seeds, self.device = task, batch_size, seeds, device
        self.on_device = on_device_data(task, device)
        self.steps_per_draw = max(1, (TOKENS_PER_DEVICE_DRAW // (batch_size * length)
                                      if self.on_device else SEQUENCES_PER_DRAW // batch_size))
        shape = (self.steps_per_draw, len(seeds) * batch_size, length)
        self.inputs = torch.zeros(shape, dtype=torch.long, device=device)
        self.targets = torch.zeros(shape, dtype=torch.long, device=device)
        self.draws = 0
        self.background = None if self.on_device else ThreadPoolExecutor(max_workers=1)
        self.upcoming = None if self.on_device else self.background.submit(self._generate, 0)

    def _generate(self, draw: int) -> list:
        """Each member's draw ``draw`` with numpy: (inputs, targets) arrays [S * B, T]."""
        size = self.steps_per_draw * self.batch_size
        drawn = [self.task.generate(size, draw_seed(seed, draw), self.task.splits[0])
                 for seed in self.seeds]
        return [(data.inputs, data.targets) for data in drawn]

    def refill(self) -> None:
        """The members' next draw into ``inputs`` and ``targets``."""
        S, B = self.steps_per_draw, self.batch_size
        if self.on_device:
            draws = [self.task.generate_tensors(S * B, draw_seed(seed, self.draws),
                                                self.task.splits[0], self.device)
                     for seed in self.seeds]
        else:
            draws = [tuple(map(torch.from_numpy, pair)) for pair in self.upcoming.result()]
            self.upcoming = self.background.submit(self._generate, self.draws + 1)
        for buffer, index in ((self.inputs, 0), (self.targets, 1)):
            stacked = torch.stack([draw[index].view(S, B, -1) for draw in draws], dim=1)
            buffer.copy_(stacked.view(buffer.shape))
        self.draws += 1

    def close(self) -> None:
        """Stops the background draw."""
        if self.background is not None:
            self.upcoming.cancel()
            self.background.shutdown(wait=True)


@dataclass
class Outcome:
    status: str  # "ok" or "diverged"
    steps: int  # optimizer steps taken (for "diverged": the step whose loss was not finite)
    stopped_early: bool
    # why it ended: "threshold" (early stop), "patience", "step cap" or "diverged"; and, at
    # the step cap, whether val was still improving (within the last `patience` checks, or at
    # the last one): a run the budget cut short
    stop_reason: str = "step cap"
    budget_limited: bool = False
    metrics: dict = field(default_factory=dict)  # split -> metrics (empty when diverged)
    validation: dict = field(default_factory=dict)  # the last val metrics (the final model's)
    baselines: dict = field(default_factory=dict)  # split -> baseline name -> accuracy
    reason: str | None = None
    dataset_hash: str = ""
    weights: dict | None = None  # the final state dict ("ok" only)


class EvaluationSplit:
    """The fixed evaluation sequences of one split, read in chunks of at most EVAL_CHUNK: chunk c
    is ``task.generate(size_c, EVALUATION_SEED + c, split)``. A split of one chunk is kept (val
    is read at every check); a larger one is generated again at each read, so that memory stays
    flat at any size."""

    def __init__(self, task, split: str, size: int):
        self.task, self.split = task, split
        self.sizes = [min(EVAL_CHUNK, size - start) for start in range(0, size, EVAL_CHUNK)]
        self.kept = [self.chunk(0)] if len(self.sizes) == 1 else None

    def chunk(self, number: int):
        """The ``number``-th chunk: sequences number * EVAL_CHUNK onwards."""
        return self.task.generate(self.sizes[number], EVALUATION_SEED + number, self.split)

    def chunks(self):
        return iter(self.kept) if self.kept else map(self.chunk, range(len(self.sizes)))


def evaluation_splits(task, config: TrainConfig) -> list[EvaluationSplit]:
    """val, then every test split of ``task``, at the sizes ``config`` gives them."""
    return [EvaluationSplit(task, split, config.eval_sizes.get(split, config.eval_num))
            for split in (DECISION_SPLIT, *task.test_splits)]


def evaluation_batch_tokens(config: TrainConfig, validation: EvaluationSplit) -> int:
    """Tokens an evaluation forward reads: as many as a training batch (val is at the training
    length)."""
    return config.batch_size * validation.chunk(0).inputs.shape[1]


def _add(tally: dict | None, more: dict) -> dict:
    return dict(more) if tally is None else {key: tally[key] + more[key] for key in tally}


def hash_and_baselines(task, splits: list[EvaluationSplit]) -> tuple[str, dict]:
    """sha256 over the evaluation data (inputs and targets of every split, in order), and the
    accuracy of each of the task's baselines on every split, in one pass over the data."""
    digest, baselines = hashlib.sha256(), {}
    for data in splits:
        digest.update(data.split.encode())
        exact, tallies = {}, {}
        for chunk in data.chunks():
            digest.update(np.ascontiguousarray(chunk.inputs, dtype=np.int64).tobytes())
            digest.update(np.ascontiguousarray(chunk.targets, dtype=np.int64).tobytes())
            for name, rule in task.baselines(chunk, data.split).items():
                if np.isscalar(rule):
                    exact[name] = float(rule)
                else:
                    tallies[name] = _add(tallies.get(name),
                                         task.tally(rule, chunk.targets, data.split))
        scored = {name: task.metrics_from(tally, data.split)["accuracy"]
                  for name, tally in tallies.items()}
        if exact or scored:
            baselines[data.split] = {**exact, **scored}
    return digest.hexdigest(), baselines


def lr_factors(step: torch.Tensor, total: int, warmup: int, schedule: str = "cosine",
               decay: float = 0.2) -> torch.Tensor:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based, a float64
    tensor, so that a captured CUDA graph computes the schedule on the device): a linear
    warm-up, then cosine decay to zero ("cosine"), the peak until the end ("constant"), or the
    peak until the last ``decay`` of the steps and a linear decay to zero over them ("wsd").
    The warm-up is capped at a tenth of the run, so that a shortened run keeps the same
    shape."""
    warmup_steps = min(warmup, total // 10)
    warming = (step + 1) / max(1, warmup_steps)
    if schedule == "constant":
        after = torch.ones_like(step)
    elif schedule == "wsd":
        after = ((total - step) / max(1, round(decay * total))).clamp(max=1.0)
    else:
        progress = (step - warmup_steps) / max(1, total - warmup_steps)
        after = 0.5 * (1.0 + torch.cos(math.pi * progress))
    return torch.where(step < warmup_steps, warming, after)


def lr_factor(step: int, total: int, warmup: int, schedule: str = "cosine",
              decay: float = 0.2) -> float:
    """`lr_factors` at one step, as a number."""
    return float(lr_factors(torch.tensor(float(step), dtype=torch.float64), total, warmup,
                            schedule, decay))


def activation_dtype(device: torch.device) -> torch.dtype:
    """The dtype of activations in training: bfloat16 autocast on CUDA, float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _autocast(device: torch.device):
    # The autocast weight cache must be off while a CUDA graph is captured.
    return torch.autocast("cuda", dtype=activation_dtype(device), enabled=device.type == "cuda",
                          cache_enabled=False)


class TrainStep:
    """One training step of a pack of E models (``pathbench.models.pack``; E = 1 for one run):
    the step's batches from the training data's buffers, forward, each member's loss,
    backward, the schedule's learning rate, and the optimizer's per-member clipping and AdamW
    update.

    ``inputs`` and ``targets`` [S, E * B, T] are `TrainingData`'s buffers; step n reads row
    n mod S. Everything a step needs lives on the device: the step counter (the schedule's
    input and the row to read), the learning rates, and the members' losses, which each step
    writes to a log that `read_losses` reads and empties, and their correct and scored target
    counts, added to ``correct`` and ``scored`` [E]. On CUDA the forward and the losses are
    compiled (``compile_for_cuda``), the first EAGER_CUDA_STEPS steps run without a graph on a
    side stream (compilation, lazy initialisation, the Triton kernel's choice of launch
    configuration), the next one is captured as a CUDA graph, and every later step is one
    replay of it: the whole step, without a launch from Python per kernel and without reading
    anything back.
    """

    EAGER_CUDA_STEPS = 3

    def __init__(self, model, optimizer: PackedAdamW, inputs: torch.Tensor,
                 targets: torch.Tensor, schedule, device: torch.device):
        """schedule: the learning-rate factor of a (0-based, float64 tensor) step number."""
        self.model, self.optimizer, self.device = model, optimizer, device
        self.inputs, self.targets, self.schedule = inputs, targets, schedule
        self.members = optimizer.members
        self.correct = torch.zeros(self.members, dtype=torch.long, device=device)
        self.scored = torch.zeros(self.members, dtype=torch.long, device=device)
        self.step_number = torch.zeros((), dtype=torch.float64, device=device)
        self.loss_log = torch.zeros(LOSS_READ_EVERY, self.members, device=device)
        self.logged = torch.zeros(1, dtype=torch.long, device=device)  # rows of loss_log in use
        self.unread = 0  # the same count, as the host knows it
        self.steps_taken = 0
        self.graph = None
        self.forward_losses = self._forward_losses
        if device.type == "cuda":
            self.forward_losses = compile_for_cuda(self._forward_losses)

    def __call__(self) -> None:
        if self.unread == LOSS_READ_EVERY:
            raise RuntimeError(f"{LOSS_READ_EVERY} steps' losses are unread")
        self.steps_taken += 1
        self.unread += 1
        if self.device.type != "cuda":
            self._step()
        elif self.graph is not None:
            self.graph.replay()
        elif self.steps_taken <= self.EAGER_CUDA_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._step()
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            # Capturing records the step without running it; the replay below runs it.
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step()
            self.graph.replay()

    def read_losses(self) -> list[list[float]]:
        """The members' losses of the steps since the last read, [steps, E] (waits for them)."""
        losses = self.loss_log[: self.unread].tolist()
        self.logged.zero_()
        self.unread = 0
        return losses

    def _forward_losses(self, inputs, targets):
        """Each member's loss [E] (with autograd history), and its correct and scored target
        counts [E]."""
        with _autocast(self.device):
            logits = self.model(inputs)
        token_losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                       ignore_index=IGNORE_INDEX, reduction="none")
        scored = (targets != IGNORE_INDEX).view(self.members, -1)
        scored_counts = scored.sum(1)
        # Each member's mean over its scored targets, as cross_entropy's own mean would be.
        losses = token_losses.view(self.members, -1).sum(1) / scored_counts
        hits = (logits.argmax(dim=-1) == targets).view(self.members, -1) & scored
        return losses, hits.sum(1), scored_counts

    def _step(self) -> None:
        row = self.step_number.long().remainder(self.inputs.shape[0]).view(1)
        inputs, targets = self.inputs.index_select(0, row)[0], self.targets.index_select(0, row)[0]
        self.optimizer.zero_grad()
        losses, hits, scored = self.forward_losses(inputs, targets)
        losses.sum().backward()  # the members share no weights: each gets its own gradient
        self.optimizer.step(self.schedule(self.step_number))
        self.step_number += 1
        self.correct += hits
        self.scored += scored
        self.loss_log.index_copy_(0, self.logged, losses.detach()[None])
        self.logged += 1


# Inductor's advice, printed for compiled graphs, that does not apply here: the float32 products
# left under bf16 autocast are PaTH's block algebra (the torch path, at head sizes the Triton
# kernel does not take), kept in float32 on purpose (a triangular inverse), which TF32 would
# round; and a reduction that gave up online softmax costs only that reduction some speed.
warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32 matrix multiplication")
warnings.filterwarnings("ignore", message="\nOnline softmax is disabled on the fly")


def compile_for_cuda(fn):
    """``fn`` compiled by torch.compile for fixed shapes, to run on CUDA tensors.

    Compiled code is cached per Python function, a few versions each, and one sweep worker
    trains many architectures one after another: the caches are emptied first, so that each
    pack compiles its own (inductor's kernel cache on disk still serves repeats). The Triton
    PaTH kernel enters the graph as opaque operators, its forward and backward
    (``path_attention_triton``).
    """
    torch.compiler.reset()
    return torch.compile(fn, dynamic=False)


@torch.no_grad()
def evaluate(model, members: int, task, data: EvaluationSplit, batch_tokens: int,
             device: torch.device, progress: bool = False) -> list[dict]:
    """Task metrics of each member's argmax predictions on one split's fixed sequences (every
    member reads the same ones), tallied a chunk at a time. A forward reads at most
    ``batch_tokens`` tokens (at least one sequence), so that a longer test split takes fewer
    sequences at a time instead of more memory. ``progress``: a bar over the sequences of a
    split larger than one chunk."""
    model.eval()
    tallies = [None] * members
    bar = tqdm(total=sum(data.sizes), desc=f"evaluate {data.split}", unit="seq", leave=False,
               disable=not progress or len(data.sizes) == 1, dynamic_ncols=True)
    for chunk in data.chunks():
        inputs = torch.from_numpy(chunk.inputs)
        batch_size = max(1, batch_tokens // inputs.shape[1])
        predictions = []
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(device)
            with _autocast(device):
                logits = model(batch.repeat(members, 1))
            predictions.append(logits.argmax(dim=-1).view(members, *batch.shape).cpu())
        predictions = torch.cat(predictions, dim=1).numpy()
        for member in range(members):
            tallies[member] = _add(tallies[member],
                                   task.tally(predictions[member], chunk.targets, data.split))
        bar.update(len(inputs))
    bar.close()
    model.train()
    return [to_jsonable(task.metrics_from(tally, data.split)) for tally in tallies]


def to_jsonable(value):
    """numpy scalars and arrays inside metric dicts -> plain Python numbers and lists."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class Member:
    """One run of a pack: its seed (training data), peak learning rate, and curve writer."""

    seed: int
    lr: float
    curve: object  # has append(dict), called once per validation check: a store.CurveWriter


def train(model, task, train_config: TrainConfig, members: list[Member], device: torch.device,
          progress: bool = True, label: str = "train") -> list[Outcome]:
    """Train ``model`` on ``task`` and evaluate it on every evaluation split; one outcome per
    member.

    ``model`` is one model (one member) or a pack of ``len(members)`` models
    (``pathbench.models.pack``). Each member trains exactly as alone: its own data stream, its
    own learning rate, clipping, early stop and divergence check. A member that is done (early
    stop, divergence) is evaluated at once, its weights are kept in its outcome, and it is
    frozen (learning rate 0) while the others train on.

    Each member's ``curve`` receives one point per validation check: the step, the learning
    rate, the mean training loss and accuracy since the previous point, and the validation
    metrics.
    """
    config, primary, count = train_config, task.primary_metric, len(members)
    validation_set, *test_sets = evaluation_splits(task, config)
    data_hash, baselines = hash_and_baselines(task, [validation_set, *test_sets])
    batch_tokens = evaluation_batch_tokens(config, validation_set)
    packed = is_packed(model)
    if not packed and count != 1:
        raise ValueError(f"{count} members need a pack of {count} models, not a single model")

    model.to(device).train()
    optimizer = PackedAdamW(model, [member.lr for member in members], config.weight_decay,
                            config.grad_clip, member_axis=packed)
    data = TrainingData(task, config.batch_size, [member.seed for member in members],
                        validation_set.chunk(0).inputs.shape[1], device)

    def schedule(step: torch.Tensor) -> torch.Tensor:
        return lr_factors(step, config.steps, config.warmup, config.schedule, config.decay)

    step_fn = TrainStep(model, optimizer, data.inputs, data.targets, schedule, device)
    correct, scored = step_fn.correct, step_fn.scored

    def weights(member: int) -> dict:
        if not packed:
            return {name: value.detach().clone() for name, value in model.state_dict().items()}
        return member_state_dict(model, member)

    outcomes: list[Outcome | None] = [None] * count
    validation: list[dict] = [{} for _ in members]
    # each member's best val primary metric, and the checks since it was last bettered
    best, since_best = [-math.inf] * count, [0] * count

    def finish(member: int, outcome: Outcome, metrics=None) -> None:
        optimizer.freeze(member)
        if outcome.status == "ok":
            outcome.metrics = metrics[member]
            outcome.weights = weights(member)
        outcome.validation, outcome.dataset_hash = validation[member], data_hash
        outcome.baselines = baselines
        outcomes[member] = outcome

    def final_metrics() -> list[dict]:
        per_split = {data.split: evaluate(model, count, task, data, batch_tokens, device,
                                          progress=progress)
                     for data in test_sets}
        return [{split: rows[member] for split, rows in per_split.items()}
                for member in range(count)]

    # Statistics stay on the device and are read back every LOSS_READ_EVERY steps: reading a
    # value each step would stall the GPU queue at every step.
    loss_sums, interval_steps = [0.0] * count, 0
    bar = tqdm(total=config.steps, desc=label, disable=not progress, dynamic_ncols=True,
               mininterval=0.5)
    start = time.perf_counter()
    step = 0
    for step in range(1, config.steps + 1):
        if (step - 1) % data.steps_per_draw == 0:
            data.refill()
        step_fn()

        evaluate_now = step % config.eval_every == 0 or step == config.steps
        if step_fn.unread < LOSS_READ_EVERY and not evaluate_now:
            continue
        losses = step_fn.read_losses()  # [steps read, members]
        for member in range(count):
            if outcomes[member] is not None:
                continue
            bad = [offset for offset, row in enumerate(losses) if not math.isfinite(row[member])]
            if bad:
                bad_step = step - len(losses) + 1 + bad[0]
                reason = f"loss became {losses[bad[0]][member]} at step {bad_step}"
                finish(member, Outcome("diverged", bad_step, False, "diverged", reason=reason))
                continue
            loss_sums[member] += sum(row[member] for row in losses)
        interval_steps += len(losses)
        bar.update(len(losses))
        accuracies = (correct / scored.clamp(min=1)).tolist()
        if all(outcome is not None for outcome in outcomes):
            break
        running = [member for member in range(count) if outcomes[member] is None]
        bar.set_postfix(loss=f"{min(losses[-1][m] for m in running):.4f}",
                        acc=f"{max(accuracies[m] for m in running):.3f}")
        if not evaluate_now:
            continue

        checked = evaluate(model, count, task, validation_set, batch_tokens, device)
        stopped = {}  # member -> why
        for member in running:
            value = checked[member][primary]
            if value > best[member]:
                best[member], since_best[member] = value, 0
            else:
                since_best[member] += 1
            validation[member] = checked[member]
            members[member].curve.append({
                "step": step,
                "lr": members[member].lr * lr_factor(step - 1, config.steps, config.warmup,
                                                     config.schedule, config.decay),
                "loss": loss_sums[member] / interval_steps,
                "accuracy": accuracies[member],
                "validation": checked[member],
                "elapsed_s": round(time.perf_counter() - start, 3),
            })
            if config.early_stop is not None and value >= config.early_stop:
                stopped[member] = "threshold"
            elif config.patience is not None and since_best[member] >= config.patience:
                stopped[member] = "patience"
        loss_sums, interval_steps = [0.0] * count, 0
        correct.zero_()
        scored.zero_()
        bar.set_postfix(val=f"{max(checked[m][primary] for m in running):.3f}")
        if stopped and step < config.steps:
            metrics = final_metrics()
            for member, why in stopped.items():
                finish(member, Outcome("ok", step, True, why), metrics)
            if all(outcome is not None for outcome in outcomes):
                break
    bar.close()
    data.close()

    if any(outcome is None for outcome in outcomes):
        metrics = final_metrics()
        for member in range(count):
            if outcomes[member] is None:
                improving = since_best[member] < (config.patience or 1)
                finish(member, Outcome("ok", step, False, "step cap", improving), metrics)
    return outcomes
