"""Launch settings: the tunables, and the rules that choose each launch's configuration, chunks
and programs from them."""

from __future__ import annotations

import torch

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)

# Interpreter (CPU) settings: small blocks so short test sequences span several of them.
# Tests change these to exercise the GPU's block size and several backward programs per head.
INTERPRET_BLOCK = 16
INTERPRET_CHUNKS = (2,)  # blocks per chunk, level by level (chunk_levels)
INTERPRET_GROUPS = 1
# Programs a head at most in one backward scan (num_groups). 16 lets the keys-first scan at
# D = 128 (4 warps, two programs an SM) fill an H200 with 16 heads: at 16384 tokens it went from
# 9.07 to 5.61 ms with 16 programs a head instead of 8 (results/kernel/variants_groups.log).
MAX_GROUPS = 16
# Tokens a chunk spans on the GPU. Work within chunks grows with their size, carries across
# chunks with their number; fwd+bwd on the H200 (results/kernel/chunk_probe.log,
# chunk_probe_groups.log, and on the final kernel chunk_probe_sizes.log, chunk_probe_d128.log and
# chunk_probe_short.log) was fastest with one chunk up to ONE_CHUNK_TOKENS, chunks of
# CHUNK_TOKENS up to 4096 tokens, and, in one level, chunks of 1024 beyond. At 1024 tokens chunks
# of 512 took 5.33 against 5.59 ms in one chunk at D = 64, and 6.46 against 6.57 at D = 128
# (1700 MB against 1507, below fla-core's 1714); at 768 tokens one chunk was level at D = 64 and
# the fastest at D = 128 (the training shape). Under the levels below, an innermost level of 256
# tokens cut the within-chunk scan by 35% to 41% but cost more in its chunk edges and cross-chunk
# scans: 11.82 -> 11.87 ms at D = 64, T = 8192 and 10.60 -> 10.88 at D = 128, T = 4096
# (results/kernel/variants_chunk256.log).
ONE_CHUNK_TOKENS = 768
CHUNK_TOKENS = 512
# From LEVEL_CHUNKS chunks of CHUNK_TOKENS the backward's chunks come in levels (chunk_levels):
# chunks of CHUNK_TOKENS crossed inside chunks twice as long, and so on, until the sequence holds
# fewer than LEVEL_CHUNKS of the longest (at most LEVEL_CHUNKS once they are SHORT_LEVEL_TOKENS
# long), which are crossed across the sequence: (512, 1024) tokens from 4096 up to 8191, (512,
# 1024, 2048) from 8192 up to 16384, (512, ..., 4096) up to 32768. The within-chunk scan takes
# chunks of CHUNK_TOKENS at every length. On the H200, against chunks of 1024 in one level
# (results/kernel/variants_levels.log), fwd+bwd went from 12.44 to 12.04 ms at D = 64, T = 8192
# with two levels and from 19.19 to 18.18 ms at T = 16384 with three (18.82 with two); at D = 128,
# from 15.08 to 14.89 ms at 8192 and from 22.74 to 21.78 at 16384 (22.56 with two). A level of
# four chunks pays while they are short (results/kernel/variants_levels_more.log): at T = 4096,
# 8.68 -> 8.49 ms at D = 64 and 10.64 -> 10.61 at D = 128 with chunks of 1024 crossed in four; at
# 8192, 11.91 -> 11.81 and 14.52 -> 14.45 with chunks of 2048. Four chunks of 4096 tokens made
# T = 16384 slower (17.84 -> 18.13 and 21.09 -> 22.36 ms): a level's chunk edges walk a chunk's
# blocks one after another, one program a chunk (results/kernel/variants_levels_rule.log times
# the rule at 6144, 12288 and 32768 tokens too).
LEVEL_CHUNKS = 8
SHORT_LEVEL_TOKENS = 2048
# The forward's chunks beyond LEVEL_CHUNKS chunks of CHUNK_TOKENS, and the backward's where its
# levels do not divide the sequence (one level; chunks of CHUNK_TOKENS took 12.85 against 12.44
# ms at D = 64, T = 8192, chunk_probe_sizes.log).
LONG_CHUNK_TOKENS = 1024
# The forward alone takes one chunk up to FWD_ONE_CHUNK_TOKENS: its scan within a chunk costs
# less than the backward's, and one chunk spares it the chunk edges (the backward computes its
# own chunk edges, so the two may chunk differently). On the H200 (results/kernel/fwd_chunk_probe.log)
# one chunk took the forward at 2048 tokens in 1.22 ms against 1.30 in chunks at D = 64, and 1.35
# against 1.42 at D = 128; at 4096 tokens chunks took 1.82 against 1.94 ms at D = 128 and were
# level at D = 64 (1.76 against 1.74, within the two passes' spread of 2.2%).
FWD_ONE_CHUNK_TOKENS = 2048
# Per scan, the head sizes at which it takes query blocks two at a time, as one tile of 2 BT
# rows. The forward's and the within-chunk scan's pair walks the earlier blocks of its chunk
# together once its second block has crossed the first: a pair shares each key block's loads,
# partial sums and block product. The queries-first scan's pair crosses the earlier chunks
# together. On the H200 (results/kernel/variants_*.log; 16K tokens of 16 heads at D = 128, of
# 32 at D = 64): the within-chunk scan went from 6.56 to 3.63 ms at D = 128 (chunks of 1024
# tokens) and from 2.96 to 2.84 ms at D = 64; the forward from 4.88 to 3.48 ms at D = 128 and
# 16384 tokens, but from 3.79 to 5.11 ms at D = 64; the queries-first scan, then in one loop,
# from 11.50 to 8.60 ms at D = 128, but from 5.31 to 7.39 ms at D = 64.
QUERY_PAIRS = {"fwd": (128,), "within": (64, 128), "cross_q": (128,)}
# Head sizes whose 16-bit inputs carry the queries' gradient back across blocks and chunks with
# float16 operands (scaled) instead of tf32 (back_across). At D = 128 that lets the within-chunk
# scan take pairs: 144 KB of shared memory against 272 KB (sm_90, triton 3.9), more than an
# H200 has. At D = 64 it made the queries-first scan slower, 5.07 ms against 4.32 at 16384 tokens.
HALF_ADJOINT_HEAD_DIMS = (128,)
# Head sizes whose 16-bit inputs take float16 operands, tf32's mantissa at twice its rate and in
# half the registers, in the block-local kernels' products: the preprocessing after its
# inversion, its backward and the chunk edges' backward (gradients scaled into float16's range,
# scaled), and the chunk edges' forward. The chunk edges then hold the whole head, so that the
# backward reads and writes each block's dL/dM once a side, not once a column slab. On the H200,
# for 16K tokens of 16 heads at D = 128 and of 32 at D = 64 (results/kernel/variants_half.log,
# variants_half2.log, variants_half3.log): the preprocessing backward 2.59 -> 2.04 ms at
# D = 128 and 2.33 -> 1.77 at D = 64; the chunk edges' backward 1.88 -> 1.70 -> 0.99 ms (whole
# head) at D = 128; their forward 0.84 -> 0.55 ms at D = 128 and 16384 tokens; the
# preprocessing 0.65 -> 0.49 ms at D = 128 and 0.72 -> 0.57 at D = 64. At D = 16 and 32 the
# preprocessing gave wrong outputs on the H200 with float16 operands (triton 3.6,
# gpu_tests_half_d16_d32.log).
HALF_BLOCK_HEAD_DIMS = (64, 128)
# Head sizes whose chunked path passed the GPU tests in 16-bit; smaller heads run as one chunk.
# At D = 32, in chunks on the H200, the keys-first scan gave wrong gradients or an illegal
# memory access with 16-bit inputs under its launch setting (4 warps, one stage), not with 8
# warps or two stages. With 8 warps there, bfloat16 passed the GPU tests at D = 16 and 32, but
# float16 did not: the gradients of q, w, beta and the gate were 4e-2 to 0.6 off at D = 32 under
# every setting tried (or NaN), and up to 5e-2 at D = 16. float32 in chunks at D = 32, and the
# interpreter, are exact (results/kernel/d32.log, chunk16.log).
CHUNKED_HEAD_DIMS = (64, 128)
# Block sizes that use chunks. Smaller blocks (the fallback configurations, and float32's
# backward at D = 128) run as one chunk: with them triton 3.6 fails to compile edges_fwd_kernel
# for sm_90 for 16-bit inputs (TritonGPUPrefetch pass); float32 compiles, and its chunks are
# tested there.
CHUNKED_BLOCKS = (64,)
# keep the forward's block-local results (moved queries and keys, block products, intra-block
# logits and block inverses: about 2 D + 2 BT floats per token and head, plus D^2 / BT in the
# products) for the backward, which otherwise computes them again
KEEP_PREPROCESSING = True

