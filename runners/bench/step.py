"""`pathbench bench step`: where one training step of a pack spends its time.

The step is the library's own (`TrainStep` over `TrainingData`, as `train` builds them), at one
of `pathbench bench train`'s shapes. Three readings:

- the step as training takes it (refills included), per step, after compilation and capture;
- the device's busy time per step: the kernels of one step under torch.profiler, summed;
- that busy time by kind of kernel: matrix products, attention, fused elementwise (compiled),
  other elementwise and reductions, copies; the number of kernel launches a step, and the
  longest kernels by name.

Step time well above the busy time means the device waits for the host (launches, reads);
busy time dominated by elementwise kernels means memory traffic, by matrix products arithmetic.
On a CPU the same readings are of the CPU's operators.
"""

from __future__ import annotations

import re
import time

import torch

from pathbench.runners.bench.train import Shape, build_pack
from pathbench.runners.training.loop import TrainingData, TrainStep, lr_factors
from pathbench.runners.training.optimizer import PackedAdamW

# Kernel (or CPU operator) names by kind, the first that matches; the rest is "other".
KINDS = {
    "matrix products": r"gemm|gemv|splitK|nvjet|cutlass|xmma|aten::(mm|bmm|addmm|baddbmm|matmul)\b",
    # torch's fused attention; the Triton PaTH kernel's stages
    "attention": r"sdpa|flash|fmha|attention|scan_kernel|(prep|edges)_(fwd|bwd)_kernel",
    "fused elementwise (compiled)": r"^triton_",
    "copies": r"copy|memcpy|memset|aten::(cat|stack|clone|index)",
    "other elementwise and reductions": r"elementwise|reduce|vectorized|aten::",
}


TOP_KERNELS = 12  # the longest kernels listed by name


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS.items() if re.search(pattern, name)), "other")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(shape: Shape, attention: str, pack: int, device: str, steps: int,
                 backend: str = "auto") -> dict:
    """Time ``steps`` training steps of a pack of ``pack`` runs at ``shape`` and profile one:
    ms per step, the device's busy ms per step, and busy ms by kind of kernel. ``backend`` is
    the models' ``model.backend`` setting."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    task, _, model = build_pack(shape, attention, pack, backend)
    model.to(device).train()
    optimizer = PackedAdamW(model, [1e-4] * pack, 0.1, 1.0, member_axis=pack > 1)
    length = task.generate(1, 0, "val").inputs.shape[1]
    data = TrainingData(task, shape.batch, list(range(pack)), length, device)
    step = TrainStep(model, optimizer, data.inputs, data.targets,
                     lambda number: lr_factors(number, 10**6, 0), device)

    def train_steps(count: int) -> None:
        for _ in range(count):
            if step.steps_taken % data.steps_per_draw == 0:
                data.refill()
            step()
            if step.unread == len(step.loss_log):
                step.read_losses()

    train_steps(TrainStep.EAGER_CUDA_STEPS + 2)  # compile, capture
    _synchronize(device)
    start = time.perf_counter()
    train_steps(steps)
    _synchronize(device)
    ms_step = 1e3 * (time.perf_counter() - start) / steps
    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as profiler:
        step._step()  # the captured step's kernels, launched one by one
        _synchronize(device)
    step.unread += 1
    step.read_losses()
    data.close()
    by_kind = dict.fromkeys([*KINDS, "other"], 0.0)
    kernels = []  # (ms, name, launches) of each kernel (or CPU operator) name
    for event in profiler.key_averages():
        busy = event.self_device_time_total if cuda else event.self_cpu_time_total
        if busy > 0 and not event.key.startswith(("cuda", "Profiler")):
            by_kind[kind_of(event.key)] += busy / 1e3
            kernels.append((busy / 1e3, event.key, event.count))
    return {"ms_per_step": ms_step, "busy_ms_per_step": sum(by_kind.values()),
            "run_steps_per_s": pack * 1e3 / ms_step, "by_kind": by_kind,
            "launches": sum(count for _, _, count in kernels),
            "longest": sorted(kernels, reverse=True)[:TOP_KERNELS]}


def bench_step(shape_name: str, attention: str, pack: int, device: str, steps: int,
               backend: str = "auto", echo=print) -> dict:
    """Print `profile_step`'s readings as a table."""
    from pathbench.runners.bench.train import SHAPES

    found = profile_step(SHAPES[shape_name], attention, pack, device, steps, backend)
    busy = found["busy_ms_per_step"]
    named = attention if backend == "auto" else f"{attention} (backend {backend})"
    echo(f"{shape_name}, {named}, pack {pack}, {device}: {found['ms_per_step']:.3f} ms a "
         f"step ({found['run_steps_per_s']:,.0f} run-steps/s), {busy:.3f} ms of it busy "
         f"({100 * busy / found['ms_per_step']:.0f}%)")
    echo("| kernels | ms a step | share of busy |\n| --- | --- | --- |")
    for kind, ms in sorted(found["by_kind"].items(), key=lambda item: -item[1]):
        echo(f"| {kind} | {ms:.3f} | {100 * ms / busy if busy else 0:.0f}% |")
    what = "kernel" if device == "cuda" else "operator"  # a CPU profile lists operators
    echo(f"\n{found['launches']:,} {what} calls a step; the {TOP_KERNELS} longest {what}s:\n")
    echo(f"| {what} | kind | calls | ms a step |\n| --- | --- | --- | --- |")
    for ms, name, count in found["longest"]:
        shown = name if len(name) <= 90 else name[:87] + "..."
        echo(f"| `{shown}` | {kind_of(name)} | {count} | {ms:.3f} |")
    return found
