"""Chunk edges: the queries moved to their chunk's start, the keys to their chunk's end, and each
chunk's product, forward and backward, and the same in torch (README.md, "The algebra" and "The
backward passes")."""

import torch
import triton
import triton.language as tl

from .common import dummy, operand, scaled


@triton.jit(do_not_specialize=["N", "C"])
def edges_fwd_kernel(
    QT, KT, MB, QS, KC, MC, PS, SS,
    N, C,
    D: tl.constexpr, BT: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr, HALF: tl.constexpr,
):
    # One program per (chunk, batch*head). With P_b = M_{b-1} ... M_0 and
    # S_b = M_{b+1}^T ... M_{nb-1}^T over the chunk's nb blocks: Qs_b = Qt_b P_b,
    # Kc_b = Kt_b S_b, Mc = P_nb; with SAVE, P_b and S_b for the backward. The columns of
    # P and S evolve independently: they are carried in slabs of at most 64 (registers), or
    # whole with float16 operands (HALF). The first chunk has no queries' side (its queries
    # cross no chunk, and no query crosses it), the last no keys' side (no query comes after
    # it): nothing reads those.
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    NC = (N + C - 1) // C
    first = c * C
    nb = tl.minimum(C, N - first)
    rows = tl.arange(0, BT)
    cols = tl.arange(0, D)
    DS: tl.constexpr = D if HALF else (64 if D > 64 else D)
    square = cols[:, None] * D + cols[None, :]
    saved = (bh * NC + c) * C * D * D  # this chunk's P_b (or S_b), b = 0..C-1

    for sl in tl.static_range(D // DS):
        slab = sl * DS + tl.arange(0, DS)
        in_slab = cols[:, None] * D + slab[None, :]
        if c > 0:
            p = tl.where(cols[:, None] == slab[None, :], 1.0, 0.0)
            for b in range(0, nb):
                row_ptr = (bh * N * BT + (first + b) * BT + rows)[:, None] * D
                qt = operand(tl.load(QT + row_ptr + cols[None, :]), HALF)
                tl.store(QS + row_ptr + slab[None, :],
                         tl.dot(qt, operand(p, HALF), input_precision=PREC).to(QS.dtype.element_ty))
                if SAVE:
                    tl.store(PS + saved + b * D * D + in_slab, p.to(PS.dtype.element_ty))
                m = operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
                p = tl.dot(m, operand(p, HALF), input_precision=PREC)
            tl.store(MC + (bh * NC + c) * D * D + in_slab, p.to(MC.dtype.element_ty))

        if c < NC - 1:
            s = tl.where(cols[:, None] == slab[None, :], 1.0, 0.0)
            for bb in range(0, nb):
                b = nb - 1 - bb
                row_ptr = (bh * N * BT + (first + b) * BT + rows)[:, None] * D
                kt = operand(tl.load(KT + row_ptr + cols[None, :]), HALF)
                tl.store(KC + row_ptr + slab[None, :],
                         tl.dot(kt, operand(s, HALF), input_precision=PREC).to(KC.dtype.element_ty))
                if SAVE:
                    tl.store(SS + saved + b * D * D + in_slab, s.to(SS.dtype.element_ty))
                if b > 0:  # S_{-1} is never used
                    m = operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
                    s = tl.dot(tl.trans(m), operand(s, HALF), input_precision=PREC)


def chunk_edges(Qt, Kt, Mb, C, prec, half, launch_opts, save=False):
    """Queries moved to their chunk's start, keys to their chunk's end, and each chunk's product,
    one program per (chunk, batch*head); chunk_edges_reference is the same in torch.

    Qt, Kt: [B, H, Tp, D]; Mb: the block products [B, H, N, D, D]; C blocks a chunk. Returns Qs,
    Kc [B, H, Tp, D] in Qt's dtype and Mc [B, H, NC, D, D] in Mb's, plus, with save, the products
    before and after each block [B, H, NC, C, D, D] that chunk_edges_backward needs, also in Mb's
    dtype (else stubs). The first chunk's Qs, Mc and products before, and the last chunk's Kc and
    products after, are left unset: the scans and the backward do not read them. With half, float16
    operands over the whole head."""
    B, H, Tp, D = Qt.shape
    N = Mb.shape[2]
    NC = -(-N // C)
    dev = Qt.device
    Qs, Kc = torch.empty_like(Qt), torch.empty_like(Kt)
    Mc = torch.empty(B, H, NC, D, D, dtype=Mb.dtype, device=dev)
    PS = SS = dummy(dev)
    if save:
        PS = torch.empty(B, H, NC, C, D, D, dtype=Mb.dtype, device=dev)
        SS = torch.empty_like(PS)
    edges_fwd_kernel[(NC, B * H)](
        Qt, Kt, Mb, Qs, Kc, Mc, PS, SS, N, C,
        D=D, BT=Tp // N, SAVE=save, PREC=prec, HALF=half, **launch_opts,
    )
    return Qs, Kc, Mc, PS, SS


@triton.jit(do_not_specialize=["N", "C"])
def edges_bwd_kernel(
    X, MB, SAVED, DX, DMC, DXT, DM,
    N, C,
    D: tl.constexpr, BT: tl.constexpr, KEYS: tl.constexpr, PREC: tl.constexpr, HALF: tl.constexpr,
):
    # One side of the chunk edges' gradients, added into dXt and dM (rows and blocks this
    # program alone owns): the queries' (X = Qt, SAVED = P, DX = dQs) or, with KEYS, the
    # keys' (X = Kt, SAVED = S, DX = dKc). Adjoints of P and S, with Pbar_nb = dMc and
    # Sbar_{-1} = 0:
    #   Pbar_b = Qt_b^T dQs_b + M_b^T Pbar_{b+1},  dM_b += Pbar_{b+1} P_b^T,  dQt_b += dQs_b P_b^T
    #   Sbar_b = Kt_b^T dKc_b + M_b Sbar_{b-1},    dM_b += S_b Sbar_{b-1}^T,  dKt_b += dKc_b S_b^T
    # With float16 operands (HALF) the whole head fits in registers, so that each block's dM
    # and dXt are read and written once; otherwise column slab by column slab, as in the
    # forward, each slab adding its share of the sums. A side has no program for the chunk
    # where all its terms are zero (the scans do not write dX there): the queries' side for
    # the first chunk (its queries cross no chunk, and none cross it: dQs = 0, dMc = 0),
    # the keys' side for the last (no queries come after it: dKc = 0).
    c = tl.program_id(0)
    if not KEYS:
        c += 1
    bh = tl.program_id(1).to(tl.int64)
    NC = (N + C - 1) // C
    first = c * C
    nb = tl.minimum(C, N - first)
    rows = tl.arange(0, BT)
    cols = tl.arange(0, D)
    DS: tl.constexpr = D if HALF else (64 if D > 64 else D)
    square = cols[:, None] * D + cols[None, :]
    saved = (bh * NC + c) * C * D * D

    for sl in tl.static_range(D // DS):
        slab = sl * DS + tl.arange(0, DS)
        in_slab = cols[:, None] * D + slab[None, :]
        tl.debug_barrier()  # the sums are read back in another layout, by other threads
        if KEYS:
            bar = tl.zeros([D, DS], dtype=tl.float32)  # Sbar
        else:
            bar = tl.load(DMC + (bh * NC + c) * D * D + in_slab)  # Pbar
        for i in range(0, nb):
            b = i if KEYS else nb - 1 - i  # keys first to last, queries last to first
            row_ptr = (bh * N * BT + (first + b) * BT + rows)[:, None] * D
            tile = row_ptr + cols[None, :]
            prod = operand(tl.load(SAVED + saved + b * D * D + in_slab), HALF)
            dx, dx_down = scaled(tl.load(DX + row_ptr + slab[None, :]), HALF)
            tl.store(DXT + tile, tl.load(DXT + tile) + dx_down * tl.dot(dx, tl.trans(prod), input_precision=PREC))
            bars, bar_down = scaled(bar, HALF)
            dm_ptr = DM + (bh * N + first + b) * D * D + square
            if KEYS:
                if b > 0:
                    tl.store(dm_ptr, tl.load(dm_ptr) + bar_down * tl.dot(prod, tl.trans(bars), input_precision=PREC))
            else:
                tl.store(dm_ptr, tl.load(dm_ptr) + bar_down * tl.dot(bars, tl.trans(prod), input_precision=PREC))
            x = operand(tl.load(X + tile), HALF)
            m = operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
            if KEYS:
                bar = bar_down * tl.dot(m, bars, input_precision=PREC)
            else:
                bar = bar_down * tl.dot(tl.trans(m), bars, input_precision=PREC)
            bar += dx_down * tl.dot(tl.trans(x), dx, input_precision=PREC)


def chunk_edges_backward(X, Mb, saved, dX, dMc, dXt, dM, C, prec, half, launch_opts):
    """Add one side of the chunk edges' gradients into dXt [B, H, Tp, D] and dM [B, H, N, D, D]
    (float32, in place): the queries' (X = Qt, saved = PS, dX = dQs, with dMc [B, H, NC, D, D])
    or, with dMc None, the keys' (X = Kt, saved = SS, dX = dKc). Two launches, so that each side's
    buffers can go before the other's scan; each has a program a chunk but one (the first chunk's
    queries, the last chunk's keys: their terms are zero, and dX is not read there). With half,
    float16 operands over the whole head."""
    B, H, Tp, D = X.shape
    N = Mb.shape[2]
    edges_bwd_kernel[(-(-N // C) - 1, B * H)](
        X, Mb, saved, dX, dummy(X.device) if dMc is None else dMc, dXt, dM, N, C,
        D=D, BT=Tp // N, KEYS=dMc is None, PREC=prec, HALF=half, **launch_opts,
    )


def chunk_edges_reference(Qt, Kt, Mb, C):
    """chunk_edges in plain torch, differentiable (the tests' reference for the kernels).

    With blocks b = 0..C-1 of a chunk (time order) and block products M_b:
        Qs_b = Qt_b M_{b-1} ... M_0,   Kc_b = Kt_b M_{b+1}^T ... M_{C-1}^T,   Mc = M_{C-1} ... M_0.
    A last, partial chunk is padded with identity blocks. Returns Qs, Kc [B, H, Tp, D] and
    Mc [B, H, NC, D, D] in the inputs' (common) dtype.
    """
    B, H, Tp, D = Qt.shape
    N = Mb.shape[2]
    BT = Tp // N
    NC = -(-N // C)
    pad = NC * C - N
    q = Qt.reshape(B, H, N, BT, D)
    k = Kt.reshape(B, H, N, BT, D)
    m = Mb
    if pad:
        zeros = q.new_zeros(B, H, pad, BT, D)
        q, k = torch.cat([q, zeros], 2), torch.cat([k, zeros], 2)
        m = torch.cat([m, torch.eye(D, dtype=m.dtype, device=m.device).expand(B, H, pad, D, D)], 2)
    q = q.reshape(B, H, NC, C, BT, D)
    k = k.reshape(B, H, NC, C, BT, D)
    m = m.reshape(B, H, NC, C, D, D)
    qs, before = [], None  # before: M_{b-1} ... M_0
    for b in range(C):
        qs.append(q[:, :, :, b] if before is None else q[:, :, :, b] @ before)
        before = m[:, :, :, b] if before is None else m[:, :, :, b] @ before
    kc, after = [None] * C, None  # after: M_{b+1}^T ... M_{C-1}^T
    for b in reversed(range(C)):
        kc[b] = k[:, :, :, b] if after is None else k[:, :, :, b] @ after
        if b > 0:
            mt = m[:, :, :, b].transpose(-1, -2)
            after = mt if after is None else mt @ after
    Qs = torch.stack(qs, 3).reshape(B, H, NC * C * BT, D)[:, :, :Tp]
    Kc = torch.stack(kc, 3).reshape(B, H, NC * C * BT, D)[:, :, :Tp]
    return Qs, Kc, before