# GPU launch configurations (BT, num_warps, num_stages) of the forward and the backward, per
# head size: the first that compiles is kept per kernel specialisation; one the compiler rejects
# for lack of shared memory falls through to the next. num_warps and num_stages apply to the
# scans; the block-local kernels (preprocessing, chunk edges) take 8 warps from BT * D = 4096 on,
# else 4, with one stage. Blocks of 128 are not offered: the preprocessing kernels' shared memory
# exceeds an H200's there. The backward keeps one stage at D <= 32 (two stages hit an illegal
# memory access on the H200 in an earlier version, with a kernel that took query blocks two at a
# time).
_GPU_CONFIGS = {
    "fwd": {16: [(64, 4, 1), (32, 4, 1)],
            32: [(64, 4, 1), (32, 4, 1)],
            64: [(64, 4, 2), (32, 4, 1)],
            128: [(64, 8, 2), (32, 4, 1)]},
    "bwd": {16: [(64, 4, 1), (32, 4, 1)],
            32: [(64, 4, 1), (32, 4, 1)],
            64: [(64, 4, 1), (32, 4, 1)],
            128: [(64, 8, 1), (32, 4, 1), (16, 4, 1)]},
}
# float32 inputs, backward at D=128: the 64-token block needs 256 KB of shared memory
_FLOAT32_CONFIGS = {("bwd", 128): [(32, 4, 1), (16, 4, 1)]}
# Blocks of 64 tokens with 16-bit inputs at D = 64 and 128, the shapes that are timed: each
# kernel's own (num_warps, num_stages), the fastest of (8, 1), (4, 2), (8, 2) and (4, 3) per
# kernel on the H200 (results/kernel/launch.log); the within-chunk backward at D = 128 fits
# only one stage. The preprocessing backward, since it runs in three parts, takes (4, 1): 3.83 ms
# against 3.96 with (8, 1) at D = 128, and 2.28 against 2.29 with (4, 2) at D = 64, for 16K tokens
# of 16 and 32 heads (results/kernel/variants.log); in column slabs still (4, 1): 2.70 ms against
# 3.71 with (8, 1) at D = 128, 2.44 against 3.54 at D = 64 (variants_prep2.log). The
# preprocessing forward, in column slabs, takes (4, 1) at D = 128: 0.65 ms against 1.07 with
# (8, 1). The queries-first scan at D = 128, which takes query blocks in pairs there, fits only
# one stage. Kernels that take query blocks in pairs
# (QUERY_PAIRS) were timed again with them (variants_within.log, variants_fwd_pairs.log): the
# within-chunk scan at D = 64 with (8, 2), 2.84 ms against 3.32 with (8, 1) and 4.04 with (4, 2),
# for 16K tokens of 32 heads; the forward at D = 128 with (8, 2), 3.48 ms against 3.82 with
# (8, 1) at 16384 tokens of 16 heads. With as many programs as 4-warp scans fill (num_groups),
# single blocks with 4 warps at D = 128 stayed slower (variants_launch128.log, 16K tokens of 16
# heads): the queries-first scan 1.83 ms with (4, 2) against 1.74 in pairs at 4096 tokens, the
# within-chunk scan 4.76 with (4, 1) against 3.64 in pairs at 1024. The chunk edges' forward at
# D = 128, over the whole head with float16 operands (HALF_BLOCK_HEAD_DIMS), takes (8, 2): 0.55 ms
# against 0.62 with (8, 1) and 0.98 with (4, 2) at 16384 tokens (variants_half3.log).
_KERNEL_LAUNCH_64 = {
    64: {"prep_fwd": (4, 2), "fwd": (4, 2), "edges_fwd": (4, 2), "within": (8, 2),
         "cross_q": (4, 3), "cross_kv": (4, 3), "edges_bwd": (4, 2), "prep_bwd": (4, 1)},
    128: {"prep_fwd": (4, 1), "fwd": (8, 2), "edges_fwd": (8, 2), "within": (8, 1),
          "cross_q": (8, 1), "cross_kv": (4, 2), "edges_bwd": (8, 1), "prep_bwd": (4, 1)},
}
_BLOCK_LOCAL = ("prep_fwd", "prep_bwd", "edges_fwd", "edges_bwd")
FORCE_CONFIG: dict = {}  # kind -> (BT, num_warps, num_stages); used to pre-compile configurations
_CHOSEN: dict = {}


