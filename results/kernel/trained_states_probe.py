"""The kernel's float32 gradients at trained states: its products' precision, or its algorithm?

spike_f64.log found the kernel's float32 gradients two to five times further from float64 than
the torch backend's at steps 1000 and 1999 of the bfloat16 training, while on fresh random
inputs the two are alike (tf32x3_emulated.log). On the GPU the kernel's float32 products take
three-pass tf32; under the interpreter they are IEEE float32. This probe takes states from the
GPU to the CPU to tell the two apart.

On the GPU (`save`): trains triton_check's 2-layer path model (heads of 128, T = 512, B = 32)
with its recipe on the Triton kernel in bfloat16 autocast, --runs times, keeps the parameters
at steps 1000 and 1999, before the step is taken (STATES_DIR/states_<run>.pt), and compares
that step's gradients there as `compare` does.

`compare` (on the GPU when there is one, else on the CPU): for each kept state, that step's
loss and parameter gradients against the float64 reference, on the whole batch (GPU only) and
on its first SUB sequences, for the torch backend and the kernel in float32 (on the CPU: under
the interpreter, its products once in IEEE float32 and once in three-pass tf32 emulated,
tf32x3_probe.py's patch of the interpreter's dot). On the GPU only, two switches swap the
GPU's approximate float32 operations in the kernels for rounded ones: --f64-exp2-log2 takes exp2
and log2 in float64, rounded to float32 (instead of ex2.approx.ftz.f32 and lg2.approx.f32),
--rn-division divides in float32 rounded to nearest (div.rn.f32 instead of div.full.f32).

The model's loss is usually taken in float32 (triton_check's `_loss`); at these states it is
1e-6 or less, below float32's resolution of a log-probability near 0, so a float32 loss turns
tiny differences in the logits into different gradients. Each way is therefore reported twice,
with its loss in float32 and in float64; the reference is float64 throughout, and "float64,
loss in float32" is the reference's model with a float32 loss (what spike_f64.log and the first
version of this probe took as the reference). Printed for each: the loss, the logits' relative
error, and the gradients' relative errors (the difference's norm over the reference's) for the
worst parameter (named) and the median one.

    python3 results/kernel/trained_states_probe.py save STATES_DIR [--runs 2]
    python3 results/kernel/trained_states_probe.py compare STATES_DIR/states_*.pt [--f64-exp2-log2] [--rn-division]

(The first version, which made trained_states_gpu.log and trained_states_cpu.log, took the
float64 model with a float32 loss as the reference and reported only float32 losses; its
`compare` ran on the CPU only.)
"""

import argparse
import copy
import functools
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

SUB = 2  # sequences of the batch in the comparisons the CPU repeats (the interpreter is slow)
STEPS, B, T, HEAD_DIM, LR = 2000, 32, 512, 128, 1e-3
KEPT = (1000, STEPS - 1)


def _batch(task, step, device):
    data = task.generate(B, seed=step, split="train")
    return torch.as_tensor(data.inputs).to(device), torch.as_tensor(data.targets).to(device)


def _task_and_model(device):
    from pathbench.kernels.triton_check import _model
    from pathbench.tasks import make_task

    task = make_task("flipflop", {"length": T})
    return task, _model("path", len(task.vocab), head_dim=HEAD_DIM, device=device)


def _gradients(model, inputs, targets, backend, dtype, loss_dtype):
    """The loss, the logits and every parameter's gradient (float64), the model in dtype and
    its loss in loss_dtype; the model's .grad is left alone."""
    import pathbench.models.attention as attn_mod
    from pathbench.kernels import path_attention

    model = copy.deepcopy(model).to(dtype)
    attn_mod.path_attention = functools.partial(path_attention, backend=backend)
    logits = model(inputs)
    loss = F.cross_entropy(logits.to(loss_dtype).flatten(0, 1), targets.flatten(), ignore_index=-100)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    grads = {n: g.double() for (n, _), g in zip(named, grads) if g is not None}
    return loss.item(), logits.detach().double(), grads


def _relative(x, ref):
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _report(label, ways, inputs, targets, model):
    """ways: (name, backend, setup) triples; setup() runs before that way's gradients."""
    ref_loss, ref_logits, ref = _gradients(model, inputs, targets, "torch", torch.float64, torch.float64)
    print(f"  {label}: float64 loss {ref_loss:.6g}", flush=True)
    rows = [("float64", "torch", torch.float64, lambda: None)] + [(n, b, torch.float32, f) for n, b, f in ways]
    for name, backend, dtype, setup in rows:
        for loss_dtype in (torch.float32, torch.float64):
            if dtype == loss_dtype == torch.float64:
                continue  # the reference itself
            setup()
            t0 = time.time()
            loss, logits, grads = _gradients(model, inputs, targets, backend, dtype, loss_dtype)
            errors = {n: _relative(grads[n], ref[n]) for n in ref}
            worst = max(errors, key=errors.get)
            print(f"    {name:72s} loss in {str(loss_dtype)[6:]}: {loss:.6g}  logits "
                  f"{_relative(logits, ref_logits):.1e}  worst {errors[worst]:.1e} ({worst})  "
                  f"median {statistics.median(errors.values()):.1e}  ({time.time() - t0:.0f}s)", flush=True)


