"""Preprocessing backward: the gradients of q, k, w, beta and the gate's intra-block terms from
those of the moved queries and keys, the intra-block logits and the block products (README.md,
"The backward passes")."""

import triton
import triton.language as tl

from .common import dot_rows, inverse, load_f32, load_op, operand, scaled


@triton.jit(do_not_specialize=["T", "H", "N"])
def prep_bwd_kernel(
    Q, K, W, BETA, DQT, DKT, DSI, DP, XS, DQWK,
    DQ, DK, DQO, DKO, DW, DBETA, DGL,
    T, H, N, scale,
    D: tl.constexpr, BT: tl.constexpr, PART: tl.constexpr,
    HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, XPREC: tl.constexpr, HALF: tl.constexpr,
    CARRIED: tl.constexpr,
):
    # One of three launches, each grouped around one product with X (the block inverse that
    # the preprocessing stored in XS), so that few [BT, BT] and [BT, D] matrices are live at
    # once (the three parts in one launch spilled registers heavily and ran slower: README.md).
    # The sums that span parts stay in memory, in rows this program alone owns: dQ, dK, dW,
    # dbeta, dQW and dWK (their scratch), and dL, which overwrites the intra-block logits'
    # gradient once part 0 has read it. dQW (lower triangle with the diagonal) and dWK
    # (strictly lower) share one scratch block, dWK transposed into its upper triangle. dQ and
    # dK are summed in float32 (DQ, DK) and written complete in q's dtype (DQO, DKO; they may
    # be DQ, DK).
    #   part 0: dQ = dQt + ds K, dK = dKt + ds^T Q; P1 = X^T dE: dbeta, dWK, dQW, dL
    #   part 1: P2 = X^T dU: dW, dbeta, dL; dQW complete: dQ, dW
    #   part 2: P3 = X diag(b) dR: dW, dbeta; dL and dWK complete: dK, dW, dbeta
    # Without CARRIED (one block) dQt, dKt and dM are zero and not read, nor is what only they
    # feed: dU, P2, dR and P3.
    ib = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    Tp = N * BT
    rows = tl.arange(0, BT)
    t = ib * BT + rows
    valid = t < T
    m2 = valid[:, None]
    # the block's (batch, head) goes into the pointers, so the tiles' offsets are 32-bit
    # (64-bit offset tiles cost registers in every part)
    Q += b * T * H * D + h * D
    K += b * T * H * D + h * D
    W += b * T * H * D + h * D
    DQ += b * T * H * D + h * D
    DK += b * T * H * D + h * D
    DQO += b * T * H * D + h * D
    DKO += b * T * H * D + h * D
    DW += b * T * H * D + h * D
    BETA += b * T * H + h
    DBETA += b * T * H + h
    DQT += bh * Tp * D
    DKT += bh * Tp * D
    DGL += bh * Tp
    DSI += (bh * N + ib) * BT * BT
    XS += (bh * N + ib) * BT * BT
    DQWK += (bh * N + ib) * BT * BT
    DP += (bh * N + ib) * D * D
    # [BT, D] tiles go in column slabs of at most 64, and dM in [DS, DS] blocks (registers)
    DS: tl.constexpr = 64 if D > 64 else D
    NS: tl.constexpr = D // DS
    slab = tl.arange(0, DS)
    src = t[:, None] * (H * D) + slab[None, :]  # slab c of an input's rows: + c * DS
    dst = t[:, None] * D + slab[None, :]  # of dQt's and dKt's
    dpi = slab[:, None] * D + slab[None, :]  # block (r, c) of dM: + r * DS * D + c * DS
    si = rows[:, None] * BT + rows[None, :]
    si_t = rows[None, :] * BT + rows[:, None]  # the same block, transposed
    lower = rows[None, :] <= rows[:, None]  # [i, s]: s <= i
    strict = rows[None, :] < rows[:, None]  # [t, j]: j < t
    bt = t * H
    if HAS_HH:
        beta = tl.load(BETA + bt, mask=valid, other=0.0)
    if PART == 0:
        ds = tl.where(lower, tl.load(DSI + si), 0.0)
        if HAS_GATE:
            tl.store(DGL + t, tl.sum(ds, 1) - tl.sum(ds, 0))
        ds, ds_down = scaled(ds * scale, HALF)
        # without w, dQ and dK are complete here
        dq_at = DQ if HAS_HH else DQO
        dk_at = DK if HAS_HH else DKO
        for c in tl.static_range(NS):
            dq = ds_down * tl.dot(ds, load_op(K, src + c * DS, m2, HALF), input_precision=PREC)
            dk = ds_down * tl.dot(tl.trans(ds), load_op(Q, src + c * DS, m2, HALF), input_precision=PREC)
            if CARRIED:
                dq += tl.load(DQT + dst + c * DS)
                dk += tl.load(DKT + dst + c * DS)
            tl.store(dq_at + src + c * DS, dq, mask=m2)
            tl.store(dk_at + src + c * DS, dk, mask=m2)
        if HAS_HH:
            # E = X diag(b) WK, dE = -QW^T ds, P1 = X^T dE
            QW = tl.where(lower, dot_rows(Q, W, src, m2, BT, DS, NS, HALF, PREC), 0.0)
            WK = tl.where(strict, dot_rows(W, K, src, m2, BT, DS, NS, HALF, PREC), 0.0)
            dE, dE_down = scaled(-ds_down * tl.dot(tl.trans(operand(QW, HALF)), ds, input_precision=PREC), HALF)
            E = operand(tl.dot(inverse(XS, si, HALF), operand(WK * beta[:, None], HALF),
                               input_precision=PREC), HALF)
            tl.store(DQWK + si, -ds_down * tl.dot(ds, tl.trans(E), input_precision=PREC), mask=lower)
            P1 = dE_down * tl.dot(tl.trans(inverse(XS, si, HALF)), dE, input_precision=PREC)
            tl.store(DBETA + bt, tl.sum(P1 * WK, 1), mask=valid)
            tl.store(DQWK + si_t, P1 * beta[:, None], mask=strict)
            P1, P1_down = scaled(P1, HALF)
            tl.debug_barrier()  # every thread has read its intra-block gradients
            tl.store(DSI + si, -P1_down * tl.dot(P1, tl.trans(E), input_precision=PREC))
    elif PART == 1:
        if CARRIED:
            # U = X diag(b) W, dU = -QW^T dQt - W dM, P2 = X^T dU, and dW = diag(b) P2 - U dM^T:
            # their columns go in slabs of at most 64, and dM in blocks (registers), so no [BT, D]
            # or [D, D] tile is held whole
            QW = operand(tl.where(lower, dot_rows(Q, W, src, m2, BT, DS, NS, HALF, PREC), 0.0), HALF)
            dL = tl.zeros([BT, BT], dtype=tl.float32)
            dQW = tl.zeros([BT, BT], dtype=tl.float32)
            db = tl.zeros([BT], dtype=tl.float32)
            for c in tl.static_range(NS):
                dqt, dqt_down = scaled(tl.load(DQT + dst + c * DS), HALF)
                du = -dqt_down * tl.dot(tl.trans(QW), dqt, input_precision=PREC)
                for r in tl.static_range(NS):
                    dm, dm_down = scaled(tl.load(DP + dpi + (r * DS * D + c * DS), volatile=True), HALF)
                    du -= dm_down * tl.dot(load_op(W, src + r * DS, m2, HALF), dm, input_precision=PREC)
                du, du_down = scaled(du, HALF)
                P2 = du_down * tl.dot(tl.trans(inverse(XS, si, HALF)), du, input_precision=PREC)
                w = load_f32(W, src + c * DS, m2)
                db += tl.sum(P2 * w, 1)
                u = operand(tl.dot(inverse(XS, si, HALF), operand(w * beta[:, None], HALF),
                                   input_precision=XPREC), HALF)
                P2s, P2_down = scaled(P2, HALF)
                dL += P2_down * tl.dot(P2s, tl.trans(u), input_precision=PREC)
                dQW -= dqt_down * tl.dot(dqt, tl.trans(u), input_precision=PREC)
                if NS == 1:  # dQW is complete (QW = tril(Q W^T)): dW takes dQW^T Q before its store
                    dQW = tl.where(lower, tl.load(DQWK + si) + dQW, 0.0)
                    dQWs, dQW_down = scaled(dQW, HALF)
                for r in tl.static_range(NS):  # dW's slab r: -U_c (dM's block (r, c))^T
                    dm, dm_down = scaled(tl.load(DP + dpi + (r * DS * D + c * DS), volatile=True), HALF)
                    dw = -dm_down * tl.dot(u, tl.trans(dm), input_precision=PREC)
                    if r == c:
                        dw += P2 * beta[:, None]
                    if c > 0:
                        dw += tl.load(DW + src + r * DS, mask=m2, other=0.0)
                    if NS == 1:
                        dw += dQW_down * tl.dot(tl.trans(dQWs), load_op(Q, src, m2, HALF), input_precision=PREC)
                    tl.store(DW + src + r * DS, dw, mask=m2)
            tl.store(DBETA + bt, tl.load(DBETA + bt, mask=valid, other=0.0) + db, mask=valid)
            tl.store(DSI + si, tl.load(DSI + si) - dL)
            if NS > 1:  # dQW is complete: dW += dQW^T Q, slab by slab (registers)
                dQWs, dQW_down = scaled(tl.where(lower, tl.load(DQWK + si) + dQW, 0.0), HALF)
                tl.debug_barrier()  # dW is read back by other threads
                for c in tl.static_range(NS):
                    dw = tl.load(DW + src + c * DS, mask=m2, other=0.0)
                    dw += dQW_down * tl.dot(tl.trans(dQWs), load_op(Q, src + c * DS, m2, HALF), input_precision=PREC)
                    tl.store(DW + src + c * DS, dw, mask=m2)
        else:
            # dU and with it P2 are zero: dQW is part 0's, and dW begins with dQW^T Q
            dQWs, dQW_down = scaled(tl.where(lower, tl.load(DQWK + si), 0.0), HALF)
            for c in tl.static_range(NS):
                tl.store(DW + src + c * DS,
                         dQW_down * tl.dot(tl.trans(dQWs), load_op(Q, src + c * DS, m2, HALF), input_precision=PREC),
                         mask=m2)
        # dQ += dQW W
        for c in tl.static_range(NS):
            dq = tl.load(DQ + src + c * DS, mask=m2, other=0.0)
            dq += dQW_down * tl.dot(dQWs, load_op(W, src + c * DS, m2, HALF), input_precision=PREC)
            tl.store(DQO + src + c * DS, dq, mask=m2)
    else:
        # R = diag(b) M2 with M2 = X^T W, dR = -WK dKt, P3 = X diag(b) dR: column slabs, as in
        # part 1
        dL = tl.zeros([BT, BT], dtype=tl.float32)
        dWK = tl.zeros([BT, BT], dtype=tl.float32)
        db = tl.zeros([BT], dtype=tl.float32)
        if CARRIED:
            WK = tl.where(strict, dot_rows(W, K, src, m2, BT, DS, NS, HALF, PREC), 0.0)
            for c in tl.static_range(NS):
                dkt, dkt_down = scaled(tl.load(DKT + dst + c * DS), HALF)
                dR = -dkt_down * tl.dot(operand(WK, HALF), dkt, input_precision=PREC)
                dRb, dRb_down = scaled(dR * beta[:, None], HALF)
                P3 = dRb_down * tl.dot(inverse(XS, si, HALF), dRb, input_precision=PREC)
                M2 = tl.dot(tl.trans(inverse(XS, si, HALF)), load_op(W, src + c * DS, m2, HALF),
                            input_precision=XPREC)
                db += tl.sum(dR * M2, 1)
                P3s, P3_down = scaled(P3, HALF)
                dL -= P3_down * tl.dot(operand(M2, HALF), tl.trans(P3s), input_precision=PREC)
                dWK -= dkt_down * tl.dot(operand(M2 * beta[:, None], HALF), tl.trans(dkt), input_precision=PREC)
                if NS > 1:  # where the head is one slab, P3 joins dW's other terms below
                    tl.store(DW + src + c * DS, tl.load(DW + src + c * DS, mask=m2, other=0.0) + P3, mask=m2)
        # dL and dWK are complete: L = strictly_lower(diag(b) W W^T), WK = strictly_lower(W K^T)
        dL = tl.where(strict, tl.load(DSI + si) + dL, 0.0)
        dWK, dWK_down = scaled(tl.where(strict, tl.load(DQWK + si_t) + dWK, 0.0), HALF)
        db += tl.sum(dL * dot_rows(W, W, src, m2, BT, DS, NS, HALF, PREC), 1)
        tl.store(DBETA + bt, tl.load(DBETA + bt, mask=valid, other=0.0) + db, mask=valid)
        dLb, dLb_down = scaled(dL * beta[:, None], HALF)
        if NS > 1:
            tl.debug_barrier()  # dW is read back by other threads
        for c in tl.static_range(NS):
            dw = tl.load(DW + src + c * DS, mask=m2, other=0.0)
            if CARRIED:
                if NS == 1:
                    dw += P3
            w = load_op(W, src + c * DS, m2, HALF)
            dw += dLb_down * (tl.dot(dLb, w, input_precision=PREC) + tl.dot(tl.trans(dLb), w, input_precision=PREC))
            dw += dWK_down * tl.dot(dWK, load_op(K, src + c * DS, m2, HALF), input_precision=PREC)
            tl.store(DW + src + c * DS, dw, mask=m2)
            dk = tl.load(DK + src + c * DS, mask=m2, other=0.0)
            dk += dWK_down * tl.dot(tl.trans(dWK), load_op(W, src + c * DS, m2, HALF), input_precision=PREC)
            tl.store(DKO + src + c * DS, dk, mask=m2)