def _is_out_of_resources(exc: Exception) -> bool:
    return "out of resource" in str(exc).lower()


def gpu_configs(kind: str, D: int, dtype: torch.dtype, T: int | None = None) -> list:
    """The configurations (BT, num_warps, num_stages) tried in order for kind and head size D,
    and for sequences of T tokens if given."""
    cfgs = _GPU_CONFIGS[kind][D]
    if dtype == torch.float32:  # float32 (tests, not speed): configurations that fit
        cfgs = _FLOAT32_CONFIGS.get((kind, D)) or list(dict.fromkeys((c[0], c[1], 1) for c in cfgs))
    if T is not None:
        # A block at least twice the sequence is at least half padding, and the block-local
        # work grows as BT^2 D: a 20-token word problem costs less in one block of 32 than 64.
        cfgs = [c for c in cfgs if c[0] < 2 * T] or cfgs[-1:]
    return cfgs


def spec_key(kind, q, has_hh, has_gate):
    """The kernel specialisation a configuration is chosen for. Its last entry is the sequence
    length up to a power of two and at most the largest block, because short sequences take
    smaller blocks (gpu_configs)."""
    largest = max(c[0] for c in _GPU_CONFIGS[kind][q.shape[-1]])
    length = min(1 << (q.shape[1] - 1).bit_length(), largest)
    return (kind, q.shape[-1], q.dtype, has_hh, has_gate, q.device.index, length)


