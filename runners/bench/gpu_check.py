"""GPU checks that models run on the Triton kernel: `python -m pathbench.runners.bench.gpu_check`.

1. For fox, path and path_fox models (2 layers) on CUDA: one training step's loss and every
   parameter gradient with the default backend (the Triton kernel) against the torch
   blockwise backend, in float32.
2. A 2-layer path model trains --steps steps on flip-flop through the library's training loop
   (`pathbench.runners.training.loop.train`: bfloat16 autocast, compiled, replayed as a CUDA
   graph, as `pathbench run` trains), with two heads of 32 and again with two of 128 (where the
   kernel's block-local products take float16 operands); no loss may be non-finite. Prints the
   curve: training loss and accuracy, and validation accuracy.
"""

from __future__ import annotations

import argparse
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


def train_bf16(steps=2000, B=32, T=512, lr=1e-3, beta_max=2.0, head_dim=32):
    """A 2-layer path model trained on flip-flop by the library's loop, as `pathbench run`
    trains on CUDA (bf16 autocast, compiled, replayed as a CUDA graph): ok when no loss was
    non-finite (the loop ends such a run as "diverged")."""
    from pathbench.runners.training.config import train_config
    from pathbench.runners.training.loop import Member, train
    from pathbench.tasks import make_task

    task = make_task("flipflop", {"length": T})
    model = _model("path", len(task.vocab), layers=2, beta_max=beta_max, head_dim=head_dim)
    print(f"bf16 training, heads of {head_dim}:")
    settings = train_config({"steps": steps, "batch_size": B, "lr": lr, "warmup": WARM_UP_STEPS,
                             "eval_every": 250, "eval_num": 256, "early_stop": None})
    curve = []
    t0 = time.time()
    [outcome] = train(model, task, settings, [Member(0, lr, curve)], torch.device("cuda"),
                      progress=False)
    for point in curve:
        print(f"step {point['step']:5d} loss {point['loss']:.4f} acc {point['accuracy']:.4f} "
              f"val {point['validation']['accuracy']:.4f} ({point['elapsed_s']:.0f}s)")
    ok = outcome.status == "ok"
    print(f"bf16 training, heads of {head_dim}: {outcome.steps} steps, {outcome.status}"
          f"{': ' + outcome.reason if outcome.reason else ''}, {time.time() - t0:.0f}s: "
          f"{'ok' if ok else 'FAIL'}")
    return ok


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