def prep_backward(part, q, k, w, beta, dQt, dKt, dSI, dM, X, dQWK, dq, dk, dq_out, dk_out, dw, dbeta, dGl, scale,
                  *, has_hh, has_gate, prec, xprec, half, launch_opts):
    """One of the three parts (0, 1, 2, in order) of the preprocessing backward, one program per
    (block, batch*head); without w only part 0 has work.

    q, k, w, dq, dk, dq_out, dk_out, dw: [B, T, H, D]; beta, dbeta: [B, T, H]; dQt, dKt:
    [B, H, Tp, D]; dSI: the intra-block logits' gradient [B, H, N, BT, BT], overwritten with dL;
    dM: [B, H, N, D, D]; X: the block inverses; dQWK: scratch [B, H, N, BT, BT]; dGl: the gate's
    intra-block gradient [B, H, Tp]. dq and dk sum in float32; the part that completes each
    writes it to dq_out and dk_out (which may be dq and dk). With one block (N = 1) dQt, dKt
    and dM are zero and not read. Absent inputs are stubs."""
    B, T, H, D = q.shape
    N, BT = dSI.shape[2], dSI.shape[-1]
    prep_bwd_kernel[(N, B * H)](
        q, k, w, beta, dQt, dKt, dSI, dM, X, dQWK,
        dq, dk, dq_out, dk_out, dw, dbeta, dGl,
        T, H, N, float(scale),
        D=D, BT=BT, PART=part, HAS_HH=has_hh, HAS_GATE=has_gate, PREC=prec, XPREC=xprec, HALF=half,
        CARRIED=N > 1, **launch_opts,
    )
