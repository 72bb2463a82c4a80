"""GPU checks that models run on the Triton kernel: `python -m pathbench.runners.bench.gpu_check`.

1. For fox, path and path_fox models (2 layers) on CUDA: one training step's loss and every
   parameter gradient with the default backend (the Triton kernel) against the torch
   blockwise backend, in float32.
2. A 2-layer path model trains --steps steps on flip-flop in bfloat16 autocast on the GPU, with
   two heads of 32 and again with two of 128 (where the kernel's block-local products take
   float16 operands), with `pathbench run`'s optimiser settings (AdamW with betas 0.9 and 0.98,
   warm-up then cosine decay); every loss must be finite. Prints the loss curve and the final
   training accuracy.
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import torch
import torch.nn.functional as F

from pathbench.tasks import IGNORE_INDEX

WARM_UP_STEPS = 200


def _model(attention, vocab, layers=2, beta_max=2.0, seed=0, head_dim=32, device="cuda",
           backend="auto"):
    from pathbench.models import build_model, model_config

    torch.manual_seed(seed)
    cfg = model_config({"vocab_size": vocab, "attention": attention, "layers": layers, "heads": 2,
                        "d_model": 2 * head_dim, "beta_max": beta_max, "backend": backend})
    return build_model(cfg).to(device)


def _loss(model, inputs, targets, at_least=torch.float32):
    logits = model(inputs)
    # bf16 logits (autocast) in float32; a float64 model's in float64: near a loss of 0, a float32
    # loss cannot resolve a log-probability, and its gradients are mostly rounding
    logits = logits.to(torch.promote_types(logits.dtype, at_least))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def check_against_torch(B=8, T=300, vocab=16):
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, vocab, (B, T), generator=gen).cuda()
    targets = torch.randint(0, vocab, (B, T), generator=gen).cuda()
    ok = True
    for attention in ("fox", "path", "path_fox"):
        results = []
        for backend in ("triton", "torch"):
            model = _model(attention, vocab, backend=backend)  # the same weights: one seed
            loss = _loss(model, inputs, targets)
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((loss.item(), grads))
        (l1, g1), (l2, g2) = results
        worst = max(((g1[n] - g2[n]).norm() / g2[n].norm().clamp_min(1e-12)).item() for n in g2)
        loss_diff = abs(l1 - l2) / abs(l2)
        good = loss_diff < 1e-5 and worst < 1e-3 and set(g1) == set(g2)
        ok &= good
        print(f"{attention:9s} loss triton {l1:.6f} torch {l2:.6f} (rel {loss_diff:.1e}); "
              f"worst parameter-gradient rel. difference {worst:.1e} over {len(g2)} tensors: "
              f"{'ok' if good else 'FAIL'}")
    return ok


def _optimizer(model, lr, steps):
    """AdamW and its schedule as `pathbench run` trains: betas 0.9 and 0.98, warm-up then cosine
    decay."""
    from pathbench.runners.training.loop import lr_factor

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))
    schedule = functools.partial(lr_factor, total=steps, warmup=WARM_UP_STEPS)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def train_bf16(steps=2000, B=32, T=512, lr=1e-3, beta_max=2.0, head_dim=32):
    from pathbench.tasks import make_task

    task = make_task("flipflop", {"length": T})
    model = _model("path", len(task.vocab), layers=2, beta_max=beta_max, head_dim=head_dim)
    print(f"bf16 training, heads of {head_dim}:")
    opt, sched = _optimizer(model, lr, steps)
    t0 = time.time()
    bad = 0
    worst_loss, worst_step = 0.0, None  # after the warm-up: spikes show here, between the prints
    for step in range(steps):
        data = task.generate(B, seed=step, split="train")
        inputs = torch.as_tensor(data.inputs).cuda()
        targets = torch.as_tensor(data.targets).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = _loss(model, inputs, targets)
        value = loss.item()
        if not math.isfinite(value):
            bad += 1
            print(f"step {step}: non-finite loss {value}")
            if bad > 3:
                break
            opt.zero_grad(set_to_none=True)
            continue
        if step >= WARM_UP_STEPS and value > worst_loss:
            worst_loss, worst_step = value, step
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(gnorm):
            bad += 1
            print(f"step {step}: non-finite gradient norm")
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(inputs)
            mask = targets != IGNORE_INDEX
            acc = (logits.argmax(-1)[mask] == targets[mask]).float().mean().item()
            print(f"step {step:5d} loss {value:.4f} acc {acc:.4f} ({time.time() - t0:.0f}s)")
    print(f"bf16 training, heads of {head_dim}: {steps} steps, {bad} non-finite steps, "
          f"highest loss after the warm-up {worst_loss:.4f} (step {worst_step}), "
          f"{time.time() - t0:.0f}s: {'ok' if bad == 0 else 'FAIL'}")
    return bad == 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--beta-max", type=float, default=2.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU")
    ok = check_against_torch()
    for head_dim in (32, 128):
        ok &= train_bf16(steps=args.steps, beta_max=args.beta_max, head_dim=head_dim)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
