"""The kernel's float32 gradients at trained states: its products' precision, or its algorithm?

spike_f64.log found the kernel's float32 gradients two to five times further from float64 than
the torch backend's at steps 1000 and 1999 of the bfloat16 training, while on fresh random
inputs the two are alike (tf32x3_emulated.log). On the GPU the kernel's float32 products take
three-pass tf32; under the interpreter they are IEEE float32. This probe takes states from the
GPU to the CPU to tell the two apart.

On the GPU (`save`): trains triton_check's 2-layer path model (heads of 128, T = 512, B = 32)
with its recipe on the Triton kernel in bfloat16 autocast, --runs times, and at steps 1000 and
1999, before the step is taken, keeps the parameters (STATES_DIR/states_<run>.pt) and compares
that step's gradients against the torch backend in float64: the torch backend and the kernel,
each in float32, on the whole batch and on its first SUB sequences.

On the CPU (`compare`): for each kept state, the same comparison on the first SUB sequences,
with the kernel under the interpreter, its products once in IEEE float32 and once in three-pass
tf32 emulated (tf32x3_probe.py's patch of the interpreter's dot).

Printed for each way: the loss, and its gradients' relative error against float64 (the
difference's norm over the reference's) for the worst parameter (named) and the median one.

    python3 results/kernel/trained_states_probe.py save STATES_DIR [--runs 2]
    python3 results/kernel/trained_states_probe.py compare STATES_DIR/states_*.pt
"""

import argparse
import copy
import functools
import os
import statistics
import sys
import time

import torch

SUB = 2  # sequences of the batch in the comparisons the CPU repeats (the interpreter is slow)
STEPS, B, T, HEAD_DIM, LR = 2000, 32, 512, 128, 1e-3
KEPT = (1000, STEPS - 1)


def _batch(task, step, device):
    data = task.generate(B, seed=step, split="train")
    return torch.as_tensor(data.inputs).to(device), torch.as_tensor(data.targets).to(device)


def _gradients(model, inputs, targets, backend, float64=False):
    """The loss and every parameter's gradient (float64), leaving the model's .grad alone."""
    import pathbench.models.attention as attn_mod
    from pathbench.kernels import path_attention
    from pathbench.kernels.triton_check import _loss

    if float64:
        model = copy.deepcopy(model).double()
    attn_mod.path_attention = functools.partial(path_attention, backend=backend)
    loss = _loss(model, inputs, targets)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return loss.item(), {n: g.double() for (n, _), g in zip(named, grads) if g is not None}


def _errors(grads, ref):
    return {n: ((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-300)).item() for n in ref}


def _report(label, ways, inputs, targets, model):
    """ways: (name, backend, setup) triples; setup() runs before that way's gradients."""
    ref_loss, ref = _gradients(model, inputs, targets, "torch", float64=True)
    print(f"  {label}: float64 loss {ref_loss:.4g}", flush=True)
    for name, backend, setup in ways:
        setup()
        t0 = time.time()
        loss, grads = _gradients(model, inputs, targets, backend)
        errors = _errors(grads, ref)
        worst = max(errors, key=errors.get)
        print(f"    {name:36s} loss {loss:.4g}  worst {errors[worst]:.1e} ({worst})  "
              f"median {statistics.median(errors.values()):.1e}  ({time.time() - t0:.0f}s)", flush=True)


def save(states_dir, runs):
    from pathbench.kernels.triton_check import WARM_UP_STEPS, _loss, _model, _optimizer
    import pathbench.models.attention as attn_mod
    from pathbench.kernels import path_attention
    from pathbench.tasks import make_task

    os.makedirs(states_dir, exist_ok=True)
    task = make_task("flipflop", {"length": T})
    ways = [("torch backend, float32", "torch", lambda: None),
            ("kernel, float32 (tf32x3 on the GPU)", "triton", lambda: None)]
    for run in range(runs):
        model = _model("path", len(task.vocab), head_dim=HEAD_DIM)
        opt, sched = _optimizer(model, LR, STEPS)
        kept = {}
        t0 = time.time()
        for step in range(STEPS):
            inputs, targets = _batch(task, step, "cuda")
            attn_mod.path_attention = functools.partial(path_attention, backend="triton")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = _loss(model, inputs, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if step in KEPT:
                kept[step] = {n: p.detach().cpu().clone() for n, p in model.state_dict().items()}
                print(f"run {run} step {step} (bf16 training loss {loss.item():.4g}, "
                      f"{time.time() - t0:.0f}s):", flush=True)
                _report("whole batch", ways, inputs, targets, model)
                _report(f"first {SUB} sequences", ways, inputs[:SUB], targets[:SUB], model)
            opt.step()
            sched.step()
        path = os.path.join(states_dir, f"states_{run}.pt")
        torch.save({"kept": kept, "warm_up": WARM_UP_STEPS}, path + ".tmp")
        os.replace(path + ".tmp", path)


def compare(paths):
    # the interpreter, and tf32x3_probe's patch of its dot, before triton is imported
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tf32x3_probe  # noqa: F401  (sets TRITON_INTERPRET=1 and patches the dot)
    from pathbench.models import build_model, model_config
    from pathbench.tasks import make_task

    task = make_task("flipflop", {"length": T})
    model = build_model(model_config({"vocab_size": len(task.vocab), "attention": "path",
                                      "layers": 2, "heads": 2, "d_model": 2 * HEAD_DIM,
                                      "beta_max": 2.0}))
    ways = [("torch backend, float32", "torch", lambda: None),
            ("kernel, IEEE float32 products", "triton", lambda: tf32x3_probe._use("ieee")),
            ("kernel, tf32x3 emulated", "triton", lambda: tf32x3_probe._use("tf32x3"))]
    for path in paths:
        for step, state in torch.load(path)["kept"].items():
            model.load_state_dict(state)
            inputs, targets = _batch(task, step, "cpu")
            print(f"{os.path.basename(path)} step {step}:", flush=True)
            _report(f"first {SUB} sequences", ways, inputs[:SUB], targets[:SUB], model)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    on_gpu = sub.add_parser("save")
    on_gpu.add_argument("states_dir")
    on_gpu.add_argument("--runs", type=int, default=2)
    on_cpu = sub.add_parser("compare")
    on_cpu.add_argument("paths", nargs="+")
    args = parser.parse_args()
    if args.mode == "save":
        save(args.states_dir, args.runs)
    else:
        compare(args.paths)
