"""Forward scan: online softmax of each query block over the key blocks before it, block by
block within its chunk, then chunk by chunk (README.md, "The kernels, in call order")."""

import torch
import triton
import triton.language as tl

from .common import attend, carry, dummy, logits, softmax_step


@triton.jit(do_not_specialize=["N", "C"])
def fwd_scan_kernel(
    QT, QS, KT, KC, V, MB, MC, G, SI, O, LSE,
    N, C, scale,
    D: tl.constexpr, BT: tl.constexpr, QB: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HH16: tl.constexpr,
):
    # A program owns the tile of QB query blocks (1 or 2) from block ib, a multiple of QB.
    # With several chunks these have an even number of blocks, so a pair lies in one chunk
    # (its second block may lie past the end: its rows are masked).
    ib = ((N + QB - 1) // QB - 1 - tl.program_id(0)) * QB  # the longest rows are launched first
    bh = tl.program_id(1).to(tl.int64)
    Tp = N * BT
    NC = (N + C - 1) // C
    first = (ib // C) * C  # the first block of the tile's chunk
    rows = tl.arange(0, QB * BT)  # the tile's rows
    krows = tl.arange(0, BT)  # a key block's rows
    cols = tl.arange(0, D)
    base = bh * Tp * D
    offs_i = ib * BT + rows
    valid = offs_i < Tp
    tile_i = base + offs_i[:, None] * D + cols[None, :]
    gq = tl.zeros([QB * BT], dtype=tl.float32)
    if HAS_GATE:
        gq = tl.load(G + bh * Tp + offs_i, mask=valid, other=0.0)
    m = tl.full([QB * BT], float("-inf"), dtype=tl.float32)
    l = tl.zeros([QB * BT], dtype=tl.float32)
    acc = tl.zeros([QB * BT, D], dtype=tl.float32)
    r = tl.load(QT + tile_i, mask=valid[:, None], other=0.0).to(tl.float32)

    # the tile's own blocks: a block's logits with its own keys come precomputed (scale and
    # gate included); a pair's second block sees the first one's keys from its own start
    for h in tl.static_range(QB):
        offs_h = (ib + h) * BT + krows
        tile_h = base + offs_h[:, None] * D + cols[None, :]
        own = (rows // BT == h)[:, None] & (krows[None, :] <= (rows % BT)[:, None]) & valid[:, None]
        s = tl.load(SI + (bh * N + ib + h) * BT * BT + (rows % BT)[:, None] * BT + krows[None, :],
                    mask=own, other=float("-inf"))
        if h + 1 < QB:
            gk = tl.load(G + bh * Tp + offs_h) if HAS_GATE else gq
            later = rows[:, None] >= (h + 1) * BT
            s = tl.where(later, logits(r, tl.load(KT + tile_h), gq, gk, scale, HAS_GATE, PREC), s)
        v = tl.load(V + tile_h, mask=(offs_h < Tp)[:, None], other=0.0)
        m, l, acc = softmax_step(s, v, m, l, acc, PREC)
    if HAS_HH & (QB > 1):
        # the second block's queries cross the first block: the tile starts there
        crossed = carry(r, MB + (bh * N + ib) * D * D, cols, D, False, HH16, PREC)
        r = tl.where((rows >= BT)[:, None], crossed, r)

    # earlier blocks of the same chunk: queries carried one block at a time
    for jj in range(0, ib - first):
        jb = ib - 1 - jj
        offs_j = jb * BT + krows
        tile_j = base + offs_j[:, None] * D + cols[None, :]
        gk = tl.load(G + bh * Tp + offs_j) if HAS_GATE else gq
        m, l, acc = attend(r, tl.load(KT + tile_j), tl.load(V + tile_j), m, l, acc, gq, gk, scale,
                           HAS_GATE, PREC)
        if HAS_HH:
            r = carry(r, MB + (bh * N + jb) * D * D, cols, D, False, HH16, PREC)

    # earlier chunks: keys moved to their chunk's end, queries carried a chunk at a time
    if HAS_HH:
        r = tl.load(QS + tile_i, mask=valid[:, None], other=0.0).to(tl.float32)  # at the chunk's start
    for jj in range(0, first):
        jb = first - 1 - jj
        offs_j = jb * BT + krows
        tile_j = base + offs_j[:, None] * D + cols[None, :]
        gk = tl.load(G + bh * Tp + offs_j) if HAS_GATE else gq
        m, l, acc = attend(r, tl.load(KC + tile_j), tl.load(V + tile_j), m, l, acc, gq, gk, scale,
                           HAS_GATE, PREC)
        if HAS_HH:
            if (jb % C == 0) & (jb > 0):
                r = carry(r, MC + (bh * NC + jb // C) * D * D, cols, D, False, HH16, PREC)
    o = acc / l[:, None]
    tl.store(O + tile_i, o.to(O.dtype.element_ty), mask=valid[:, None])
    tl.store(LSE + bh * Tp + offs_i, m + tl.log2(l), mask=valid)


def forward_scan(Qt, Qs, Kt, Kc, V, Mb, Mc, G, SI, C, scale, QB, out_dtype, prec, hh16, launch_opts):
    """The attention output O [B, H, Tp, D] in out_dtype and the log-sum-exps of the logits LSE
    [B, H, Tp] (float32, base 2), one program per (tile of QB query blocks, batch*head).

    Qt, Kt: the queries moved to their block's start, the keys to its end; Qs, Kc: to their
    chunk's start and end (Qt and Kt in one chunk); V: [B, H, Tp, D]; Mb: the block products
    [B, H, N, D, D] and Mc the chunks' [B, H, NC, D, D], None without w; G: the gate's cumulative
    sum [B, H, Tp] in base 2, or None; SI: the intra-block logits [B, H, N, BT, BT]; C blocks a
    chunk."""
    B, H, Tp, D = Qt.shape
    N, BT = SI.shape[2], SI.shape[-1]
    dev = Qt.device
    stub = dummy(dev)
    O = torch.empty(B, H, Tp, D, dtype=out_dtype, device=dev)
    LSE = torch.empty(B, H, Tp, dtype=torch.float32, device=dev)
    fwd_scan_kernel[(-(-N // QB), B * H)](
        Qt, Qs, Kt, Kc, V,
        stub if Mb is None else Mb, stub if Mc is None else Mc,
        stub if G is None else G,
        SI, O, LSE,
        N, C, float(scale),
        D=D, BT=BT, QB=QB, HAS_HH=Mb is not None, HAS_GATE=G is not None,
        PREC=prec, HH16=hh16, **launch_opts,
    )
    return O, LSE
