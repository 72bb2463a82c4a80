"""Ours against SDPA at lengths the benchmark does not take (output: lengths.log): lengths whose
blocks the backward's levels of chunks do not divide, beside lengths they do, and lengths beyond
32768 tokens. First the levels of chunks (blocks of 64 tokens) the backward takes at each shape and
the forward's chunk, then `pathbench bench kernel`'s rows (bfloat16, no gate) and its tables, ours
against SDPA, launched and in a CUDA graph.

Run on a GPU from the repository root: `python3 results/kernel/lengths_probe.py > lengths.log`.
"""
import math

import torch

from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _table, run_bench

BLOCK = 64
SHAPES = [(64, 4096, 32, 4), (64, 8192, 32, 2), (64, 8704, 32, 2), (64, 10000, 32, 1), (64, 12288, 32, 1),
          (64, 16384, 32, 1), (64, 32768, 32, 1), (64, 65536, 32, 1),
          (128, 4096, 16, 4), (128, 8192, 16, 2), (128, 8704, 16, 2), (128, 16384, 16, 1), (128, 24576, 16, 1),
          (128, 32768, 16, 1), (128, 65536, 16, 1)]


def main():
    cuda = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for D, T, H, B in SHAPES:
        N = math.ceil(T / BLOCK)
        levels = tp._chunk_levels(N, BLOCK, D, cuda, tp.ONE_CHUNK_TOKENS)
        fwd_chunk = tp._forward_chunk(N, BLOCK, D, cuda)
        print(f"D={D} T={T} H={H} B={B}: backward's levels (tokens) {[C * BLOCK for C in levels]}, "
              f"forward's chunk {fwd_chunk * BLOCK}", flush=True)
    rows = run_bench(SHAPES, ("ours", "sdpa"), echo=lambda line: print(line, flush=True))
    print("\nlaunched:\n" + _table(rows) + "\n\nin a CUDA graph:\n" + _table(rows, "graph_ms"))


if __name__ == "__main__":
    main()
