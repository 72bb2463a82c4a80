"""How much the fwd+bwd ratio ours / fla-core moves from one timing to the next on one machine:
ours and fla-core timed in turn, ROUNDS times, at the shape of each head size where the two are
closest (D = 64, T = 1024; D = 128, T = 16384) and at D = 128, T = 2048.

Run on a GPU from the repository root, with fla-core installed:
`python3 results/kernel/repeat_probe.py > repeat.log`. Each timing is a do_bench median, as in
`pathbench bench kernel`. SHAPES ("D,T,H,B;D,T,H,B") and ROUNDS in the environment replace the
defaults.
"""
import json
import os
import statistics

import torch
from triton.testing import do_bench

from kernel_resources import shapes_from_env
from pathbench.kernels.bench_kernel import _fns, _inputs

SHAPES = shapes_from_env([(64, 1024, 32, 16), (128, 2048, 16, 8), (128, 16384, 16, 1)])
ROUNDS = int(os.environ.get("ROUNDS", "9"))


def main():
    for D, T, H, B in SHAPES:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        calls = {impl: _fns(impl, args, D ** -0.5) for impl in ("ours", "fla")}
        for _, fwd_bwd, _ in calls.values():
            fwd_bwd()  # compile outside the timings
        ms = {impl: [] for impl in calls}
        for _ in range(ROUNDS):
            for impl, (_, fwd_bwd, leaves) in calls.items():
                ms[impl].append(do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median"))
        ratios = [o / f for o, f in zip(ms["ours"], ms["fla"])]
        print(json.dumps({"D": D, "T": T, "H": H, "B": B, "ours_ms": [round(x, 3) for x in ms["ours"]],
                          "fla_ms": [round(x, 3) for x in ms["fla"]], "ratio": [round(x, 4) for x in ratios],
                          "ratio_median": round(statistics.median(ratios), 4)}), flush=True)
        del args, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