GPU_WAYS = [("torch backend, float32", "torch", lambda: None),
            ("kernel, float32", "triton", lambda: None)]


def save(states_dir, runs):
    import pathbench.models.attention as attn_mod
    from pathbench.kernels import path_attention
    from pathbench.kernels.triton_check import _loss, _optimizer

    os.makedirs(states_dir, exist_ok=True)
    for run in range(runs):
        task, model = _task_and_model("cuda")
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
                _report("whole batch", GPU_WAYS, inputs, targets, model)
                _report(f"first {SUB} sequences", GPU_WAYS, inputs[:SUB], targets[:SUB], model)
            opt.step()
            sched.step()
        path = os.path.join(states_dir, f"states_{run}.pt")
        torch.save({"kept": kept}, path + ".tmp")
        os.replace(path + ".tmp", path)


def _float64_exp2_log2():
    """The kernels' tl.exp2 and tl.log2 (resolved when they compile) in float64, rounded to
    float32."""
    global tl, _float32_exp2, _float32_log2
    import triton
    import triton.language as tl

    _float32_exp2, _float32_log2 = tl.exp2, tl.log2

    @triton.jit
    def exp2(x):
        return _float32_exp2(x.to(tl.float64)).to(tl.float32)

    @triton.jit
    def log2(x):
        return _float32_log2(x.to(tl.float64)).to(tl.float32)

    tl.exp2, tl.log2 = exp2, log2


def _rn_division():
    """Every float32 division the kernels compile rounded to nearest (div.rn.f32)."""
    import triton.language as tl
    from triton.language import semantic

    approximate = semantic.TritonSemantic.truediv

    def truediv(self, input, other):
        quotient = approximate(self, input, other)
        if quotient.type.scalar != tl.float32:
            return quotient
        input, other = self.binary_op_type_checking_impl(input, other, False, False, True, True)
        input, other = self.cast(input, tl.float32), self.cast(other, tl.float32)
        return self.tensor(self.builder.create_precise_divf(input.handle, other.handle), input.type)

    semantic.TritonSemantic.truediv = truediv


def compare(paths, f64_exp2_log2, rn_division):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        ways = GPU_WAYS
    else:
        # the interpreter, and tf32x3_probe's patch of its dot, before triton is imported
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import tf32x3_probe

        ways = [("torch backend, float32", "torch", lambda: None),
                ("kernel, IEEE float32 products", "triton", lambda: tf32x3_probe._use("ieee")),
                ("kernel, tf32x3 emulated", "triton", lambda: tf32x3_probe._use("tf32x3"))]
    swaps = [(f64_exp2_log2, _float64_exp2_log2, ", float64 exp2 and log2"),
             (rn_division, _rn_division, ", division rounded to nearest")]
    if any(on for on, _, _ in swaps):
        if device != "cuda":
            raise SystemExit("--f64-exp2-log2 and --rn-division are for the GPU: the interpreter "
                             "computes with numpy")
        # a fresh Triton cache: its keys do not see the swaps
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
        for on, swap, label in swaps:
            if on:
                swap()
                ways = [(n + (label if b == "triton" else ""), b, f) for n, b, f in ways]
    task, model = _task_and_model(device)
    for path in paths:
        for step, state in torch.load(path)["kept"].items():
            model.load_state_dict(state)
            inputs, targets = _batch(task, step, device)
            print(f"{os.path.basename(path)} step {step}:", flush=True)
            if device == "cuda":
                _report("whole batch", ways, inputs, targets, model)
            _report(f"first {SUB} sequences", ways, inputs[:SUB], targets[:SUB], model)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    on_gpu = sub.add_parser("save")
    on_gpu.add_argument("states_dir")
    on_gpu.add_argument("--runs", type=int, default=2)
    anywhere = sub.add_parser("compare")
    anywhere.add_argument("paths", nargs="+")
    anywhere.add_argument("--f64-exp2-log2", action="store_true")
    anywhere.add_argument("--rn-division", action="store_true")
    args = parser.parse_args()
    if args.mode == "save":
        save(args.states_dir, args.runs)
    else:
        compare(args.paths, args.f64_exp2_log2, args.rn_division)
