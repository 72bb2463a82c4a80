"""Whether two versions of kernels/triton_path.py give bitwise-equal outputs and gradients on the GPU.

Run from the repository root: `python3 results/kernel/same_gradients_probe.py OLD.py`, where
OLD.py is another version of the file (for instance `git show REV:kernels/triton_path.py`).
For D = 64 and 128, q/k/v in bfloat16 and float32, with and without the gate, at 4096 tokens
(chunks of 512) and 1024 (one chunk), it prints whether the output and each gradient are equal
bit for bit, and a checksum of a torch.randn draw on the GPU (the same in every process when the
default generator's seed is fixed).
"""
import importlib.util
import sys

import torch

from pathbench.kernels import triton_path as new

spec = importlib.util.spec_from_file_location("old_triton_path", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
print("randn checksum on the GPU:", torch.randn(1000, device="cuda", dtype=torch.float64).sum().item())


def inputs(B, T, H, D, dtype):
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1)
    beta = 2.0 * torch.rand(B, T, H, device="cuda", generator=gen)
    log_fgate = -torch.rand(B, T, H, device="cuda", generator=gen)
    dout = torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype)
    return [q, k, v, w, beta, log_fgate], dout


for D in (64, 128):
    for dtype in (torch.bfloat16, torch.float32):
        for gate in (True, False):
            for T in (4096, 1024):
                args, dout = inputs(2, T, 4, D, dtype)
                if not gate:
                    args[5] = None
                results = []
                for module in (new, old):
                    leaves = [x.clone().requires_grad_(True) if x is not None else None for x in args]
                    out = module.path_attention_triton(*leaves)
                    grads = torch.autograd.grad(out, [x for x in leaves if x is not None], dout)
                    results.append([out, *grads])
                same = [torch.equal(a, b) for a, b in zip(*results)]
                print(f"D={D:<4} {str(dtype):15s} gate={gate!s:5s} T={T:<5} output and gradients equal: {same}",
                      flush=True)
