"""Launch settings: every tunable of the kernels in one table (KernelSettings), and the rules that
choose each launch's configuration, chunks and programs from it. README.md ("Design decisions")
has the measurements behind the defaults."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)

Config = tuple[int, int, int]  # (BT, num_warps, num_stages)

# the kernels that work on one block or one chunk at a time: preprocessing and chunk edges
_BLOCK_LOCAL = ("prep_fwd", "prep_bwd", "edges_fwd", "edges_bwd")


@dataclass(frozen=True)
class KernelSettings:
    """The kernels' tunables. Frozen and hashable, so that the configurations chosen on the GPU
    are cached per settings; a variant is dataclasses.replace(DEFAULT_SETTINGS, field=value)."""

    # Under the interpreter (CPU): blocks small enough that short test sequences span several.
    interpret_block: int = 16
    interpret_chunks: tuple[int, ...] = (2,)  # blocks per chunk, level by level (chunk_levels)
    interpret_groups: int = 1  # programs a head in a backward scan that shares its blocks

    # Programs a head at most in one backward scan (num_groups): enough for the keys-first scan
    # at D = 128 (4 warps, two programs an SM) to fill an H200 with 16 heads.
    max_groups: int = 16

    # Chunks on the GPU, in tokens (chunk_levels, forward_chunk). Work within chunks grows with
    # their size, carries across chunks with their number. The backward takes one chunk up to
    # one_chunk_tokens, then chunks of chunk_tokens. From level_chunks of those on, its chunks
    # come in levels, each twice the one inside it, while the sequence holds at least
    # level_chunks of the longest (more than level_chunks from short_level_tokens on: a level's
    # chunk edges walk each chunk's blocks in one program, slow for long chunks). A sequence the
    # levels do not divide takes one level, with chunks of long_chunk_tokens beyond level_chunks
    # chunks. The forward takes one chunk up to fwd_one_chunk_tokens (its scan within a chunk
    # costs less than the backward's, and one chunk spares it the chunk edges), then one level.
    one_chunk_tokens: int = 768
    chunk_tokens: int = 512
    level_chunks: int = 8
    short_level_tokens: int = 2048
    long_chunk_tokens: int = 1024
    fwd_one_chunk_tokens: int = 2048
    # Head sizes and blocks that take chunks; others run as one chunk. In chunks at D = 16 and 32,
    # 16-bit gradients were wrong on the H200; with blocks under 64 tokens triton 3.6 fails to
    # compile edges_fwd_kernel for sm_90 with 16-bit inputs.
    chunked_head_dims: tuple[int, ...] = (64, 128)
    chunked_blocks: tuple[int, ...] = (64,)

    # Head sizes at which a scan takes query blocks two at a time, as one tile of 2 BT rows that
    # shares each key block's loads, partial sums and block product. At D = 64 the forward and the
    # queries-first scan were slower in pairs.
    fwd_pairs: tuple[int, ...] = (128,)
    within_pairs: tuple[int, ...] = (64, 128)
    cross_q_pairs: tuple[int, ...] = (128,)
    # Head sizes whose 16-bit inputs carry the queries' gradient back across blocks and chunks
    # with float16 operands, scaled into its range (back_across): at D = 128 the within-chunk
    # scan's pairs fit an H200's shared memory only so; at D = 64 it was slower.
    half_adjoint_head_dims: tuple[int, ...] = (128,)
    # Head sizes whose 16-bit inputs take float16 operands (tf32's mantissa, twice its rate, half
    # the registers) in the block-local kernels' products, gradients scaled into float16's range.
    # At D = 16 and 32 the preprocessing's outputs were wrong so on the H200.
    half_block_head_dims: tuple[int, ...] = (64, 128)
    # Keep the forward's block-local results (about 2 D + 2 BT floats per token and head, plus
    # D^2 / BT for the block products) for the backward, which otherwise computes them again.
    keep_preprocessing: bool = True

    # GPU launch configurations per pass and head size, tried in order: the first that compiles
    # is kept per kernel specialisation, and one the compiler rejects for lack of shared memory
    # falls through to the next. Blocks of 16 are for sequences of at most 16 tokens (the word
    # problems), which blocks of 32 would leave mostly padding. num_warps and num_stages apply
    # to the scans; the block-local kernels take 8 warps from BT * D = 4096 on, else 4, one
    # stage. No blocks of 128: the preprocessing's shared memory exceeds an H200's. The backward
    # keeps one stage at D <= 32 (two stages hit an illegal memory access on the H200 once).
    gpu_config_table: tuple[tuple[str, int, int, int, int], ...] = (
        # pass, D, BT, num_warps, num_stages
        ("fwd", 16, 64, 4, 1), ("fwd", 16, 32, 4, 1), ("fwd", 16, 16, 4, 1),
        ("fwd", 32, 64, 4, 1), ("fwd", 32, 32, 4, 1), ("fwd", 32, 16, 4, 1),
        ("fwd", 64, 64, 4, 2), ("fwd", 64, 32, 4, 1), ("fwd", 64, 16, 4, 1),
        ("fwd", 128, 64, 8, 2), ("fwd", 128, 32, 4, 1), ("fwd", 128, 16, 4, 1),
        ("bwd", 16, 64, 4, 1), ("bwd", 16, 32, 4, 1), ("bwd", 16, 16, 4, 1),
        ("bwd", 32, 64, 4, 1), ("bwd", 32, 32, 4, 1), ("bwd", 32, 16, 4, 1),
        ("bwd", 64, 64, 4, 1), ("bwd", 64, 32, 4, 1), ("bwd", 64, 16, 4, 1),
        ("bwd", 128, 64, 8, 1), ("bwd", 128, 32, 4, 1), ("bwd", 128, 16, 4, 1),
    )
    # float32 inputs (tests, not speed) where the blocks above do not fit with one stage: the
    # backward at D = 128 in blocks of 64 needs 256 KB of shared memory.
    float32_config_table: tuple[tuple[str, int, int, int, int], ...] = (
        # pass, D, BT, num_warps, num_stages
        ("bwd", 128, 32, 4, 1), ("bwd", 128, 16, 4, 1),
    )
    # Blocks of 64 tokens with 16-bit inputs at the timed head sizes: each kernel's own warps and
    # stages, the fastest per kernel on the H200. Kernels that take pairs, or go in column slabs,
    # were timed in that form; the within-chunk and queries-first scans at D = 128 fit one stage.
    kernel_launch_64: tuple[tuple[int, str, int, int], ...] = (
        # D, kernel, num_warps, num_stages
        (64, "prep_fwd", 4, 2), (64, "fwd", 4, 2), (64, "edges_fwd", 4, 2), (64, "within", 8, 2),
        (64, "cross_q", 4, 3), (64, "cross_kv", 4, 3), (64, "edges_bwd", 4, 2), (64, "prep_bwd", 4, 1),
        (128, "prep_fwd", 4, 1), (128, "fwd", 8, 2), (128, "edges_fwd", 8, 2), (128, "within", 8, 1),
        (128, "cross_q", 8, 1), (128, "cross_kv", 4, 2), (128, "edges_bwd", 8, 1), (128, "prep_bwd", 4, 1),
    )
    # A configuration forced on the forward or the backward instead of the choice above (tests
    # of every configuration, pre-compilation).
    force_fwd_config: Config | None = None
    force_bwd_config: Config | None = None

    def gpu_configs(self, kind: str, D: int, dtype: torch.dtype, T: int | None = None) -> list:
        """The configurations (BT, num_warps, num_stages) tried in order for pass kind ("fwd",
        "bwd") and head size D, and for sequences of T tokens if given."""
        cfgs = self._rows(self.gpu_config_table, kind, D)
        if dtype == torch.float32:  # float32 (tests, not speed): configurations that fit
            cfgs = (self._rows(self.float32_config_table, kind, D)
                    or list(dict.fromkeys((c[0], c[1], 1) for c in cfgs)))
        if T is not None:
            # A block at least twice the sequence is at least half padding, and the block-local
            # work grows as BT^2 D: a 20-token word problem costs less in one block of 32 than 64.
            cfgs = [c for c in cfgs if c[0] < 2 * T] or cfgs[-1:]
        return cfgs

    @staticmethod
    def _rows(table, kind, D) -> list:
        return [tuple(row[2:]) for row in table if row[:2] == (kind, D)]

    def forced_config(self, kind: str) -> Config | None:
        return self.force_fwd_config if kind == "fwd" else self.force_bwd_config

    def kernel_launch_table(self, BT: int, D: int, dtype: torch.dtype) -> dict | None:
        """Each kernel's own (num_warps, num_stages) for these blocks, head size and input dtype,
        or None where the configuration's settings apply."""
        if BT == 64 and dtype != torch.float32:
            return {kernel: (warps, stages) for d, kernel, warps, stages in self.kernel_launch_64 if d == D} or None
        return None

    def launch_options(self, kernel: str, BT: int, D: int, dtype: torch.dtype, num_warps, num_stages) -> dict:
        """Triton launch options of one kernel under the configuration (BT, num_warps, num_stages)."""
        if num_warps is None:  # interpreter: plain launch
            return {}
        table = self.kernel_launch_table(BT, D, dtype)
        if table is not None:
            num_warps, num_stages = table[kernel]
        elif kernel in _BLOCK_LOCAL:
            num_warps, num_stages = (8 if BT * D >= 4096 else 4), 1
        return {"num_warps": num_warps, "num_stages": num_stages}

    def num_groups(self, N: int, BH: int, device: torch.device, num_warps=None) -> int:
        """Programs per (batch, head) in a backward scan that shares out N blocks (or query tiles)
        among them; num_warps is that scan's own launch setting.

        The backward's programs use all registers: one of 8 warps (two of 4) fills an SM. NG is
        the count, at most max_groups, whose programs fill the last wave of SMs best, the smaller
        on a tie: every program keeps a scratch of its carried rows per chunk (and the query scan
        float32 partial sums of dL/dMc), so fewer programs also means less memory.
        """
        if device.type != "cuda":
            return max(1, min(N, self.interpret_groups))
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        slots = sms * max(1, 8 // (num_warps or 8))
        best, best_eff = 1, -1.0
        for ng in range(1, max(1, min(N, self.max_groups)) + 1):
            programs = ng * BH
            waves = -(-programs // slots)
            eff = programs / (waves * slots)
            if eff > best_eff + 0.05:  # a clearly better fill is worth more memory
                best, best_eff = ng, eff
        return best

    def query_blocks(self, kernel: str, D: int, N: int) -> int:
        """Query blocks a program of kernel ("fwd", "within", "cross_q") takes as one tile at head
        size D in a sequence of N blocks: 2 where the kernel's pairs field says so, else 1 (and 1
        for one block, which a pair would pad to twice its rows)."""
        pairs = {"fwd": self.fwd_pairs, "within": self.within_pairs, "cross_q": self.cross_q_pairs}[kernel]
        return 2 if D in pairs and N > 1 else 1

    def half_blocks(self, dtype: torch.dtype, D: int) -> bool:
        """Whether the block-local kernels take float16 operands (HALF) for inputs of dtype (the
        data's, or the block products' for the chunk edges) at head size D: 16-bit ones at
        half_block_head_dims."""
        return dtype != torch.float32 and D in self.half_block_head_dims

    def chunk_levels(self, N: int, BT: int, D: int, device: torch.device, one_chunk_tokens: int) -> tuple:
        """Blocks per chunk, level by level, innermost first: keys and queries cross whole chunks
        in one product each. The within-chunk scan takes the pairs within the innermost chunks;
        the cross-chunk scans of a level take the pairs across its chunks within one chunk of the
        next level (within the sequence, at the last level). One chunk, (N,), up to
        one_chunk_tokens.

        On the GPU, levels double from chunk_tokens while the sequence holds at least
        level_chunks chunks of the longest (more than level_chunks from short_level_tokens on).
        Each chunk of an outer level runs as a sequence of its own (a view), so outer levels whose
        chunks do not divide the sequence go, and so does a level whose chunks span it. On the GPU
        a sequence left with one level of more than level_chunks chunks takes chunks of
        long_chunk_tokens instead (one_level). With several chunks each count is even: the
        queries-first scan may take query blocks two at a time."""
        if device.type != "cuda":
            levels = self.interpret_chunks
        elif N * BT <= one_chunk_tokens or D not in self.chunked_head_dims or BT not in self.chunked_blocks:
            return (N,)
        else:
            levels = (self.chunk_tokens // BT,)
            while levels[-1] * self.level_chunks < N or (
                    levels[-1] * self.level_chunks == N and 2 * levels[-1] * BT <= self.short_level_tokens):
                levels += (2 * levels[-1],)
        if any(outer % inner for inner, outer in zip(levels, levels[1:])):
            raise ValueError(f"chunk levels of {levels} blocks: each must divide the next")
        levels = tuple(C for C in levels if C < N) or (N,)
        while len(levels) > 1 and N % levels[-1]:
            levels = levels[:-1]
        if device.type == "cuda" and len(levels) == 1 and levels[0] < N:
            levels = (self.one_level(N, BT),)
        if levels[0] < N and any(C % 2 for C in levels):
            raise ValueError(f"chunks of {levels} blocks: with several chunks each count must be even")
        return levels

    def forward_chunk(self, N: int, BT: int, D: int, device: torch.device) -> int:
        """Blocks per chunk of the forward: one chunk up to fwd_one_chunk_tokens; on the GPU
        beyond that, one level (one_level), not the backward's levels, in which longer chunks
        slowed the forward. Under the interpreter, the outermost level of interpret_chunks that
        the sequence takes."""
        C = self.chunk_levels(N, BT, D, device, self.fwd_one_chunk_tokens)[-1]
        if C == N or device.type != "cuda":
            return C
        return self.one_level(N, BT)

    def one_level(self, N: int, BT: int) -> int:
        """Blocks per chunk where the chunks on the GPU come in one level: chunk_tokens while the
        sequence holds at most level_chunks of them, long_chunk_tokens beyond."""
        short = self.chunk_tokens // BT
        return short if N <= self.level_chunks * short else self.long_chunk_tokens // BT


DEFAULT_SETTINGS = KernelSettings()

# The configuration chosen for each (settings, kernel specialisation) on the GPU: a cache.
_CHOSEN: dict = {}


def spec_key(kind, q, has_hh, has_gate, settings: KernelSettings) -> tuple:
    """The kernel specialisation a configuration is chosen for. Its last entry is the sequence
    length up to a power of two and at most the largest block, because short sequences take
    smaller blocks (gpu_configs)."""
    largest = max(c[0] for c in settings._rows(settings.gpu_config_table, kind, q.shape[-1]))
    length = min(1 << (q.shape[1] - 1).bit_length(), largest)
    return (kind, q.shape[-1], q.dtype, has_hh, has_gate, q.device.index, length)


def with_fallback(kind: str, q, has_hh: bool, has_gate: bool, settings: KernelSettings, launch):
    """Run launch(BT, num_warps, num_stages) for pass kind ("fwd", "bwd") on inputs like q: under
    the interpreter's block on the CPU; on the GPU under the forced configuration, or the one
    chosen before for this specialisation, or else the first of gpu_configs that compiles."""
    if q.device.type != "cuda":
        return launch(settings.interpret_block, None, None)
    if settings.forced_config(kind) is not None:
        return launch(*settings.forced_config(kind))
    key = (settings, spec_key(kind, q, has_hh, has_gate, settings))
    if key in _CHOSEN:
        return launch(*_CHOSEN[key])
    last = None
    for cfg in settings.gpu_configs(kind, q.shape[-1], q.dtype, key[1][-1]):
        try:
            result = launch(*cfg)
        except Exception as exc:  # triton's OutOfResources; anything else is re-raised
            if "out of resource" not in str(exc).lower():
                raise
            last = exc
            continue
        _CHOSEN[key] = cfg
        return result
    raise last


def chosen_configs(settings: KernelSettings | None = None) -> dict:
    """The configuration (BT, num_warps, num_stages) chosen so far for each kernel specialisation
    (spec_key) under settings (the default if None)."""
    settings = DEFAULT_SETTINGS if settings is None else settings
    return {key: cfg for (s, key), cfg in _CHOSEN.items() if s == settings}
