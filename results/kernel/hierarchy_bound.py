"""What a backward without the within-chunk scan could buy at best, counted from measured times.

The within-chunk scan is the slow way to cover a pair of blocks: it carries the queries across
every block and reads back float32 sums per pair, where the cross-chunk scans carry them once a
chunk and hold their tiles' gradients in registers. A hierarchy of chunks (units of 2, 4, 8, ...
blocks, each query block crossing one unit a level) would hand every pair to scans of the
cross-chunk kind. This counts the most that could buy: in the backward every pair of blocks (the
diagonal ones too) at the cross-chunk scans' measured cost a pair, the forward scan at its time
without the Householder part (no carries at all), and the block-local kernels, the chunk edges
and the torch operations at their measured times. A real hierarchy would add chunk edges at
every level and carries in the forward; none are counted, so each row is a lower bound on its
fwd+bwd.

Reads `resources.log` (each kernel's ms in one fwd+bwd) and `kernel_bench.csv` (the benchmark's
fwd+bwd medians, which the targets are judged on), both of one run, and `modes.log` (the forward
scan as plain softmax, on an earlier kernel: the same forward but in one chunk up to 4096 tokens);
runs on any machine:
`python3 results/kernel/hierarchy_bound.py > results/kernel/hierarchy_bound.log`.
"""
import csv
import json
from pathlib import Path

import torch

from pathbench.kernels.triton_path import ONE_CHUNK_TOKENS, _chunk_levels

HERE = Path(__file__).parent
BT = 64  # the block of every timed shape


def benchmark_ms() -> dict:
    """(D, T) -> {impl: fwd+bwd ms} from the benchmark's CSV."""
    ms = {}
    with open(HERE / "kernel_bench.csv") as f:
        for row in csv.DictReader(f):
            if row["mode"] == "fwd+bwd":
                ms.setdefault((int(row["D"]), int(row["T"])), {})[row["impl"]] = float(row["ms"])
    return ms


def log_rows(name: str) -> list:
    """The JSON rows of a probe's log (its other lines are warnings and headers)."""
    return [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.startswith("{")]


def softmax_forward_ms() -> dict:
    """(D, T) -> the forward scan's ms with no Householder part."""
    return {(run["D"], run["T"]): run["kernel_ms"]["fwd"] for run in log_rows("modes.log") if run["way"] == "softmax"}


def block_pairs(T: int, D: int) -> tuple:
    """(all pairs of blocks J <= I, those the within-chunk scan covers)."""
    N = T // BT
    C = _chunk_levels(N, BT, D, torch.device("cuda"), ONE_CHUNK_TOKENS)[0]
    chunks = [min(C, N - first) for first in range(0, N, C)]
    return N * (N + 1) // 2, sum(n * (n + 1) // 2 for n in chunks)


def main():
    bench = benchmark_ms()
    forward_floor = softmax_forward_ms()
    print("| D | T | block pairs within chunks | block-local + torch ms | scans ms | "
          "scans at best ms | fwd+bwd at best ms | at best / SDPA | now / SDPA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in log_rows("resources.log"):
        D, T = run["D"], run["T"]
        ms = {name: kernel["ms"] for name, kernel in run["kernels"].items()}
        pairs, within = block_pairs(T, D)
        if within == pairs:  # one chunk: no cross-chunk cost to count from
            continue
        block_local = (ms["prep_fwd"] + ms["prep_bwd"] + ms["edges_fwd"] + ms["edges_bwd"]
                       + run["torch_ops_ms"])
        scans = ms["fwd"] + ms["within"] + ms["cross_q"] + ms["cross_kv"]
        scans_best = forward_floor[(D, T)] + (ms["cross_q"] + ms["cross_kv"]) * pairs / (pairs - within)
        at_best = block_local + scans_best
        sdpa, ours = bench[(D, T)]["sdpa"], bench[(D, T)]["ours"]
        print(f"| {D} | {T} | {within / pairs:.1%} | {block_local:.2f} | {scans:.2f} | {scans_best:.2f} | "
              f"{at_best:.2f} | {at_best / sdpa:.2f}x | {ours / sdpa:.2f}x |")


if __name__ == "__main__":
    main()
