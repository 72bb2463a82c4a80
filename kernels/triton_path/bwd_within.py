"""Backward scan within chunks: the gradients of the pairs of blocks in one chunk, and delta =
rowsum(dO o O) for the other scans (README.md, "The backward passes")."""

import torch
import triton
import triton.language as tl

from .common import back_across, carry, dummy, head_start, load_rows, logits, query_tile, sum_so_far


def within_spans(N: int, C: int, QB: int, NG: int) -> list:
    """The query tiles (of QB blocks) of each of the NG programs of a chunk's within-chunk scan, as
    (lo, hi, nb, at): tiles lo to hi - 1 of the chunk; the sums of all but the last program cover
    the nb blocks their tiles reach, from block `at` of the packed buffers (the last program's are
    the scan's own, over all N blocks; its scratch follows the others').

    Programs take consecutive tiles, so that each program's sums cover only the blocks up to its
    last tile, and about the same work: a tile walks the blocks before it."""
    tiles = -(-min(C, N) // QB)
    cost = [QB * (t + 2) - 1 for t in range(tiles)]  # the blocks it walks, and its own
    total = sum(cost)
    spans, lo, at, done = [], 0, 0, 0
    for g in range(NG):
        hi = lo + 1
        done += cost[lo]
        # the next tile too while that brings the work done closer to g + 1 programs' share
        while hi < tiles - (NG - 1 - g) and done + cost[hi] / 2 <= total * (g + 1) / NG:
            done += cost[hi]
            hi += 1
        if g == NG - 1:
            spans.append((lo, tiles, N, at))
        else:
            spans.append((lo, hi, min(N, QB * hi), at))
        at += spans[-1][2]
        lo = hi
    return spans


_SPANS: dict = {}


def _spans_on(spans: list, device: torch.device) -> torch.Tensor:
    """within_spans's list as an int32 tensor on device, made once per list: a copy from the host
    waits for the GPU, and a CUDA graph cannot capture one (training runs its first steps
    without a graph)."""
    key = (tuple(spans), device)
    if key not in _SPANS:
        _SPANS[key] = torch.tensor(spans, dtype=torch.int32, device=device)
    return _SPANS[key]


@triton.jit(do_not_specialize=["T", "H", "N", "C", "NG"])
def within_scan_kernel(
    QT, KT, V, MB, G, SI, LSE, DO, O, DELTA,
    DQT, DK, DV, DM, DGROW, DGCOL, DKP, DVP, DMP, DGCOLP, DSI, RS, SPANS,
    T, H, OS, N, C, NG, scale, VSB, VST, VSH, DOSB, DOST, DOSH,
    D: tl.constexpr, BT: tl.constexpr, QB: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HH16: tl.constexpr,
    ADJ16: tl.constexpr,
):
    # Program g of a chunk owns its consecutive tiles of QB query blocks (1 or 2) lo to hi - 1
    # (SPANS[g] = lo, hi, nb, at), and writes their delta = rowsum(dO o O) for the scans
    # across chunks. A pair's second block crosses the first one, then the two walk the
    # earlier blocks of the chunk as one tile (the second block may lie past the end: its
    # rows are masked). The last program's sums of dK, dV, dL/dM and the gate's columns are
    # the scan's own (DK, DV, DM, DGCOL); each other program's cover the nb blocks its tiles
    # reach, at block `at` of the packed DKP, DVP, DMP and DGCOLP, and are added afterwards.
    first = (tl.program_id(0) // NG) * C
    g = tl.program_id(0) % NG
    bh = tl.program_id(1).to(tl.int64)
    lo = tl.load(SPANS + 4 * g)
    hi = tl.load(SPANS + 4 * g + 1)
    nb = tl.load(SPANS + 4 * g + 2)
    at = tl.load(SPANS + 4 * g + 3)
    span = tl.num_programs(1) * at + bh * nb  # this program's first block in RS, DKP, ...
    Tp = N * BT
    rows = tl.arange(0, QB * BT)  # the tile's rows
    krows = tl.arange(0, BT)  # a block's rows
    cols = tl.arange(0, D)
    # the (batch, head) and the span go into the pointers: 32-bit offsets within (registers)
    QT += bh * Tp * D
    KT += bh * Tp * D
    V = head_start(V, bh, H, VSB, VSH)  # v and dO in place: [B, T, H, D]
    DO = head_start(DO, bh, H, DOSB, DOSH)
    DQT += bh * Tp * D
    O += bh * OS  # the output, [B, H, T, D] with OS elements a head
    if g == NG - 1:
        DK += bh * Tp * D
        DV += bh * Tp * D
        DM += bh * N * D * D
        DGCOL += bh * Tp
    else:
        DK = DKP + span * BT * D
        DV = DVP + span * BT * D
        DM = DMP + span * D * D
        DGCOL = DGCOLP + span * BT
    RS += span * QB * BT * D
    MB += bh * N * D * D
    SI += bh * N * BT * BT
    DSI += bh * N * BT * BT
    G += bh * Tp
    LSE += bh * Tp
    DELTA += bh * Tp
    DGROW += bh * Tp
    causal = krows[None, :] <= krows[:, None]

    DT = KT.dtype.element_ty  # storage / data-dot dtype: float32, or q's 16-bit dtype
    DS: tl.constexpr = 64 if D > 64 else D  # rows of dL/dM zeroed at a time
    start = first + QB * lo
    end = tl.minimum(first + QB * hi, tl.minimum(first + C, N))  # the program's blocks end there
    # A tile walks the key blocks from the chunk's first to the one before its last block, so
    # the sums of dK, dL/dM and the gate's columns begin at the walk's first visit: at the
    # first tile, for every block it walks; after it, for the blocks from the one before the
    # tile's first on (the previous tile walked up to the one before that). The blocks after
    # the last tile's walk are never walked here: their sums are zero.
    last = start + QB * ((end - 1 - start) // QB)
    for zb in range(last + QB - 1, end):
        offs_z = zb * BT + krows
        if HAS_GATE:
            tl.store(DGCOL + offs_z, tl.zeros([BT], dtype=tl.float32))
        if N > 1:  # with one block nothing reads dKt and dL/dM
            tl.store(DK + offs_z[:, None] * D + cols[None, :], tl.zeros([BT, D], dtype=tl.float32))
            if HAS_HH:
                for sl in tl.static_range(D // DS):
                    tl.store(DM + zb * D * D + (sl * DS + tl.arange(0, DS))[:, None] * D + cols[None, :],
                             tl.zeros([DS, D], dtype=tl.float32))
    for ib in range(start, end, QB):
        # the previous tile's reads of RS and the partial sums are done
        tl.debug_barrier()
        # each block's own keys, and its delta; a block's dV begins with its own keys' term
        for h in tl.static_range(QB):
            hb = ib + h
            if hb < N:
                offs_h = hb * BT + krows
                tile_h = offs_h[:, None] * D + cols[None, :]  # in every [Tp, D] buffer
                do = load_rows(DO, offs_h, cols, DOST, T)
                o = load_rows(O, offs_h, cols, D, T)
                delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
                tl.store(DELTA + offs_h, delta)
                si_ptr = hb * BT * BT + krows[:, None] * BT + krows[None, :]
                s = tl.load(SI + si_ptr)
                p = tl.where(causal, tl.exp2(s - tl.load(LSE + offs_h)[:, None]), 0.0)
                dp = tl.dot(do, tl.trans(load_rows(V, offs_h, cols, VST, T)), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                tl.debug_barrier()  # DSI may be SI itself: every thread has read its logits
                tl.store(DSI + si_ptr, ds)
                tl.store(DV + tile_h, tl.dot(tl.trans(p.to(DT)), do, input_precision=PREC))
        tl.debug_barrier()  # delta is read back below by other threads

        offs_i = ib * BT + rows
        valid = offs_i < Tp
        tile_i = offs_i[:, None] * D + cols[None, :]
        do = load_rows(DO, offs_i, cols, DOST, T)
        r, delta, lse = query_tile(QT, DELTA, LSE, offs_i, cols, Tp, D)
        if HAS_HH:
            # replay the forward carry of the queries within the chunk, keeping each position
            if QB > 1:
                # a pair's second block crosses the first alone; the first's rows stay 0 there
                second = (rows >= BT)[:, None]
                tl.store(RS + ib * QB * BT * D + rows[:, None] * D + cols[None, :],
                         tl.where(second, r, 0.0).to(RS.dtype.element_ty))
                r = tl.where(second, carry(r, MB + ib * D * D, cols, D, False, HH16, PREC), r)
            for jj in range(0, ib - first):
                jb = ib - 1 - jj
                tl.store(RS + jb * QB * BT * D + rows[:, None] * D + cols[None, :], r.to(RS.dtype.element_ty))
                r = carry(r, MB + jb * D * D, cols, D, False, HH16, PREC)
            # RS is read back below in another register layout, i.e. by other threads
            tl.debug_barrier()
        gq = tl.zeros([QB * BT], dtype=tl.float32)
        if HAS_GATE:
            gq = tl.load(G + offs_i, mask=valid, other=0.0)
        dg_row = tl.zeros([QB * BT], dtype=tl.float32)
        dr = tl.zeros([QB * BT, D], dtype=tl.float32)
        # key blocks first to last; a pair's last one, block ib, is the second block's alone
        for jb in range(first, ib + QB - 1):
            added = (ib > start) & (jb < ib - 1)  # this program has added to dK_jb (see above)
            offs_j = jb * BT + krows
            tile_j = offs_j[:, None] * D + cols[None, :]
            rs_j = RS + jb * QB * BT * D
            if HAS_HH:
                r = tl.load(rs_j + rows[:, None] * D + cols[None, :]).to(tl.float32)
            kt = tl.load(KT + tile_j)
            # dV_jb has its own keys' term, unless jb lies before the program's blocks
            dv_added = (ib > start) | (jb >= start)
            # At D <= 64 the partial sums this step adds to are loaded before its products,
            # so that their wait overlaps them. At D = 128, where dL/dM_jb is two slabs and
            # registers are short, they are loaded where they are used (README.md).
            EARLY: tl.constexpr = D <= 64
            dm = None
            if EARLY:
                dv = sum_so_far(DV + tile_j, dv_added)
                dk = sum_so_far(DK + tile_j, added)
                if HAS_HH:
                    dm = sum_so_far(DM + jb * D * D + cols[:, None] * D + cols[None, :], added)
            rb = r.to(DT)
            gk = tl.load(G + offs_j) if HAS_GATE else gq
            p = tl.exp2(logits(rb, kt, gq, gk, scale, HAS_GATE, PREC) - lse[:, None])
            if QB > 1:
                p = tl.where(rows[:, None] >= (jb + 1 - ib) * BT, p, 0.0)
                if jb == ib:
                    tl.store(DQT + tile_i, dr, mask=(rows < BT)[:, None])  # the first block is done
            dp = tl.dot(do, tl.trans(load_rows(V, offs_j, cols, VST, T)), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dsb = (ds * scale).to(DT)
            if not EARLY:
                dv = sum_so_far(DV + tile_j, dv_added)
            tl.store(DV + tile_j, tl.dot(tl.trans(p.to(DT)), do, acc=dv, input_precision=PREC))
            if not EARLY:
                dk = sum_so_far(DK + tile_j, added)
            tl.store(DK + tile_j, tl.dot(tl.trans(dsb), rb, acc=dk, input_precision=PREC))
            if HAS_GATE:
                dg_row += tl.sum(ds, 1)
                dgc_ptr = DGCOL + offs_j
                tl.store(dgc_ptr, sum_so_far(dgc_ptr, added) - tl.sum(ds, 0))
            if HAS_HH:
                # dr is dL/d(queries before block jb); carry it back across the block
                dr = back_across(dr, r, rs_j, rows, DM, MB, jb, added, cols, D, D > 64, ADJ16, PREC, dm)
            dr = tl.dot(dsb, kt, acc=dr, input_precision=PREC)
        if N > 1:  # nor dQt
            tl.store(DQT + tile_i, dr, mask=((rows >= (QB - 1) * BT) & valid)[:, None])
        tl.store(DGROW + offs_i, dg_row, mask=valid)


def within_scan(Qt, Kt, V, vs, dO, dos, O, Mb, G, SI, lse, delta, dQt, dKt, dV, dM, dGrow, dGcol, T, C, NG, QB,
                scale, adj16, scan, replay_dtype, launch_opts):
    """Set the gradients of the pairs of blocks within each chunk of C blocks: dQt, dKt, dV
    [B, H, Tp, D], dM [B, H, N, D, D], and the gate's rows and columns dGrow, dGcol [B, H, Tp], all
    float32; every element is set, none read first, but dQt, dKt and dM with one block (N = 1),
    which nothing reads then. NG programs a chunk with consecutive query tiles of QB blocks
    (several only when one chunk spans the sequence); the sums of all but the last are packed,
    and added to the last one's in program order.

    Qt, Kt: [B, H, Tp, D]; V, dO: [B, T, H, D] read in place, with their strides vs and dos
    (batch, time, head); O: the output [B, H, T, D]; Mb: [B, H, N, D, D]; G: [B, H, Tp]; SI: the
    intra-block logits [B, H, N, BT, BT], overwritten with their gradient; lse: [B, H, Tp];
    delta: [B, H, Tp], written here. scan: the constexprs the scans share (D, BT, HAS_HH,
    HAS_GATE, PREC, HH16); replay_dtype: that of the queries replayed across the chunk's blocks.
    Absent inputs are stubs."""
    B, H, Tp, D = Qt.shape
    BT, has_hh, has_gate = scan["BT"], scan["HAS_HH"], scan["HAS_GATE"]
    N = Tp // BT
    NC = -(-N // C)
    dev = Qt.device
    f32 = dict(dtype=torch.float32, device=dev)
    stub = dummy(dev)
    spans = within_spans(N, C, QB, NG)
    packed = sum(nb for _, _, nb, _ in spans[:-1])  # blocks per head of the other programs' sums
    dKp = torch.empty(B * H * packed * BT * D, **f32) if packed else stub
    dVp = torch.empty(B * H * packed * BT * D, **f32) if packed else stub
    dMp = torch.empty(B * H * packed * D * D, **f32) if packed and has_hh else stub
    dGcolp = torch.empty(B * H * packed * BT, **f32) if packed and has_gate else stub
    RS = torch.empty(B * H * (packed + N) * QB * BT * D, dtype=replay_dtype, device=dev) if has_hh else stub
    within_scan_kernel[(NC * NG, B * H)](
        Qt, Kt, V, Mb, G, SI, lse, dO, O, delta,
        dQt, dKt, dV, dM, dGrow, dGcol, dKp, dVp, dMp, dGcolp, SI, RS,
        _spans_on(spans, dev),
        T, H, O.stride(1), N, C, NG, float(scale), *vs, *dos, QB=QB, ADJ16=adj16, **scan, **launch_opts,
    )
    del RS
    for sums, part, size in ((dGcol, dGcolp, BT), (dKt, dKp, BT * D), (dV, dVp, BT * D), (dM, dMp, D * D)):
        if part is not stub:
            for _, _, nb, at in spans[:-1]:
                region = part[B * H * at * size:B * H * (at + nb) * size]
                sums.view(B, H, -1)[:, :, :nb * size] += region.view(B, H, -1)
