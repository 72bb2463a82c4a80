"""Late loss spikes in triton_check's bfloat16 training: the kernel, or the optimiser?

Runs triton_check's 2-layer path training (flip-flop, T = 512, B = 32, AdamW at 1e-3) at heads
of 128 several times; the runs differ only by the GPU's nondeterministic torch operations. Each
step's loss and gradient norm (before clipping) are kept; every 100 steps one line is printed.
At chosen states (steps 1000 and 1999, the first step whose gradient norm is 20 times the
median of the 100 before it, and the first whose loss is above 0.05 after step 500) the same
batch's loss and parameter gradients are computed four ways before the step is taken: Triton
and torch backends, each in float32 and in bfloat16 autocast. Printed: each one's loss, and
each gradient's worst relative difference from the torch float32 one over the parameters.

    python3 results/kernel/spike_probe.py [seconds]   (stops starting runs after that)
"""

import functools
import statistics
import sys
import time

import torch

import pathbench.models.attention as attn_mod
from pathbench.kernels import path_attention
from pathbench.kernels.triton_check import _loss, _model
from pathbench.tasks import make_task


def _loss_and_grads(model, inputs, targets, backend, bf16):
    attn_mod.path_attention = functools.partial(path_attention, backend=backend)
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = _loss(model, inputs, targets)
        loss.backward()
        return loss.item(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                             if p.grad is not None}
    finally:
        attn_mod.path_attention = path_attention


def compare(model, inputs, targets, why):
    ref_loss, ref = _loss_and_grads(model, inputs, targets, "torch", bf16=False)
    parts = [f"torch fp32 loss {ref_loss:.4g}"]
    for backend, bf16 in (("triton", False), ("triton", True), ("torch", True)):
        loss, grads = _loss_and_grads(model, inputs, targets, backend, bf16)
        worst = max(((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)).item() for n in ref)
        parts.append(f"{backend} {'bf16' if bf16 else 'fp32'} loss {loss:.4g} grads {worst:.1e}")
    model.zero_grad(set_to_none=True)
    print(f"    compare ({why}): " + "; ".join(parts), flush=True)


def run(trial, steps=2000, B=32, T=512, lr=1e-3, head_dim=128):
    task = make_task("flipflop", {"length": T})
    model = _model("path", len(task.vocab), layers=2, head_dim=head_dim)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
    losses, norms, seen = [], [], set()
    t0 = time.time()
    for step in range(steps):
        data = task.generate(B, seed=step, split="train")
        inputs = torch.as_tensor(data.inputs).cuda()
        targets = torch.as_tensor(data.targets).cuda()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss_now = _loss(model, inputs, targets).item()
        whys = []
        if step in (1000, steps - 1):
            whys.append(f"step {step}")
        if step > 500 and loss_now > 0.05 and "loss" not in seen:
            whys.append(f"loss {loss_now:.3g} at step {step}")
            seen.add("loss")
        for why in whys:
            compare(model, inputs, targets, why)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = _loss(model, inputs, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        if step > 500 and "norm" not in seen and norm > 20 * statistics.median(norms[-100:]):
            # the state before this step's update is gone from the parameters only after
            # opt.step(): compare it now (compare clears the gradients, so take them again)
            compare(model, inputs, targets, f"gradient norm {norm:.3g} at step {step}, "
                    f"median of the 100 before {statistics.median(norms[-100:]):.3g}")
            seen.add("norm")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = _loss(model, inputs, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        norms.append(norm)
        if step % 100 == 99:
            window = slice(step - 99, step + 1)
            print(f"  run {trial} steps {step - 99:4d}-{step:4d}: loss max {max(losses[window]):.4f} "
                  f"last {losses[-1]:.4f}; grad norm median {statistics.median(norms[window]):.3g} "
                  f"max {max(norms[window]):.3g} ({time.time() - t0:.0f}s)", flush=True)
    late = [s for s in range(1000, steps) if losses[s] > 0.05]
    print(f"run {trial}: final loss {losses[-1]:.4f}; steps after 1000 with loss above 0.05: "
          f"{len(late)}{' from step ' + str(late[0]) if late else ''}", flush=True)


if __name__ == "__main__":
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 300
    start = time.time()
    trial = 0
    while trial == 0 or time.time() - start < budget:
        run(trial)
        trial += 1
