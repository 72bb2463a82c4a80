"""Backward scans across chunks: queries first (the queries' gradient and the chunk products'),
then keys first (the keys' and values' gradients) (README.md, "The backward passes")."""

import torch
import triton
import triton.language as tl

from .common import back_across, carry, dummy, logits, query_tile


@triton.jit(do_not_specialize=["N", "C", "NG"])
def cross_q_scan_kernel(
    QS, KC, V, MC, G, LSE, DO, DELTA,
    DQS, DMCP, DGROW, RS,
    N, C, NG, scale,
    D: tl.constexpr, BT: tl.constexpr, QB: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HH16: tl.constexpr,
    ADJ16: tl.constexpr,
):
    # A program owns the tiles of QB query blocks (1 or 2) that start at blocks C + QB g,
    # C + QB (g + NG), ..., those with earlier chunks. Chunks have an even number of blocks,
    # so the blocks of a tile start in one chunk and cross the earlier chunks together (a
    # tile's second block may lie past the end: its rows are masked).
    g = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    Tp = N * BT
    NC = (N + C - 1) // C
    rows = tl.arange(0, QB * BT)  # the tile's rows
    krows = tl.arange(0, BT)  # a key block's rows
    cols = tl.arange(0, D)
    own = bh * NG + g  # this program's slot in the scratch and the partial sums
    # the (batch, head) and the slot go into the pointers: 32-bit offsets within (registers)
    QS += bh * Tp * D
    KC += bh * Tp * D
    V += bh * Tp * D
    DO += bh * Tp * D
    DQS += bh * Tp * D
    MC += bh * NC * D * D
    DMCP += own * NC * D * D
    RS += own * NC * QB * BT * D
    G += bh * Tp
    LSE += bh * Tp
    DELTA += bh * Tp
    DGROW += bh * Tp

    DT = KC.dtype.element_ty
    for ib in range(C + QB * g, N, QB * NG):
        tl.debug_barrier()  # the previous tile's reads of RS are done
        first = (ib // C) * C
        offs_i = ib * BT + rows
        valid = offs_i < Tp
        tile_i = offs_i[:, None] * D + cols[None, :]
        do = tl.load(DO + tile_i, mask=valid[:, None], other=0.0)
        r, delta, lse = query_tile(QS, DELTA, LSE, offs_i, cols, Tp, D)
        if HAS_HH:
            # replay the chunk-level carry of the queries, keeping them at each chunk's end
            for cc in range(0, ib // C):
                c = ib // C - 1 - cc
                tl.store(RS + c * QB * BT * D + rows[:, None] * D + cols[None, :], r.to(RS.dtype.element_ty))
                if c > 0:
                    r = carry(r, MC + c * D * D, cols, D, False, HH16, PREC)
            tl.debug_barrier()
        if QB > 1:
            r = r.to(DT)  # a pair's queries in the data dtype: half the registers
        gq = tl.zeros([QB * BT], dtype=tl.float32)
        if HAS_GATE:
            gq = tl.load(G + offs_i, mask=valid, other=0.0)
        dg_row = tl.zeros([QB * BT], dtype=tl.float32)
        dr = tl.zeros([QB * BT, D], dtype=tl.float32)
        # the earlier chunks, first to last; the work on entering a chunk stays out of the
        # loop over its key blocks, so that the compiler keeps dr out of shared memory there
        for c in range(0, first // C):
            if HAS_HH:
                # entering chunk c: dr is dL/d(queries before it); carry dr across it
                rs_c = RS + c * QB * BT * D
                r = tl.load(rs_c + rows[:, None] * D + cols[None, :]).to(r.dtype)
                if c > 0:
                    # a pair's r is in the data dtype: its float32 slabs come from RS
                    dr = back_across(dr, r, rs_c, rows, DMCP, MC, c, True, cols, D, (D > 64) | (QB > 1), ADJ16,
                                     PREC)
            for jb in range(c * C, c * C + C):
                offs_j = jb * BT + krows
                tile_j = offs_j[:, None] * D + cols[None, :]
                kc = tl.load(KC + tile_j)
                gk = tl.load(G + offs_j) if HAS_GATE else gq
                p = tl.exp2(logits(r, kc, gq, gk, scale, HAS_GATE, PREC) - lse[:, None])
                dp = tl.dot(do, tl.trans(tl.load(V + tile_j)), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dr = tl.dot((ds * scale).to(DT), kc, acc=dr, input_precision=PREC)
                if HAS_GATE:
                    dg_row += tl.sum(ds, 1)
        tl.store(DQS + tile_i, dr, mask=valid[:, None])
        if HAS_GATE:
            tl.store(DGROW + offs_i, tl.load(DGROW + offs_i, mask=valid) + dg_row, mask=valid)


def cross_q_scan(Qs, Kc, V, Mc, G, lse, dO, delta, dGrow, C, NG, QB, scale, adj16, scan, replay_dtype, launch_opts):
    """The queries' side of the pairs of blocks in different chunks of C blocks: (dQs, dMcp), with
    dQs [B, H, Tp, D] (the first chunk's rows neither written nor read) and dMcp the NG programs'
    partial sums of the chunk products' gradient [B, H, NG, NC, D, D] (a stub without w), all
    float32; adds the gate's rows into dGrow [B, H, Tp]. NG programs a head, each with tiles of QB
    query blocks.

    Qs, Kc, V, dO: [B, H, Tp, D]; Mc: the chunks' products [B, H, NC, D, D]; G, lse, delta:
    [B, H, Tp]. scan: the constexprs the scans share (D, BT, HAS_HH, HAS_GATE, PREC, HH16);
    replay_dtype: that of the queries replayed to each chunk's end. Absent inputs are stubs."""
    B, H, Tp, D = Qs.shape
    BT, has_hh = scan["BT"], scan["HAS_HH"]
    N = Tp // BT
    NC = -(-N // C)
    dev = Qs.device
    f32 = dict(dtype=torch.float32, device=dev)
    stub = dummy(dev)
    dQs = torch.empty(B, H, Tp, D, **f32)
    dMcp = torch.zeros(B, H, NG, NC, D, D, **f32) if has_hh else stub
    RSc = torch.empty(B, H, NG, NC, QB * BT, D, dtype=replay_dtype, device=dev) if has_hh else stub
    cross_q_scan_kernel[(NG, B * H)](
        Qs, Kc, V, Mc, G, lse, dO, delta,
        dQs, dMcp, dGrow, RSc,
        N, C, NG, float(scale), QB=QB, ADJ16=adj16, **scan, **launch_opts,
    )
    return dQs, dMcp


@triton.jit(do_not_specialize=["N", "C", "NG"])
def cross_kv_scan_kernel(
    QS, KC, V, MC, G, LSE, DO, DELTA,
    DKC, DV, DGCOL, KS,
    N, C, NG, scale,
    D: tl.constexpr, BT: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HH16: tl.constexpr,
):
    # A program owns the key blocks g, g + NG, ... (those with later chunks).
    g = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    Tp = N * BT
    NC = (N + C - 1) // C
    rows = tl.arange(0, BT)
    cols = tl.arange(0, D)
    own = bh * NG + g
    # the (batch, head) and the slot go into the pointers: 32-bit offsets within (registers)
    QS += bh * Tp * D
    KC += bh * Tp * D
    V += bh * Tp * D
    DO += bh * Tp * D
    DKC += bh * Tp * D
    DV += bh * Tp * D
    MC += bh * NC * D * D
    KS += own * NC * BT * D
    G += bh * Tp
    LSE += bh * Tp
    DELTA += bh * Tp
    DGCOL += bh * Tp

    DT = KC.dtype.element_ty
    for jb in range(g, (NC - 1) * C, NG):
        tl.debug_barrier()  # the previous key block's reads of KS are done
        offs_j = jb * BT + rows
        tile_j = offs_j[:, None] * D + cols[None, :]
        kf = tl.load(KC + tile_j)
        if HAS_HH:
            # the keys carried forward a chunk at a time, kept at each later chunk's start
            kc = kf.to(tl.float32)
            for c in range(jb // C + 1, NC):
                tl.store(KS + c * BT * D + rows[:, None] * D + cols[None, :], kc.to(KS.dtype.element_ty))
                if c < NC - 1:
                    kc = carry(kc, MC + c * D * D, cols, D, True, HH16, PREC)
            tl.debug_barrier()
        v = tl.load(V + tile_j)
        gk = tl.zeros([BT], dtype=tl.float32)
        if HAS_GATE:
            gk = tl.load(G + offs_j)
        dkf = tl.zeros([BT, D], dtype=tl.float32)  # dL/d(the carried keys)
        dv = tl.zeros([BT, D], dtype=tl.float32)
        dg_col = tl.zeros([BT], dtype=tl.float32)
        # the later chunks, last first; the work on entering a chunk stays out of the loop
        # over its query blocks, so that the compiler keeps dkf out of shared memory there
        for cc in range(0, NC - 1 - jb // C):
            c = NC - 1 - cc
            if HAS_HH:
                # entering chunk c from its end: carry dkf back across it
                if c < NC - 1:
                    dkf = carry(dkf, MC + c * D * D, cols, D, False, False, PREC)
                kf = tl.load(KS + c * BT * D + rows[:, None] * D + cols[None, :]).to(DT)
            last = tl.minimum(c * C + C, N) - 1
            for ii in range(0, last + 1 - c * C):  # the chunk's query blocks, last first
                ib = last - ii
                offs_i = ib * BT + rows
                tile_i = offs_i[:, None] * D + cols[None, :]
                qs = tl.load(QS + tile_i)
                gq = tl.load(G + offs_i) if HAS_GATE else gk
                # P and dS transposed (keys by queries), as the products with dO and qs take
                # them: no transpose of a register tile (the gates' signs turn with it)
                pt = tl.exp2(logits(kf, qs, -gk, -gq, scale, HAS_GATE, PREC) - tl.load(LSE + offs_i)[None, :])
                do = tl.load(DO + tile_i)
                dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
                dst = pt * (dpt - tl.load(DELTA + offs_i)[None, :])
                dv = tl.dot(pt.to(DT), do, acc=dv, input_precision=PREC)
                dkf = tl.dot((dst * scale).to(DT), qs, acc=dkf, input_precision=PREC)
                if HAS_GATE:
                    dg_col -= tl.sum(dst, 1)
        tl.store(DKC + tile_j, dkf)
        tl.store(DV + tile_j, tl.load(DV + tile_j) + dv)
        if HAS_GATE:
            tl.store(DGCOL + offs_j, tl.load(DGCOL + offs_j) + dg_col)


def cross_kv_scan(Qs, Kc, V, Mc, G, lse, dO, delta, dV, dGcol, C, NG, scale, scan, replay_dtype, launch_opts):
    """The keys' side of the pairs of blocks in different chunks of C blocks: dKc [B, H, Tp, D],
    float32 (the last chunk's rows neither written nor read); adds the values' gradient into dV
    [B, H, Tp, D] and the gate's columns into dGcol [B, H, Tp]. NG programs a head, each with its
    key blocks, its keys carried to each later chunk's start in replay_dtype. Inputs as
    cross_q_scan's."""
    B, H, Tp, D = Qs.shape
    BT, has_hh = scan["BT"], scan["HAS_HH"]
    N = Tp // BT
    NC = -(-N // C)
    dev = Qs.device
    stub = dummy(dev)
    dKc = torch.empty(B, H, Tp, D, dtype=torch.float32, device=dev)
    KS = torch.empty(B, H, NG, NC, BT, D, dtype=replay_dtype, device=dev) if has_hh else stub
    cross_kv_scan_kernel[(NG, B * H)](
        Qs, Kc, V, Mc, G, lse, dO, delta,
        dKc, dV, dGcol, KS,
        N, C, NG, float(scale), **scan, **launch_opts,
    )
    return dKc