def with_fallback(kind: str, key: tuple, D: int, device: torch.device, launch):
    """Run launch(BT, num_warps, num_stages) under the configuration chosen for key."""
    if device.type != "cuda":
        return launch(INTERPRET_BLOCK, None, None)
    if kind in FORCE_CONFIG:
        return launch(*FORCE_CONFIG[kind])
    if key in _CHOSEN:
        return launch(*_CHOSEN[key])
    last = None
    for cfg in gpu_configs(kind, D, key[2], key[-1]):
        try:
            result = launch(*cfg)
        except Exception as exc:  # triton's OutOfResources; anything else is re-raised
            if not _is_out_of_resources(exc):
                raise
            last = exc
            continue
        _CHOSEN[key] = cfg
        return result
    raise last


def kernel_launch_table(BT: int, D: int, dtype: torch.dtype) -> dict | None:
    """Each kernel's own (num_warps, num_stages) for these blocks, head size and input dtype, or
    None where the configuration's settings apply."""
    if BT == 64 and dtype != torch.float32:
        return _KERNEL_LAUNCH_64.get(D)
    return None


def launch_options(kernel: str, BT: int, D: int, dtype: torch.dtype, num_warps, num_stages) -> dict:
    """Triton launch options of one kernel under the configuration (BT, num_warps, num_stages)."""
    if num_warps is None:  # interpreter: plain launch
        return {}
    table = kernel_launch_table(BT, D, dtype)
    if table is not None:
        num_warps, num_stages = table[kernel]
    elif kernel in _BLOCK_LOCAL:
        num_warps, num_stages = (8 if BT * D >= 4096 else 4), 1
    return {"num_warps": num_warps, "num_stages": num_stages}


