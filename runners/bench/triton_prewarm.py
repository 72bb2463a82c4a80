"""Compile the Triton PaTH kernels' GPU configurations ahead of time, in parallel processes.

`python -m pathbench.runners.bench.triton_prewarm --dims 32 64 128` runs, in one child process per
head size (and gate), a small forward and backward under the first GPU configuration, with
chunks; the compiled kernels land in Triton's on-disk cache, so that the first call of a later
process finds them compiled. Saves minutes of serial compilation on a fresh machine; changes no
result.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

WORKER = """
import dataclasses
import torch
from pathbench.kernels import triton_path as tp
# the first configuration forced, and chunks at any length (head sizes that use them), so that
# every kernel compiles
settings = dataclasses.replace(tp.DEFAULT_SETTINGS, force_fwd_config={fwd}, force_bwd_config={bwd},
                               one_chunk_tokens=0, fwd_one_chunk_tokens=0)
D, dt = {D}, torch.{dtype}
T = 1100
q, k, v = (torch.randn(1, T, 2, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
w = torch.nn.functional.normalize(torch.randn(1, T, 2, D, device="cuda"), dim=-1) if {hh} else None
beta = 2 * torch.rand(1, T, 2, device="cuda") if {hh} else None
lf = torch.nn.functional.logsigmoid(torch.randn(1, T, 2, device="cuda") + 2) if {gate} else None
tp.path_attention_triton(q, k, v, w, beta, lf, settings=settings).float().sum().backward()
torch.cuda.synchronize()
"""


def main(argv=None):
    import torch

    from pathbench.kernels import triton_path as tp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--gate", action="store_true", help="the gated specialisation too")
    args = parser.parse_args(argv)
    jobs = []
    for D in args.dims:
        dtype = getattr(torch, args.dtype)
        fwd, bwd = (tp.DEFAULT_SETTINGS.gpu_configs(kind, D, dtype)[0] for kind in ("fwd", "bwd"))
        for gate in ([False, True] if args.gate else [False]):
            code = WORKER.format(fwd=fwd, bwd=bwd, D=D, dtype=args.dtype, hh=True, gate=gate)
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            jobs.append((f"D={D} fwd={fwd} bwd={bwd} gate={gate}", proc))
    failed = 0
    for name, proc in jobs:
        out, _ = proc.communicate()
        if proc.returncode:
            failed += 1
            last = (out.strip().splitlines() or ["?"])[-1]
            print(f"prewarm {name}: failed: {last[:200]}")
        else:
            print(f"prewarm {name}: compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
