"""The GPU's time a call, without the host's: ours and fla-core timed in turn, each call replayed
from a CUDA graph (as the suite's training runs), beside the do_bench reading that
`pathbench bench kernel` reports, at the training shapes where the host bounds that reading, and
at D = 64, T = 1024, where it does not. fla-core is left out at D = 32: it fails there with a
device-side assertion, which would end the process's use of the GPU.

Run on a GPU from the repository root, with fla-core installed:
`python3 results/kernel/graph_probe.py > graph.log`. do_bench clears the L2 cache before each
call; do_bench_cudagraph replays calls back to back without clearing it. SHAPES
("D,T,H,B;D,T,H,B") and ROUNDS in the environment replace the defaults.
"""
import json
import os
import statistics

import torch

from kernel_resources import shapes_from_env
from pathbench.kernels.bench_kernel import _fns, _inputs, _times

SHAPES = shapes_from_env([(128, 768, 2, 32), (32, 512, 2, 64), (64, 1024, 32, 16)])
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def timings(fwd, fwd_bwd, leaves):
    """do_bench and CUDA-graph medians (ms) of the forward and of fwd+bwd."""
    out = {}
    for name, fn, grads in (("fwd", fwd, None), ("fwd_bwd", fwd_bwd, leaves)):
        out[name], out[name + "_graph"] = _times(fn, grads, warmup=25, rep=100)
    return out


def main():
    for D, T, H, B in SHAPES:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        calls = {impl: _fns(impl, args, D ** -0.5) for impl in (("ours",) if D == 32 else ("ours", "fla"))}
        for fwd, fwd_bwd, _ in calls.values():
            fwd(), fwd_bwd()  # compile outside the timings
        ms = {impl: [] for impl in calls}
        for _ in range(ROUNDS):
            for impl, fns in calls.items():
                ms[impl].append(timings(*fns))
        for impl, rounds in ms.items():
            medians = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
            print(json.dumps({"D": D, "T": T, "H": H, "B": B, "impl": impl, **medians,
                              "rounds": [{k: round(v, 3) for k, v in r.items()} for r in rounds]}), flush=True)
        del args, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