def num_groups(N: int, BH: int, device: torch.device, num_warps=None) -> int:
    """Programs per (batch, head) in a backward scan that shares out N blocks (or query tiles)
    among them; num_warps is that scan's own launch setting.

    The backward's programs use all registers: one of 8 warps (two of 4) fills an SM. NG is
    the count, at most MAX_GROUPS, whose programs fill the last wave of SMs best, the smaller
    on a tie: every program keeps a scratch of its carried rows per chunk (and the query scan
    float32 partial sums of dL/dMc), so fewer programs also means less memory.
    """
    if device.type != "cuda":
        return max(1, min(N, INTERPRET_GROUPS))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    slots = sms * max(1, 8 // (num_warps or 8))
    best, best_eff = 1, -1.0
    for ng in range(1, max(1, min(N, MAX_GROUPS)) + 1):
        programs = ng * BH
        waves = -(-programs // slots)
        eff = programs / (waves * slots)
        if eff > best_eff + 0.05:  # a clearly better fill is worth more memory
            best, best_eff = ng, eff
    return best


def query_blocks(kernel: str, D: int) -> int:
    """Query blocks a program of kernel ("fwd", "within", "cross_q") takes as one tile at head
    size D: 2 where QUERY_PAIRS says so, else 1."""
    return 2 if D in QUERY_PAIRS[kernel] else 1


def half_blocks(dtype: torch.dtype, D: int) -> bool:
    """Whether the block-local kernels take float16 operands (HALF) for inputs of dtype (the data's,
    or the block products' for the chunk edges) at head size D: 16-bit ones at HALF_BLOCK_HEAD_DIMS."""
    return dtype != torch.float32 and D in HALF_BLOCK_HEAD_DIMS


def chunk_levels(N: int, BT: int, D: int, device: torch.device, one_chunk_tokens: int) -> tuple:
    """Blocks per chunk, level by level, innermost first: keys and queries cross whole chunks in
    one product each. The within-chunk scan takes the pairs within the innermost chunks; the
    cross-chunk scans of a level take the pairs across its chunks within one chunk of the next
    level (within the sequence, at the last level). One chunk, (N,), up to one_chunk_tokens.

    On the GPU, levels double from CHUNK_TOKENS while the sequence holds at least LEVEL_CHUNKS
    chunks of the longest (more than LEVEL_CHUNKS from SHORT_LEVEL_TOKENS on). Each chunk of an
    outer level runs as a sequence of its own (a view), so outer levels whose chunks do not divide
    the sequence go, and so does a level whose chunks span it. On the GPU a sequence left with one
    level of more than LEVEL_CHUNKS chunks takes chunks of LONG_CHUNK_TOKENS instead (one_level).
    With several chunks each count is even: the queries-first scan may take query blocks two at a
    time."""
    if device.type != "cuda":
        levels = INTERPRET_CHUNKS
    elif N * BT <= one_chunk_tokens or D not in CHUNKED_HEAD_DIMS or BT not in CHUNKED_BLOCKS:
        return (N,)
    else:
        levels = (CHUNK_TOKENS // BT,)
        while levels[-1] * LEVEL_CHUNKS < N or (
                levels[-1] * LEVEL_CHUNKS == N and 2 * levels[-1] * BT <= SHORT_LEVEL_TOKENS):
            levels += (2 * levels[-1],)
    if any(outer % inner for inner, outer in zip(levels, levels[1:])):
        raise ValueError(f"chunk levels of {levels} blocks: each must divide the next")
    levels = tuple(C for C in levels if C < N) or (N,)
    while len(levels) > 1 and N % levels[-1]:
        levels = levels[:-1]
    if device.type == "cuda" and len(levels) == 1 and levels[0] < N:
        levels = (one_level(N, BT),)
    if levels[0] < N and any(C % 2 for C in levels):
        raise ValueError(f"chunks of {levels} blocks: with several chunks each count must be even")
    return levels


def forward_chunk(N: int, BT: int, D: int, device: torch.device) -> int:
    """Blocks per chunk of the forward: one chunk up to FWD_ONE_CHUNK_TOKENS; on the GPU beyond
    that, chunks of CHUNK_TOKENS while the sequence holds at most LEVEL_CHUNKS of them and of
    LONG_CHUNK_TOKENS beyond, not the backward's levels. Longer chunks slowed the forward: 3.28
    against 3.20 ms at D = 128, T = 16384, in chunks of 2048 tokens against 1024; at 4096 tokens,
    1.83 against 1.81 in chunks of 1024 against 512 (results/kernel/variants_levels.log,
    variants_levels_more.log). Under the interpreter, the outermost level of INTERPRET_CHUNKS that
    the sequence takes."""
    C = chunk_levels(N, BT, D, device, FWD_ONE_CHUNK_TOKENS)[-1]
    if C == N or device.type != "cuda":
        return C
    return one_level(N, BT)


def one_level(N: int, BT: int) -> int:
    """Blocks per chunk where the chunks on the GPU come in one level: CHUNK_TOKENS while the
    sequence holds at most LEVEL_CHUNKS of them, LONG_CHUNK_TOKENS beyond."""
    return CHUNK_TOKENS // BT if N <= LEVEL_CHUNKS * (CHUNK_TOKENS // BT) else LONG_CHUNK_TOKENS // BT


def chosen_configs() -> dict:
    """The configuration (BT, num_warps, num_stages) chosen so far for each kernel specialisation
    (spec_key)."""
    return dict(_CHOSEN)
