"""Does three-pass tf32 explain the kernel's float32 gradient errors? Emulated on the CPU.

On the GPU the kernel's float32 products take three-pass tf32 (`triton_path._prec`); under the
interpreter they are IEEE float32, since the interpreter's `tl.dot` ignores the precision. This
probe patches the interpreter's dot to do what three-pass tf32 does with its operands: split
each into a tf32 part (rounded to 10 mantissa bits, ties away from zero) and the tf32 part of
the rest, and add the three products big x big, big x small and small x big in float32. The
tensor cores' own accumulation is not emulated. It then compares, against the float64
reference on fresh random inputs, the output and the gradients of q, k, v, w, beta (and
log_fgate) for the kernel with IEEE products, the kernel with emulated three-pass tf32
products, and the torch blockwise backend in float32:

    python3 results/kernel/tf32x3_probe.py
"""

import os
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import pathbench.kernels.triton_path as triton_path  # noqa: E402
from pathbench.kernels import path_attention  # noqa: E402
from pathbench.kernels.reference import path_attention_reference  # noqa: E402

_ieee_dot = interpreter.InterpreterBuilder.create_dot
_emulating = False


def _tf32(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _dot(self, a, b, acc, input_precision, max_num_imprecise_acc):
    if not (_emulating and "TF32x3" in str(input_precision) and a.data.dtype == np.float32):
        return _ieee_dot(self, a, b, acc, input_precision, max_num_imprecise_acc)
    a_big, b_big = _tf32(a.data), _tf32(b.data)
    a_small, b_small = _tf32(a.data - a_big), _tf32(b.data - b_big)
    small = np.matmul(a_small, b_big) + np.matmul(a_big, b_small)
    return interpreter.TensorHandle(np.matmul(a_big, b_big) + small + acc.data, acc.dtype.scalar)


interpreter.InterpreterBuilder.create_dot = _dot


def _use(precision):
    global _emulating
    _emulating = precision == "tf32x3"
    for choice in ("_prec", "_xprec", "_hprec"):
        setattr(triton_path, choice, lambda dtype, device: precision)


def _relative(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def compare(D, seed, gate=False, beta_near_2=False, qk_times=1.0, B=1, T=300, H=2):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, w, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(5))
    q, k, w = q * qk_times, k * qk_times, F.normalize(w, dim=-1)
    beta = 2.0 - 1e-3 * torch.rand(B, T, H, generator=gen, dtype=torch.float64) if beta_near_2 \
        else 2.0 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    inputs = [q, k, v, w, beta]
    if gate:
        inputs.append(F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 3))

    def output_and_grads(attention, dtype):
        xs = [x.to(dtype).requires_grad_() for x in inputs]
        out = attention(*xs[:5], log_fgate=xs[5] if gate else None)
        return [out.detach()] + list(torch.autograd.grad(out, xs, do.to(dtype)))

    ref = output_and_grads(path_attention_reference, torch.float64)
    print(f"D = {D}, seed {seed}{', gate' if gate else ''}{', beta within 1e-3 of 2' if beta_near_2 else ''}"
          f"{f', q and k times {qk_times:g}' if qk_times != 1 else ''}: relative errors of the output; "
          f"gradients of q, k, v, w, beta{', log_fgate' if gate else ''}", flush=True)
    for name, backend, precision in (("kernel, IEEE products", "triton", "ieee"),
                                     ("kernel, tf32x3 emulated", "triton", "tf32x3"),
                                     ("torch backend, float32", "torch", "ieee")):
        _use(precision)
        start = time.time()
        got = output_and_grads(lambda *a, **kw: path_attention(*a, **kw, backend=backend), torch.float32)
        errors = [_relative(x, r) for x, r in zip(got, ref)]
        print(f"  {name:24s} {errors[0]:.1e};  " + " ".join(f"{e:.1e}" for e in errors[1:])
              + f"  ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    compare(64, 0)
    compare(128, 1)
    compare(64, 2, gate=True)
    compare(64, 3, beta_near_2=True)
    compare(64, 4, qk_times=4.0)
    compare(128, 5, beta_near_2=True, qk_times=4.0)
