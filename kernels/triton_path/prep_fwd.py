"""Preprocessing forward: each block's UT inverse, product, moved queries and keys, and
intra-block logits (README.md, "The algebra")."""

import torch
import triton
import triton.language as tl

from .common import base2, dummy, factor_precision, inversion_precision, load_f32, load_op, operand, product_dtype


@triton.jit(do_not_specialize=["T", "H", "N"])
def prep_fwd_kernel(
    Q, K, W, BETA, G, QT, KT, MB, SI, XO,
    T, H, N, scale,
    D: tl.constexpr, BT: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HPREC: tl.constexpr,
    SAVE_X: tl.constexpr, XPREC: tl.constexpr, HALF: tl.constexpr, CARRIED: tl.constexpr,
):
    # One program per (block ib, batch*head bh). Q, K, W: [B, T, H, D] and BETA: [B, T, H], read in
    # place; G: [B, H, Tp]; writes QT, KT: [B, H, Tp, D], MB: [B, H, N, D, D], SI and XO:
    # [B, H, N, BT, BT]. Without w (HAS_HH false) Qt = Q, Kt = K and S = scale Q K^T (+ gate).
    # Qt, Kt and M serve the pairs of different blocks only: without CARRIED (one block) they
    # are left unwritten.
    ib = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    Tp = N * BT
    rows = tl.arange(0, BT)
    cols = tl.arange(0, D)
    t = ib * BT + rows
    valid = t < T
    # the block's (batch, head) goes into the pointers: 32-bit offsets within (registers)
    Q += b * T * H * D + h * D
    K += b * T * H * D + h * D
    W += b * T * H * D + h * D
    BETA += b * T * H + h
    QT += bh * Tp * D
    KT += bh * Tp * D
    m2 = valid[:, None]
    si = (bh * N + ib) * BT * BT + rows[:, None] * BT + rows[None, :]
    if not HAS_HH:
        src = t[:, None] * (H * D) + cols[None, :]
        dst = t[:, None] * D + cols[None, :]
        q = tl.load(Q + src, mask=m2, other=0.0).to(tl.float32)
        k = tl.load(K + src, mask=m2, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * base2(scale)
        if HAS_GATE:
            g = tl.load(G + bh * Tp + t)
            s += g[:, None] - g[None, :]
        tl.store(SI + si, s)
        if CARRIED:
            tl.store(QT + dst, q.to(QT.dtype.element_ty))
            tl.store(KT + dst, k.to(KT.dtype.element_ty))
    else:
        # Everything goes by column slabs of at most 64 (registers): first the sums over the
        # head dimension, then the columns of U, R, Qt, Kt and the blocks of M, which are
        # independent.
        DS: tl.constexpr = 64 if D > 64 else D
        slab = tl.arange(0, DS)
        beta = tl.load(BETA + t * H, mask=valid, other=0.0).to(tl.float32)
        L = tl.zeros([BT, BT], dtype=tl.float32)
        for c in tl.static_range(D // DS):
            w = tl.load(W + t[:, None] * (H * D) + c * DS + slab[None, :], mask=m2, other=0.0).to(tl.float32)
            L = tl.dot(w * beta[:, None], tl.trans(w), acc=L, input_precision=HPREC)
        L = tl.where(rows[:, None] > rows[None, :], L, 0.0)
        # X = (I + L)^{-1}, L = strictly_lower(diag(beta) W W^T), by recursive doubling of the
        # inverted diagonal blocks: for a block [[A, 0], [C, B]] of I + L whose halves are
        # inverted, the inverse is [[A^-1, 0], [-B^-1 C A^-1, B^-1]].
        X = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        for lvl in tl.static_range(7):
            if (1 << lvl) < BT:
                hb = rows // (1 << lvl)  # index of the half-block
                c = ((hb[:, None] // 2) == (hb[None, :] // 2)) & (hb[:, None] % 2 == 1) & (hb[None, :] % 2 == 0)
                Z = tl.dot(tl.where(c, L, 0.0), X, input_precision=XPREC)  # C A^-1
                X = X - tl.dot(X, Z, input_precision=XPREC)  # B^-1 C A^-1 below A^-1
        if SAVE_X:  # for the backward
            tl.store(XO + si, X.to(XO.dtype.element_ty))
        s = tl.zeros([BT, BT], dtype=tl.float32)  # Q K^T
        QW = tl.zeros([BT, BT], dtype=tl.float32)  # Q W^T
        WK = tl.zeros([BT, BT], dtype=tl.float32)  # W K^T
        for c in tl.static_range(D // DS):
            src_c = t[:, None] * (H * D) + c * DS + slab[None, :]
            q = load_op(Q, src_c, m2, HALF)
            k = load_op(K, src_c, m2, HALF)
            w = load_op(W, src_c, m2, HALF)
            s = tl.dot(q, tl.trans(k), acc=s, input_precision=PREC)
            QW = tl.dot(q, tl.trans(w), acc=QW, input_precision=PREC)
            WK = tl.dot(w, tl.trans(k), acc=WK, input_precision=PREC)
        QW = tl.where(rows[None, :] <= rows[:, None], QW, 0.0)
        WK = tl.where(rows[:, None] > rows[None, :], WK, 0.0)
        X = operand(X, HALF)  # from here on only a product's operand
        # intra-block logits: S = Q K^T - QW E, E = X diag(beta) WK
        E = tl.dot(X, operand(WK * beta[:, None], HALF), input_precision=PREC)
        s = s - tl.dot(operand(QW, HALF), operand(E, HALF), input_precision=PREC)
        s = s * base2(scale)
        if HAS_GATE:
            g = tl.load(G + bh * Tp + t)
            s += g[:, None] - g[None, :]
        tl.store(SI + si, s)
        if CARRIED:
            # per column slab: U = X diag(beta) W, R = diag(beta) X^T W, the queries moved to the
            # block start Qt = Q - QW U, the keys moved to its end Kt = K - WK^T R, and the
            # column slab of the block's product M = I - W^T U, in row slabs
            QW = operand(QW, HALF)
            WK = operand(WK, HALF)
            for c in tl.static_range(D // DS):
                src_c = t[:, None] * (H * D) + c * DS + slab[None, :]
                dst_c = t[:, None] * D + c * DS + slab[None, :]
                w = load_f32(W, src_c, m2)
                u = operand(tl.dot(X, operand(w * beta[:, None], HALF), input_precision=HPREC), HALF)
                q = load_f32(Q, src_c, m2)
                tl.store(QT + dst_c, (q - tl.dot(QW, u, input_precision=PREC)).to(QT.dtype.element_ty))
                r = tl.dot(tl.trans(X), operand(w, HALF), input_precision=HPREC) * beta[:, None]
                k = load_f32(K, src_c, m2)
                tl.store(KT + dst_c, (k - tl.dot(tl.trans(WK), operand(r, HALF), input_precision=PREC))
                         .to(KT.dtype.element_ty))
                for rs in tl.static_range(D // DS):
                    ws = load_op(W, t[:, None] * (H * D) + rs * DS + slab[None, :], m2, HALF)
                    eye = tl.where((rs * DS + slab)[:, None] == (c * DS + slab)[None, :], 1.0, 0.0)
                    mb = eye - tl.dot(tl.trans(ws), u, input_precision=HPREC)
                    tl.store(MB + (bh * N + ib) * D * D + (rs * DS + slab)[:, None] * D + c * DS + slab[None, :],
                             mb.to(MB.dtype.element_ty))


def prep_forward(q, k, w, beta, G, scale, BT, N, prec, sd, half, launch_opts, save_x):
    """Block-local algebra, one program per (block, batch*head): (Qt, Kt, M, SI, X). With one
    block (N = 1) Qt, Kt and M are left unwritten: they serve only pairs of different blocks.

    q, k, w: [B, T, H, D]; beta: [B, T, H]; G: the gate's cumulative sum [B, H, Tp] in base 2, or
    None. Qt, Kt: [B, H, Tp, D] in sd (Tp = N BT); M: the block products [B, H, N, D, D], None
    without w; SI: the intra-block logits [B, H, N, BT, BT] in base 2, float32; X: the block
    inverses [B, H, N, BT, BT] for the backward, None without save_x. With half the products
    after the inversion take float16 operands, and X is float16, as the backward's products take
    it: rounded once when stored, not at every load."""
    B, T, H, D = q.shape
    dev = q.device
    Tp = N * BT
    f32 = dict(dtype=torch.float32, device=dev)
    has_hh = w is not None
    stub = dummy(dev)
    Qt = torch.empty(B, H, Tp, D, dtype=sd, device=dev)
    Kt = torch.empty(B, H, Tp, D, dtype=sd, device=dev)
    Mb = torch.empty(B, H, N, D, D, dtype=product_dtype(q), device=dev) if has_hh else None
    SI = torch.empty(B, H, N, BT, BT, **f32)
    X = (torch.empty(B, H, N, BT, BT, dtype=torch.float16 if half else torch.float32, device=dev)
         if has_hh and save_x else None)
    prep_fwd_kernel[(N, B * H)](
        q, k, w if has_hh else stub, beta if has_hh else stub, stub if G is None else G,
        Qt, Kt, stub if Mb is None else Mb, SI, stub if X is None else X,
        T, H, N, float(scale),
        D=D, BT=BT, HAS_HH=has_hh, HAS_GATE=G is not None, PREC=prec, HPREC=factor_precision(q.dtype, dev),
        SAVE_X=X is not None, XPREC=inversion_precision(q.dtype, dev), HALF=half, CARRIED=N > 1,
        **launch_opts,
    )
    return Qt, Kt, Mb, SI, X
