"""Loss spikes in triton_check's bfloat16 training: the kernel, or the rest of the training?

Runs triton_check's 2-layer path training (flip-flop, T = 512, B = 32, heads of 128, AdamW at
1e-3 with 200 steps of warm-up) with one of two recipes: "check", the one triton_check trained
with before it took the runner's (constant learning rate after the warm-up, AdamW's default
betas 0.9 and 0.999), or "runner", the one `pathbench run` and now triton_check train with
(betas 0.9 and 0.98, cosine decay to zero after the warm-up). Each step's loss and gradient
norm (before clipping) are kept; every 100 steps one line is printed, and at the end the steps
after the warm-up whose loss is above 0.05 are counted.

On the GPU the training runs in bfloat16 autocast (or, with --fp32, in float32) on the backend
named (triton; torch is the control, float32 attention inside the same bf16 model), run after
run until --seconds have passed; the runs differ only by the GPU's nondeterministic torch
operations. At chosen states (steps 1000 and the last, and the first step after the warm-up
whose loss is above 0.05 or whose gradient norm is 20 times the median of the 100 before it)
the same batch's loss and parameter gradients are computed five ways before the step is taken:
the torch backend in float64 (the reference), and the Triton and torch backends each in
float32 and in bfloat16 autocast. Printed: the reference loss, then each way's loss and its
gradients' worst relative difference from the reference over the parameters. Every way takes
its loss in float32 (triton_check's `_loss`), the reference in float64. With --loss64 the
training takes its loss in float64 (the comparisons do not change). On the CPU (--cpu STEPS)
the training runs once, on the torch backend, without comparisons.

    python3 results/kernel/spike_probe.py --seconds 300 [--backend torch] [--fp32] [--recipe runner] [--loss64]
    python3 results/kernel/spike_probe.py --cpu 600 [--bf16]

(Earlier versions made spike.log, spike_cpu.log and spike_runs.log: they took positional
arguments, knew only the check recipe and took the torch backend in float32 as the reference;
the first compared spike states only after step 500 and always trained on the Triton kernel.
The one before this made spike_f64.log, when triton_check's `_loss` took the reference's loss
in float32 as well: at losses of 1e-6 and less that reference's gradients were mostly the
float32 loss's rounding (trained_states_probe.py). This one made spike_f64_loss.log, without
--loss64, and spike_loss64.log.)
"""

import argparse
import copy
import functools
import statistics
import sys
import time

import torch

import pathbench.models.attention as attn_mod
from pathbench.kernels import path_attention
from pathbench.kernels.triton_check import WARM_UP_STEPS, _loss, _model, _optimizer
from pathbench.tasks import make_task


def _warm_up_then_constant(step):
    return min(1.0, (step + 1) / WARM_UP_STEPS)


def _use_backend(backend):
    attn_mod.path_attention = functools.partial(path_attention, backend=backend)


def _loss_and_grads(model, inputs, targets, backend, bf16):
    """The loss and each parameter's gradient, leaving the parameters' .grad as they are."""
    _use_backend(backend)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = _loss(model, inputs, targets)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return loss.item(), {n: g.double() for (n, _), g in zip(named, grads) if g is not None}


def compare(model, inputs, targets, why, training_backend):
    ref_loss, ref = _loss_and_grads(copy.deepcopy(model).double(), inputs, targets, "torch",
                                    bf16=False)
    parts = [f"float64 loss {ref_loss:.4g}"]
    for backend, bf16 in (("torch", False), ("triton", False), ("triton", True), ("torch", True)):
        loss, grads = _loss_and_grads(model, inputs, targets, backend, bf16)
        worst = max(((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)).item()
                    for n in ref)
        parts.append(f"{backend} {'bf16' if bf16 else 'fp32'} loss {loss:.4g} grads {worst:.1e}")
    _use_backend(training_backend)
    print(f"    compare ({why}): " + "; ".join(parts), flush=True)


def run(name, steps=2000, B=32, T=512, lr=1e-3, head_dim=128, device="cuda", bf16=True,
        backend="triton", recipe="check", loss64=False):
    task = make_task("flipflop", {"length": T})
    model = _model("path", len(task.vocab), head_dim=head_dim, device=device)
    if recipe == "check":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _warm_up_then_constant)
    else:
        opt, sched = _optimizer(model, lr, steps)
    _use_backend(backend)
    spike_compared = device != "cuda"
    losses, norms = [], []
    t0 = time.time()
    for step in range(steps):
        data = task.generate(B, seed=step, split="train")
        inputs = torch.as_tensor(data.inputs).to(device)
        targets = torch.as_tensor(data.targets).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = _loss(model, inputs, targets, torch.float64 if loss64 else torch.float32)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        whys = [f"step {step}"] if step in (1000, steps - 1) else []
        if step > WARM_UP_STEPS and not spike_compared:
            median = statistics.median(norms[-100:])
            if loss.item() > 0.05 or norm > 20 * median:
                whys.append(f"spike at step {step}: loss {loss.item():.3g}, gradient norm "
                            f"{norm:.3g}, median of the 100 before {median:.3g}")
                spike_compared = True
        if device == "cuda":
            # before opt.step(): the parameters still hold the state this step's loss came from
            for why in whys:
                compare(model, inputs, targets, why, backend)
        opt.step()
        sched.step()
        losses.append(loss.item())
        norms.append(norm)
        if step % 100 == 99:
            window = slice(step - 99, step + 1)
            print(f"  {name} steps {step - 99:4d}-{step:4d}: "
                  f"loss max {max(losses[window]):.4f} last {losses[-1]:.4f}; "
                  f"grad norm median {statistics.median(norms[window]):.3g} "
                  f"max {max(norms[window]):.3g} ({time.time() - t0:.0f}s)", flush=True)
    spikes = [s for s in range(WARM_UP_STEPS, steps) if losses[s] > 0.05]
    print(f"{name}: final loss {losses[-1]:.4f}; steps after the warm-up with loss above 0.05: "
          f"{len(spikes)}{' from step ' + str(spikes[0]) if spikes else ''}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--backend", choices=("triton", "torch"), default="triton")
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--recipe", choices=("check", "runner"), default="check")
    parser.add_argument("--loss64", action="store_true", help="train with the loss in float64")
    parser.add_argument("--cpu", type=int, metavar="STEPS")
    parser.add_argument("--bf16", action="store_true", help="with --cpu: bfloat16 autocast")
    args = parser.parse_args()
    if args.cpu:
        run(f"cpu {'bf16' if args.bf16 else 'float32'} {args.recipe}{' loss64' if args.loss64 else ''}",
            steps=args.cpu, device="cpu", bf16=args.bf16, backend="torch", recipe=args.recipe,
            loss64=args.loss64)
        sys.exit()
    start = time.time()
    trial = 0
    while trial == 0 or time.time() - start < args.seconds:
        run(f"run {trial} ({args.backend} {'fp32' if args.fp32 else 'bf16'} {args.recipe}"
            f"{' loss64' if args.loss64 else ''})",
            backend=args.backend, bf16=not args.fp32, recipe=args.recipe, loss64=args.loss64)
        trial += 1
