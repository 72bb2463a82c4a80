"""What one training step of the paper sweep costs on a GPU (its output is step_cost.log).

Run from the repository root on a GPU:
    python3 results/paper/step_cost.py alone a5:path:1 mqrar:sba:2:3 ...  # TASK:MODEL:LAYERS[:PACK]
    python3 results/paper/step_cost.py together 12,24 a5:path:2 ...       # under CUDA MPS
    python3 results/paper/step_cost.py mix 10 a5:nope:3:6 a5:path:3:6 ...  # under CUDA MPS
`alone`: ms per step of graph-replayed training steps with nothing else on the GPU, and the
kernels of one eager step (count, summed GPU time, the five costliest). `together`: K
processes replay the same step side by side for 6 s; the aggregate steps per second give the
GPU time per step when the GPU is shared, as in the sweep's workers. PACK (default 1) trains
that many runs as one packed model (pathbench.models.pack), as `pathbench sweep --pack` does;
"per run" divides by it. `mix`: one process per spec, side by side for SECONDS, as the
sweep's workers run different packs at once; it prints each one's steps per second and the
runs' steps per second of all together. Steps are compiled as in training (TrainStep); a spec
ending in "+e" runs them eagerly instead, for comparison. Each run is configured as in the paper
sweep (sweep_run).
"""

import dataclasses
import json
import subprocess
import sys
import time
import traceback

import torch
from torch.profiler import ProfilerActivity, profile

from pathbench.models import build_model, model_config
from pathbench.models.pack import pack_models
from pathbench.runners.config import train_config
from pathbench.runners.optimizer import PackedAdamW
from pathbench.runners.sweep import find_sweep_file, load_sweep_file
from pathbench.runners.train import TrainStep, training_batches
from pathbench.tasks import make_task


def pack_size(spec):
    parts = spec.removesuffix("+e").split(":")
    return int(parts[3]) if len(parts) == 4 else 1


def sweep_run(task_name, model, layers, device):
    """The run config of the paper sweep's grid for task_name (runners/sweeps/paper.toml) at
    this model and layer count, with the grid's first seed and learning rate; a further axis
    of the grid (MQRAR's N-back, which changes no shape) stays at the task's default."""
    _, grids = load_sweep_file(find_sweep_file("paper"))
    grid = next(g for g in grids if g.task == task_name)
    grid = dataclasses.replace(grid, models=[model], layers=[layers], seeds=grid.seeds[:1],
                               lrs=grid.lrs and grid.lrs[:1], until_solved=False, grid={})
    return grid.configs(device)[0]


def training_step(spec):
    """A CUDA-graph training step of TASK:MODEL:LAYERS[:PACK] and ten batches for it."""
    task_name, model, layers = spec.removesuffix("+e").split(":")[:3]
    members = pack_size(spec)
    config = sweep_run(task_name, model, int(layers), "cuda")
    task = make_task(config["task"]["name"], config["task"]["config"])
    torch.manual_seed(0)
    device = torch.device("cuda")
    net = pack_models([build_model(model_config(config["model"])) for _ in range(members)])
    net = net.to(device).train()
    started = time.perf_counter()
    train = train_config(config["train"])
    optimizer = PackedAdamW(net, [train.lr] * members, train.weight_decay, train.grad_clip,
                            member_axis=True)
    optimizer.set_lr_factor(1.0)
    step = TrainStep(net, optimizer, device)
    if spec.endswith("+e"):
        step.forward_losses = step._forward_losses
    batches = training_batches(task, train.batch_size * members, 0, device)
    for _ in range(TrainStep.EAGER_CUDA_STEPS + 3):  # eager steps, capture, replays
        step(*next(batches))
    torch.cuda.synchronize()
    print(f"{spec}: first steps and capture took {time.perf_counter() - started:.1f} s",
          file=sys.stderr, flush=True)
    return step, [next(batches) for _ in range(10)]


def alone(spec):
    step, data = training_step(spec)
    start = time.perf_counter()
    for i in range(60):
        step(*data[i % 10])
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / 60 * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step._step(*data[0])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = {}
    for e in kernels:
        by_name[e.name[:50]] = by_name.get(e.name[:50], 0) + e.device_time
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
    print(f"{spec:22s} replay {ms:6.2f} ms/step ({ms / pack_size(spec):5.2f} per run)  "
          f"eager kernels {len(kernels):4d}  "
          f"kernel-sum {sum(e.device_time for e in kernels) / 1e3:6.2f} ms  top: "
          + "; ".join(f"{name} {us / 1e3:.2f}" for name, us in top), flush=True)


def worker(spec, seconds):
    step, data = training_step(spec)
    print("ready", flush=True)
    sys.stdin.readline()
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for batch in data:
            step(*batch)
        torch.cuda.synchronize()
        steps += len(data)
    print(json.dumps({"steps": steps, "s": time.perf_counter() - start}), flush=True)


def side_by_side(specs, seconds):
    """Each spec's steps per second, one worker process per spec, all started at once."""
    procs = [subprocess.Popen([sys.executable, __file__, "worker", spec, str(seconds)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for spec in specs]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:  # start them at once
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait()
    return [r["steps"] / r["s"] for r in results]


def together(spec, k, seconds=6.0):
    rate = sum(side_by_side([spec] * k, seconds))
    print(f"{spec:22s} K={k:3d}  aggregate {rate:8.1f} steps/s  = {1e3 / rate:6.3f} ms GPU per step "
          f"({1e3 / rate / pack_size(spec):6.3f} per run); per worker {1e3 * k / rate:6.1f} ms/step",
          flush=True)


def mix(specs, seconds):
    rates = side_by_side(specs, seconds)
    for spec, rate in zip(specs, rates):
        print(f"  {spec:22s} {rate:7.1f} steps/s", flush=True)
    print(f"mix of {len(specs)}: {sum(r * pack_size(s) for s, r in zip(specs, rates)):8.1f} "
          f"run-steps/s", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "alone":
        for spec in sys.argv[2:]:
            try:
                alone(spec)
            except Exception as exc:  # report (traceback on stderr) and go on to the next spec
                traceback.print_exc()
                print(f"{spec:22s} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    elif sys.argv[1] == "mix":
        mix(sys.argv[3:], float(sys.argv[2]))
    else:
        for spec in sys.argv[3:]:
            for k in map(int, sys.argv[2].split(",")):
                together(spec, k)
