"""Triton PaTH attention: forward and backward, optional forget gate, FoX on the same kernels.

Layout at the API: q, k, v, w are [B, T, H, D]; beta and log_fgate are [B, T, H]. The logit of
query i and key j <= i is scale * q_i^T H_i ... H_{j+1} k_j + (G_i - G_j) with
H_t = I - beta_t w_t w_t^T and G = cumsum(log_fgate) (ATTENTION.md). The kernels' own buffers
are [B, H, T, D]; the within-chunk scan reads v and the output's gradient in place, with their
strides, the other scans read copies in that layout (in place, the queries-first scan was 10% to
15% slower at D = 128, results/kernel/variants_inplace_spans.log).

Algorithm (blocks of BT tokens grouped in chunks of C blocks; ATTENTION.md "blockwise
algorithm"). Eight kernels, one launch each; everything accumulates in float32. Inside the kernels,
logits, G and log-sum-exps are in base 2 (times log2 e), so that each probability is one exp2.

1. Preprocessing (_prep_fwd_kernel, one program per (block, batch*head)). For the block's rows
   (local time order) with W [BT, D], b = beta, Q, K (D in column slabs of at most 64, as in
   the backward: registers):
       L  = strictly_lower(diag(b) W W^T),  X = (I + L)^{-1}   (recursive doubling of
            inverted diagonal blocks, two [BT, BT] products per level)
       U  = X diag(b) W            the block's product is M = H_last ... H_first = I - W^T U
       R  = diag(b) X^T W
       QW = tril(Q W^T)  (s <= i),  WK = strictly_lower(W K^T)  (t > j)
       E  = X diag(b) WK
       Qt = Q - QW U               queries moved to the block start
       Kt = K - WK^T R             keys moved to the block end
       S  = scale (Q K^T - QW E) + G_i - G_j     intra-block logits (masked j <= i later)
       M  = I - W^T U             the block's product, stored dense (D x D) in float32
            (float16 for 16-bit inputs, the precision of the carries' dots)
   Qt and Kt are stored in the data dtype. A dense M makes each carry one [BT, D] x [D, D]
   product instead of two [BT, BT, D] ones. With 16-bit inputs at HALF_BLOCK_HEAD_DIMS the
   products after the inversion take float16 operands.
2. Chunk edges (_edges_fwd_kernel, one program per (chunk, batch*head); chunk_edges_reference
   is the same in torch). Per chunk of blocks 0..C-1: the queries moved to the chunk's start
   Qs_b = Qt_b M_{b-1} ... M_0, the keys moved to its end Kc_b = Kt_b M_{b+1}^T ... M_{C-1}^T,
   and its product Mc = M_{C-1} ... M_0, by carrying the products P_b = M_{b-1} ... M_0 and
   S_b = M_{b+1}^T ... M_{C-1}^T across the chunk's blocks. With
   r_{I,c} = Qs_I Mc_{c_I - 1} ... Mc_{c+1} (the queries of block I at the end of chunk c < c_I),
   the logit of query block I and key block J in chunk c is scale r_{I,c} Kc_J^T: across chunks
   queries are carried once a chunk, not once a block.
3. Forward scan (_path_fwd_kernel, one program per (query block or pair, batch*head)): online
   softmax over S; over the earlier blocks of the own chunk, right to left, with logits
   scale r Kt_J^T (+ gate) and r <- r M_J after each; then from r = Qs over the earlier chunks'
   blocks with logits scale r Kc_J^T and r <- r Mc_c after each chunk. Query blocks may go two
   at a time (QUERY_PAIRS): once the second block's queries have crossed the first block
   (r <- r M_I), the pair's queries stand at one place and cross the earlier blocks and chunks
   as one tile.
4. Backward, in three scans. Write dS = P o (dO V^T - delta) for a pair's logit gradient, with
   delta = rowsum(dO o O), which the first scan computes (and stores for the other two).
   a. Within chunks (_bwd_within_kernel, one program per chunk, or, when one chunk spans the
      sequence, NG programs with consecutive query blocks and about equal work, _within_spans):
      for each query block I, replay r_{I,J} = Qt_I M_{I-1} ... M_{J+1} for the chunk's J < I
      (stored in a scratch), then walk J ascending with the adjoint dr (the gradient of the
      loss with respect to the queries after crossing block J, from key blocks < J):
          dV_J += P^T dO,   dKt_J += scale dS^T r_{I,J},
          dM_J += r_{I,J}^T dr,   dr <- dr M_J^T + scale dS Kt_J,   finally dQt_I = dr.
      The intra-block dS is written per block. Query blocks may go in pairs, as in the forward:
      the pair walks J together, up to the first block's own, then the second block alone
      crosses and attends the first block. With 16-bit inputs the products of dr with r and M
      may take float16 operands, dr scaled into float16's range (HALF_ADJOINT_HEAD_DIMS).
   b. Across chunks, queries first (_bwd_cross_q_kernel): the same walk one chunk at a time,
      from Qs and Kc with Mc: dQs_I, and dMc_c += r_{I,c}^T dr per (query block, chunk). Two
      query blocks of a chunk cross the earlier chunks alike, so at D = 128 they go as one tile.
   c. Across chunks, keys first (_bwd_cross_kv_kernel): a program per key block J carries its
      keys forward a chunk at a time, kf_{c+1} = kf_c Mc_c^T from kf = Kc_J (logits
      scale Qs_I kf^T for query blocks I in chunk c), then walks the query blocks last to first
      with the adjoint dkf <- dkf Mc_c at each chunk: dV_J and dKc_J stay in registers. It forms
      P and dS transposed (keys by queries), as its products P^T dO and dS^T Qs take them.
   d. The chunk edges' backward (_edges_bwd_kernel, one program per chunk): dQs, dKc and dMc
      go back into dQt, dKt and dM through the adjoints of P_b and S_b, from the P_b and S_b
      that the backward's chunk edges stored; the queries' side right after scan b, the keys'
      side after scan c, so that each side's buffers are freed before the next are allocated.
      The first chunk's queries and the last chunk's keys have no program: their terms are 0.
      With 16-bit inputs at HALF_BLOCK_HEAD_DIMS both chunk-edge kernels take float16 operands
      (the adjoints scaled into float16's range) and the whole head at once.
   Chunks may come in levels (_chunk_levels): then a to d run once a level, on each chunk of the
   next level as a sequence of its own (the last level: on the whole sequence), so that a pair of
   blocks goes to the innermost level whose chunks it spans, and the within-chunk scan takes
   only the pairs within the innermost chunks. Gradients add up across levels.
   Partial sums that several programs make (dMc; dV, dKt, dM within a chunk when it has NG
   programs: the last program's are the sums, the others' cover the blocks up to their last
   query block) live in buffers per program and are summed in torch in a fixed order: gradients
   are bitwise reproducible, without atomics.
5. Preprocessing backward (_prep_bwd_kernel, one program per block, in three launches that each
   take one of the products with X below; [BT, D] tiles in column slabs of at most 64), from
   dQt, dKt, dS (the intra-block logits' gradient) and dM, with the block inverse X. The
   backward uses the forward's preprocessing results (Qt, Kt, M, the logits, X), kept for it, or
   runs the preprocessing again when they were not kept. With 16-bit inputs at
   HALF_BLOCK_HEAD_DIMS every product takes float16 operands, each gradient tile scaled into
   float16's range by a power of two (_scaled). With ds = scale dS:
       dQ = dQt + ds K,  dK = dKt + ds^T Q
       dU = -QW^T dQt - W dM,   dW = -U dM^T           (M = I - W^T U; Qt = Q - QW U)
       dE = -QW^T ds,   dR = -WK dKt                    (S term -QW E; Kt = K - WK^T R)
       P1 = X^T dE,  P2 = X^T dU,  P3 = X diag(b) dR    (every product with X, grouped)
       dQW = -dQt U^T - ds E^T,   dWK = diag(b) P1 - R dKt^T
       dW += diag(b) P2 + P3,     db = rowsum(P1 o WK) + rowsum(P2 o W) + rowsum(dR o X^T W)
       dX = dE (diag(b) WK)^T + dU (diag(b) W)^T + W (diag(b) dR)^T, and with
       dL = strictly_lower(-X^T dX X^T) = strictly_lower(-(P1 E^T + P2 U^T + X^T W P3^T)):
       db += rowsum(dL o W W^T),  dW += diag(b) dL W + (diag(b) dL)^T W
       dQ += tril(dQW) W,  dK += strictly_lower(dWK)^T W,  dW += tril(dQW)^T Q + strictly_lower(dWK) K
   The gate: dG_i = sum_j dS_ij - sum_j dS_ji over all pairs (rows and columns from the scans),
   then dlog_fgate = reverse cumsum of dG.

Memory beyond the inputs: O(T (BT + D) + (T / BT) D^2) per head, plus O(NG (T / (C BT)) D^2)
for the programs of the cross-chunk scans, or at most O(NG (T D + (T / BT) D^2)) for those of
one chunk's scan (NG <= MAX_GROUPS); nothing O(T^2).
"""

from __future__ import annotations

import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    triton = None
    tl = None

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_KERNELS = None


def _kernels():
    """Define (decorate) the kernels on first use: triton reads TRITON_INTERPRET at decoration."""
    # the helpers are module globals: kernels look names up there
    global _KERNELS, _carry, _back_across, _sum_so_far, _logits, _softmax_step, _attend, _query_tile, _load_f32, \
        _dot_rows, _head, _load_rows, _operand, _load_op, _inverse, _scaled, _base2
    if _KERNELS is not None:
        return _KERNELS

    @triton.jit
    def _carry(x, mat, cols, D: tl.constexpr, TRANSPOSE: tl.constexpr, HH16: tl.constexpr, PREC: tl.constexpr):
        """x M (or x M^T) for the D x D matrix M at mat: rows carried across a block or chunk."""
        m = tl.load(mat + cols[:, None] * D + cols[None, :])
        if TRANSPOSE:
            m = tl.trans(m)
        if HH16:
            # 16-bit inputs: float16 operands (tf32's mantissa, twice its rate), float32 sums
            xm = tl.dot(x.to(tl.float16), m.to(tl.float16))
        else:
            xm = tl.dot(x, m.to(tl.float32), input_precision=PREC)
        return xm

    @triton.jit
    def _back_across(dr, r, rs, rows, dm, mats, j, added, cols, D: tl.constexpr, RELOAD: tl.constexpr,
                     ADJ16: tl.constexpr, PREC: tl.constexpr, dm_sum=None):
        """The adjoint dr of rows r carried back across M_j, the j-th D x D product at mats: adds
        r^T dr into dL/dM_j (the j-th at dm; stores it there where the program has not added to
        it before: `added`, _sum_so_far) and returns dr M_j^T. r^T dr goes in row slabs of at
        most 64 (smaller layout conversions), each slab of r loaded again from rs (at rows) with
        RELOAD (r is one slab otherwise). dm_sum, for D <= 64 (one slab), is dL/dM_j's partial
        sum that the caller loaded already (_sum_so_far), early, so that its wait overlaps the
        caller's products.

        With ADJ16 (16-bit inputs only: r and M are float16 there) the products take float16
        operands, tf32's mantissa in half the registers and shared memory: dr is scaled into
        float16's range (_scaled)."""
        if ADJ16:
            drs, down = _scaled(dr, True)
        DS: tl.constexpr = 64 if D > 64 else D
        slab = tl.arange(0, DS)
        for sl in tl.static_range(D // DS):
            if RELOAD:
                rsl = tl.load(rs + rows[:, None] * D + sl * DS + slab[None, :]).to(tl.float32)
            else:
                rsl = r
            dm_ptr = dm + j * D * D + (sl * DS + slab)[:, None] * D + cols[None, :]
            if dm_sum is None:
                so_far = _sum_so_far(dm_ptr, added)
            else:
                so_far = dm_sum
            if ADJ16:
                tl.store(dm_ptr, so_far + tl.dot(tl.trans(rsl.to(tl.float16)), drs) * down)
            else:
                tl.store(dm_ptr, tl.dot(tl.trans(rsl), dr, acc=so_far, input_precision=PREC))
        if ADJ16:
            dr = _carry(drs, mats + j * D * D, cols, D, True, True, PREC) * down
        else:
            dr = _carry(dr, mats + j * D * D, cols, D, True, False, PREC)
        return dr

    @triton.jit
    def _sum_so_far(ptr, added):
        """A partial sum at ptr, or 0 where this program has not added to it yet (added false):
        the first addition stores, so that the sums need no zero-filled buffers, whose zeros
        would go to memory and be read back. (The mask is a block: the interpreter takes no
        scalar one.)"""
        return tl.load(ptr, mask=tl.full(ptr.shape, 0, tl.int32) < added, other=0.0)

    @triton.jit
    def _head(X, bh, H, stride_b, stride_h):
        """The first row of head bh (= batch * H + head) of a [B, T, H, D] input read in place."""
        return X + (bh // H) * stride_b + (bh % H) * stride_h

    @triton.jit
    def _load_rows(X, offs, cols, stride_t, T):
        """Rows offs of one head of a tensor read in place, rows stride_t apart (v and dO: X from
        _head; the output: its head's rows); 0 past its T rows."""
        return tl.load(X + offs[:, None] * stride_t + cols[None, :], mask=(offs < T)[:, None], other=0.0)

    @triton.jit
    def _query_tile(QX, DELTA, LSE, offs, cols, Tp, D: tl.constexpr):
        """The rows offs of a backward scan's query tile (its dO is the caller's): its queries in
        QX (float32), delta and log-sum-exp. Rows past the end (Tp) get lse = inf: their
        probabilities are exactly 0, so no gradient flows from them."""
        valid = offs < Tp
        tile = offs[:, None] * D + cols[None, :]
        delta = tl.load(DELTA + offs, mask=valid, other=0.0)
        lse = tl.load(LSE + offs, mask=valid, other=float("inf"))
        r = tl.load(QX + tile, mask=valid[:, None], other=0.0).to(tl.float32)
        return r, delta, lse

    @triton.jit
    def _load_f32(ptr, offs, mask):
        """A [BT, D] tile of a [B, T, H, D] input in float32, loaded again where it is used
        (volatile: not merged with earlier loads) so that it is not kept live in between."""
        return tl.load(ptr + offs, mask=mask, other=0.0, volatile=True).to(tl.float32)

    @triton.jit
    def _operand(x, HALF: tl.constexpr):
        """x as a product's operand: in float16 with HALF, else in float32. For data of 16-bit
        inputs (not gradients, _scaled): their block products are stored in float16 too."""
        if HALF:
            return x.to(tl.float16)
        else:
            return x.to(tl.float32)

    @triton.jit
    def _load_op(ptr, offs, mask, HALF: tl.constexpr):
        """Rows of a [B, T, H, D] input (a tile or a column slab of one) as a product's operand
        (_load_f32, _operand)."""
        return _operand(_load_f32(ptr, offs, mask), HALF)

    @triton.jit
    def _inverse(XS, si, HALF: tl.constexpr):
        """The block inverse X (at XS, si its [BT, BT] offsets) as a product's operand, loaded again
        where it is used (volatile: not kept live in between)."""
        return _operand(tl.load(XS + si, volatile=True), HALF)

    @triton.jit
    def _scaled(g, HALF: tl.constexpr):
        """A gradient tile as a product's operand, and the factor that takes the scale out of its
        products again. With HALF: g times the power of two that brings its largest |g| into
        [2^14, 2^15), in float16 (tf32's mantissa, in half the registers, at twice the rate);
        gradients have no fixed scale, so unscaled they could leave float16's range. The factors
        come from the float32 bits (exact); a tile below 2^-113 is 0 in float16 anyway."""
        if HALF:
            top = tl.max(tl.max(tl.abs(g), 1), 0)
            e = tl.maximum((top.to(tl.int32, bitcast=True) >> 23) - 127, -113)
            up = ((141 - e) << 23).to(tl.float32, bitcast=True)
            down = ((113 + e) << 23).to(tl.float32, bitcast=True)
            return (g * up).to(tl.float16), down
        else:
            return g, 1.0

    @triton.jit
    def _dot_rows(A, B, offs, mask, BT: tl.constexpr, DS: tl.constexpr, NS: tl.constexpr, HALF: tl.constexpr,
                  PREC: tl.constexpr):
        """A B^T in float32 for two [BT, D] tiles of [B, T, H, D] inputs, from their NS column
        slabs of DS (slab c at offs + c * DS), float16 operands with HALF."""
        acc = tl.zeros([BT, BT], dtype=tl.float32)
        for c in tl.static_range(NS):
            acc = tl.dot(_load_op(A, offs + c * DS, mask, HALF), tl.trans(_load_op(B, offs + c * DS, mask, HALF)),
                         acc=acc, input_precision=PREC)
        return acc

    @triton.jit
    def _base2(x):
        """x times log2(e). Logits, gates and log-sum-exps are in base 2 in the kernels, so that a
        probability is one exp2 (tl.exp multiplies every element by log2(e) itself)."""
        return x * 1.4426950408889634

    @triton.jit
    def _logits(r, kt, gq, gk, scale, HAS_GATE: tl.constexpr, PREC: tl.constexpr):
        """The logits of queries r (at key block kt's end) with keys kt, in base 2 (gates too)."""
        s = tl.dot(r.to(kt.dtype), tl.trans(kt), input_precision=PREC) * _base2(scale)
        if HAS_GATE:
            s += gq[:, None] - gk[None, :]
        return s

    @triton.jit
    def _softmax_step(s, v, m, l, acc, PREC: tl.constexpr):
        """One key block of the online softmax, from its logits s: the updated (m, l, acc)."""
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        return m_new, l, acc

    @triton.jit
    def _attend(r, kt, v, m, l, acc, gq, gk, scale, HAS_GATE: tl.constexpr, PREC: tl.constexpr):
        """One key block of the online softmax for queries r: the updated (m, l, acc)."""
        return _softmax_step(_logits(r, kt, gq, gk, scale, HAS_GATE, PREC), v, m, l, acc, PREC)

    @triton.jit(do_not_specialize=["N", "C"])
    def _path_fwd_kernel(
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
                s = tl.where(later, _logits(r, tl.load(KT + tile_h), gq, gk, scale, HAS_GATE, PREC), s)
            v = tl.load(V + tile_h, mask=(offs_h < Tp)[:, None], other=0.0)
            m, l, acc = _softmax_step(s, v, m, l, acc, PREC)
        if HAS_HH & (QB > 1):
            # the second block's queries cross the first block: the tile starts there
            crossed = _carry(r, MB + (bh * N + ib) * D * D, cols, D, False, HH16, PREC)
            r = tl.where((rows >= BT)[:, None], crossed, r)

        # earlier blocks of the same chunk: queries carried one block at a time
        for jj in range(0, ib - first):
            jb = ib - 1 - jj
            offs_j = jb * BT + krows
            tile_j = base + offs_j[:, None] * D + cols[None, :]
            gk = tl.load(G + bh * Tp + offs_j) if HAS_GATE else gq
            m, l, acc = _attend(r, tl.load(KT + tile_j), tl.load(V + tile_j), m, l, acc, gq, gk, scale,
                                HAS_GATE, PREC)
            if HAS_HH:
                r = _carry(r, MB + (bh * N + jb) * D * D, cols, D, False, HH16, PREC)

        # earlier chunks: keys moved to their chunk's end, queries carried a chunk at a time
        if HAS_HH:
            r = tl.load(QS + tile_i, mask=valid[:, None], other=0.0).to(tl.float32)  # at the chunk's start
        for jj in range(0, first):
            jb = first - 1 - jj
            offs_j = jb * BT + krows
            tile_j = base + offs_j[:, None] * D + cols[None, :]
            gk = tl.load(G + bh * Tp + offs_j) if HAS_GATE else gq
            m, l, acc = _attend(r, tl.load(KC + tile_j), tl.load(V + tile_j), m, l, acc, gq, gk, scale,
                                HAS_GATE, PREC)
            if HAS_HH:
                if (jb % C == 0) & (jb > 0):
                    r = _carry(r, MC + (bh * NC + jb // C) * D * D, cols, D, False, HH16, PREC)
        o = acc / l[:, None]
        tl.store(O + tile_i, o.to(O.dtype.element_ty), mask=valid[:, None])
        tl.store(LSE + bh * Tp + offs_i, m + tl.log2(l), mask=valid)

    @triton.jit(do_not_specialize=["T", "H", "N", "C", "NG"])
    def _bwd_within_kernel(
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
        V = _head(V, bh, H, VSB, VSH)  # v and dO in place: [B, T, H, D]
        DO = _head(DO, bh, H, DOSB, DOSH)
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
            tl.store(DK + offs_z[:, None] * D + cols[None, :], tl.zeros([BT, D], dtype=tl.float32))
            if HAS_GATE:
                tl.store(DGCOL + offs_z, tl.zeros([BT], dtype=tl.float32))
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
                    do = _load_rows(DO, offs_h, cols, DOST, T)
                    o = _load_rows(O, offs_h, cols, D, T)
                    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
                    tl.store(DELTA + offs_h, delta)
                    si_ptr = hb * BT * BT + krows[:, None] * BT + krows[None, :]
                    s = tl.load(SI + si_ptr)
                    p = tl.where(causal, tl.exp2(s - tl.load(LSE + offs_h)[:, None]), 0.0)
                    dp = tl.dot(do, tl.trans(_load_rows(V, offs_h, cols, VST, T)), input_precision=PREC)
                    ds = p * (dp - delta[:, None])
                    tl.debug_barrier()  # DSI may be SI itself: every thread has read its logits
                    tl.store(DSI + si_ptr, ds)
                    tl.store(DV + tile_h, tl.dot(tl.trans(p.to(DT)), do, input_precision=PREC))
            tl.debug_barrier()  # delta is read back below by other threads

            offs_i = ib * BT + rows
            valid = offs_i < Tp
            tile_i = offs_i[:, None] * D + cols[None, :]
            do = _load_rows(DO, offs_i, cols, DOST, T)
            r, delta, lse = _query_tile(QT, DELTA, LSE, offs_i, cols, Tp, D)
            if HAS_HH:
                # replay the forward carry of the queries within the chunk, keeping each position
                if QB > 1:
                    # a pair's second block crosses the first alone; the first's rows stay 0 there
                    second = (rows >= BT)[:, None]
                    tl.store(RS + ib * QB * BT * D + rows[:, None] * D + cols[None, :],
                             tl.where(second, r, 0.0).to(RS.dtype.element_ty))
                    r = tl.where(second, _carry(r, MB + ib * D * D, cols, D, False, HH16, PREC), r)
                for jj in range(0, ib - first):
                    jb = ib - 1 - jj
                    tl.store(RS + jb * QB * BT * D + rows[:, None] * D + cols[None, :], r.to(RS.dtype.element_ty))
                    r = _carry(r, MB + jb * D * D, cols, D, False, HH16, PREC)
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
                # so that their wait overlaps them: 4% to 7% off this scan at D = 64
                # (variants_early_sums.log). At D = 128, where dL/dM_jb is two slabs and
                # registers are short, they are loaded where they are used: dV's and dK's alone
                # loaded early made the scan 1% slower, and their pointers made early, 2%.
                EARLY: tl.constexpr = D <= 64
                dm = None
                if EARLY:
                    dv = _sum_so_far(DV + tile_j, dv_added)
                    dk = _sum_so_far(DK + tile_j, added)
                    if HAS_HH:
                        dm = _sum_so_far(DM + jb * D * D + cols[:, None] * D + cols[None, :], added)
                rb = r.to(DT)
                gk = tl.load(G + offs_j) if HAS_GATE else gq
                p = tl.exp2(_logits(rb, kt, gq, gk, scale, HAS_GATE, PREC) - lse[:, None])
                if QB > 1:
                    p = tl.where(rows[:, None] >= (jb + 1 - ib) * BT, p, 0.0)
                    if jb == ib:
                        tl.store(DQT + tile_i, dr, mask=(rows < BT)[:, None])  # the first block is done
                dp = tl.dot(do, tl.trans(_load_rows(V, offs_j, cols, VST, T)), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dsb = (ds * scale).to(DT)
                if not EARLY:
                    dv = _sum_so_far(DV + tile_j, dv_added)
                tl.store(DV + tile_j, tl.dot(tl.trans(p.to(DT)), do, acc=dv, input_precision=PREC))
                if not EARLY:
                    dk = _sum_so_far(DK + tile_j, added)
                tl.store(DK + tile_j, tl.dot(tl.trans(dsb), rb, acc=dk, input_precision=PREC))
                if HAS_GATE:
                    dg_row += tl.sum(ds, 1)
                    dgc_ptr = DGCOL + offs_j
                    tl.store(dgc_ptr, _sum_so_far(dgc_ptr, added) - tl.sum(ds, 0))
                if HAS_HH:
                    # dr is dL/d(queries before block jb); carry it back across the block
                    dr = _back_across(dr, r, rs_j, rows, DM, MB, jb, added, cols, D, D > 64, ADJ16, PREC, dm)
                dr = tl.dot(dsb, kt, acc=dr, input_precision=PREC)
            tl.store(DQT + tile_i, dr, mask=((rows >= (QB - 1) * BT) & valid)[:, None])
            tl.store(DGROW + offs_i, dg_row, mask=valid)

    @triton.jit(do_not_specialize=["N", "C", "NG"])
    def _bwd_cross_q_kernel(
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
            r, delta, lse = _query_tile(QS, DELTA, LSE, offs_i, cols, Tp, D)
            if HAS_HH:
                # replay the chunk-level carry of the queries, keeping them at each chunk's end
                for cc in range(0, ib // C):
                    c = ib // C - 1 - cc
                    tl.store(RS + c * QB * BT * D + rows[:, None] * D + cols[None, :], r.to(RS.dtype.element_ty))
                    if c > 0:
                        r = _carry(r, MC + c * D * D, cols, D, False, HH16, PREC)
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
                        dr = _back_across(dr, r, rs_c, rows, DMCP, MC, c, True, cols, D, (D > 64) | (QB > 1), ADJ16,
                                          PREC)
                for jb in range(c * C, c * C + C):
                    offs_j = jb * BT + krows
                    tile_j = offs_j[:, None] * D + cols[None, :]
                    kc = tl.load(KC + tile_j)
                    gk = tl.load(G + offs_j) if HAS_GATE else gq
                    p = tl.exp2(_logits(r, kc, gq, gk, scale, HAS_GATE, PREC) - lse[:, None])
                    dp = tl.dot(do, tl.trans(tl.load(V + tile_j)), input_precision=PREC)
                    ds = p * (dp - delta[:, None])
                    dr = tl.dot((ds * scale).to(DT), kc, acc=dr, input_precision=PREC)
                    if HAS_GATE:
                        dg_row += tl.sum(ds, 1)
            tl.store(DQS + tile_i, dr, mask=valid[:, None])
            if HAS_GATE:
                tl.store(DGROW + offs_i, tl.load(DGROW + offs_i, mask=valid) + dg_row, mask=valid)

    @triton.jit(do_not_specialize=["N", "C", "NG"])
    def _bwd_cross_kv_kernel(
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
                        kc = _carry(kc, MC + c * D * D, cols, D, True, HH16, PREC)
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
                        dkf = _carry(dkf, MC + c * D * D, cols, D, False, False, PREC)
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
                    pt = tl.exp2(_logits(kf, qs, -gk, -gq, scale, HAS_GATE, PREC) - tl.load(LSE + offs_i)[None, :])
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

    @triton.jit(do_not_specialize=["T", "H", "N"])
    def _prep_fwd_kernel(
        Q, K, W, BETA, G, QT, KT, MB, SI, XO,
        T, H, N, scale,
        D: tl.constexpr, BT: tl.constexpr,
        HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, HPREC: tl.constexpr,
        SAVE_X: tl.constexpr, XPREC: tl.constexpr, HALF: tl.constexpr,
    ):
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
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * _base2(scale)
            if HAS_GATE:
                g = tl.load(G + bh * Tp + t)
                s += g[:, None] - g[None, :]
            tl.store(SI + si, s)
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
                q = _load_op(Q, src_c, m2, HALF)
                k = _load_op(K, src_c, m2, HALF)
                w = _load_op(W, src_c, m2, HALF)
                s = tl.dot(q, tl.trans(k), acc=s, input_precision=PREC)
                QW = tl.dot(q, tl.trans(w), acc=QW, input_precision=PREC)
                WK = tl.dot(w, tl.trans(k), acc=WK, input_precision=PREC)
            QW = tl.where(rows[None, :] <= rows[:, None], QW, 0.0)
            WK = tl.where(rows[:, None] > rows[None, :], WK, 0.0)
            X = _operand(X, HALF)  # from here on only a product's operand
            # intra-block logits: S = Q K^T - QW E, E = X diag(beta) WK
            E = tl.dot(X, _operand(WK * beta[:, None], HALF), input_precision=PREC)
            s = s - tl.dot(_operand(QW, HALF), _operand(E, HALF), input_precision=PREC)
            s = s * _base2(scale)
            if HAS_GATE:
                g = tl.load(G + bh * Tp + t)
                s += g[:, None] - g[None, :]
            tl.store(SI + si, s)
            # per column slab: U = X diag(beta) W, R = diag(beta) X^T W, the queries moved to the
            # block start Qt = Q - QW U, the keys moved to its end Kt = K - WK^T R, and the
            # column slab of the block's product M = I - W^T U, in row slabs
            QW = _operand(QW, HALF)
            WK = _operand(WK, HALF)
            for c in tl.static_range(D // DS):
                src_c = t[:, None] * (H * D) + c * DS + slab[None, :]
                dst_c = t[:, None] * D + c * DS + slab[None, :]
                w = _load_f32(W, src_c, m2)
                u = _operand(tl.dot(X, _operand(w * beta[:, None], HALF), input_precision=HPREC), HALF)
                q = _load_f32(Q, src_c, m2)
                tl.store(QT + dst_c, (q - tl.dot(QW, u, input_precision=PREC)).to(QT.dtype.element_ty))
                r = tl.dot(tl.trans(X), _operand(w, HALF), input_precision=HPREC) * beta[:, None]
                k = _load_f32(K, src_c, m2)
                tl.store(KT + dst_c, (k - tl.dot(tl.trans(WK), _operand(r, HALF), input_precision=PREC))
                         .to(KT.dtype.element_ty))
                for rs in tl.static_range(D // DS):
                    ws = _load_op(W, t[:, None] * (H * D) + rs * DS + slab[None, :], m2, HALF)
                    eye = tl.where((rs * DS + slab)[:, None] == (c * DS + slab)[None, :], 1.0, 0.0)
                    mb = eye - tl.dot(tl.trans(ws), u, input_precision=HPREC)
                    tl.store(MB + (bh * N + ib) * D * D + (rs * DS + slab)[:, None] * D + c * DS + slab[None, :],
                             mb.to(MB.dtype.element_ty))

    @triton.jit(do_not_specialize=["T", "H", "N"])
    def _prep_bwd_kernel(
        Q, K, W, BETA, DQT, DKT, DSI, DP, XS, DQWK,
        DQ, DK, DQO, DKO, DW, DBETA, DGL,
        T, H, N, scale,
        D: tl.constexpr, BT: tl.constexpr, PART: tl.constexpr,
        HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr, XPREC: tl.constexpr, HALF: tl.constexpr,
    ):
        # One of three launches, each grouped around one product with X (the block inverse that
        # the preprocessing stored in XS), so that few [BT, BT] and [BT, D] matrices are live at
        # once: the three parts in turn in one launch spilled 1024 bytes a thread at D = 64
        # (sm_90) and took 2.26 ms against 1.66 on the H200 (results/kernel/variants_prep1.log).
        # The sums that span parts stay in memory, in rows this program alone owns: dQ, dK, dW,
        # dbeta, dQW and dWK (their scratch), and dL, which overwrites the intra-block logits'
        # gradient once part 0 has read it. dQW (lower triangle with the diagonal) and dWK
        # (strictly lower) share one scratch block, dWK transposed into its upper triangle. dQ and
        # dK are summed in float32 (DQ, DK) and written complete in q's dtype (DQO, DKO; they may
        # be DQ, DK).
        #   part 0: dQ = dQt + ds K, dK = dKt + ds^T Q; P1 = X^T dE: dbeta, dWK, dQW, dL
        #   part 1: P2 = X^T dU: dW, dbeta, dL; dQW complete: dQ, dW
        #   part 2: P3 = X diag(b) dR: dW, dbeta; dL and dWK complete: dK, dW, dbeta
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
            ds, ds_down = _scaled(ds * scale, HALF)
            # without w, dQ and dK are complete here
            dq_at = DQ if HAS_HH else DQO
            dk_at = DK if HAS_HH else DKO
            for c in tl.static_range(NS):
                dq = tl.load(DQT + dst + c * DS)
                tl.store(dq_at + src + c * DS,
                         dq + ds_down * tl.dot(ds, _load_op(K, src + c * DS, m2, HALF), input_precision=PREC), mask=m2)
                dk = tl.load(DKT + dst + c * DS)
                tl.store(dk_at + src + c * DS,
                         dk + ds_down * tl.dot(tl.trans(ds), _load_op(Q, src + c * DS, m2, HALF), input_precision=PREC),
                         mask=m2)
            if HAS_HH:
                # E = X diag(b) WK, dE = -QW^T ds, P1 = X^T dE
                QW = tl.where(lower, _dot_rows(Q, W, src, m2, BT, DS, NS, HALF, PREC), 0.0)
                WK = tl.where(strict, _dot_rows(W, K, src, m2, BT, DS, NS, HALF, PREC), 0.0)
                dE, dE_down = _scaled(-ds_down * tl.dot(tl.trans(_operand(QW, HALF)), ds, input_precision=PREC), HALF)
                E = _operand(tl.dot(_inverse(XS, si, HALF), _operand(WK * beta[:, None], HALF),
                                    input_precision=PREC), HALF)
                tl.store(DQWK + si, -ds_down * tl.dot(ds, tl.trans(E), input_precision=PREC), mask=lower)
                P1 = dE_down * tl.dot(tl.trans(_inverse(XS, si, HALF)), dE, input_precision=PREC)
                tl.store(DBETA + bt, tl.sum(P1 * WK, 1), mask=valid)
                tl.store(DQWK + si_t, P1 * beta[:, None], mask=strict)
                P1, P1_down = _scaled(P1, HALF)
                tl.debug_barrier()  # every thread has read its intra-block gradients
                tl.store(DSI + si, -P1_down * tl.dot(P1, tl.trans(E), input_precision=PREC))
        elif PART == 1:
            # U = X diag(b) W, dU = -QW^T dQt - W dM, P2 = X^T dU, and dW = diag(b) P2 - U dM^T:
            # their columns go in slabs of at most 64, and dM in blocks (registers), so no [BT, D]
            # or [D, D] tile is held whole
            QW = _operand(tl.where(lower, _dot_rows(Q, W, src, m2, BT, DS, NS, HALF, PREC), 0.0), HALF)
            dL = tl.zeros([BT, BT], dtype=tl.float32)
            dQW = tl.zeros([BT, BT], dtype=tl.float32)
            db = tl.zeros([BT], dtype=tl.float32)
            for c in tl.static_range(NS):
                dqt, dqt_down = _scaled(tl.load(DQT + dst + c * DS), HALF)
                du = -dqt_down * tl.dot(tl.trans(QW), dqt, input_precision=PREC)
                for r in tl.static_range(NS):
                    dm, dm_down = _scaled(tl.load(DP + dpi + (r * DS * D + c * DS), volatile=True), HALF)
                    du -= dm_down * tl.dot(_load_op(W, src + r * DS, m2, HALF), dm, input_precision=PREC)
                du, du_down = _scaled(du, HALF)
                P2 = du_down * tl.dot(tl.trans(_inverse(XS, si, HALF)), du, input_precision=PREC)
                w = _load_f32(W, src + c * DS, m2)
                db += tl.sum(P2 * w, 1)
                u = _operand(tl.dot(_inverse(XS, si, HALF), _operand(w * beta[:, None], HALF),
                                    input_precision=XPREC), HALF)
                P2s, P2_down = _scaled(P2, HALF)
                dL += P2_down * tl.dot(P2s, tl.trans(u), input_precision=PREC)
                dQW -= dqt_down * tl.dot(dqt, tl.trans(u), input_precision=PREC)
                if NS == 1:  # dQW is complete (QW = tril(Q W^T)): dW takes dQW^T Q before its store
                    dQW = tl.where(lower, tl.load(DQWK + si) + dQW, 0.0)
                    dQWs, dQW_down = _scaled(dQW, HALF)
                for r in tl.static_range(NS):  # dW's slab r: -U_c (dM's block (r, c))^T
                    dm, dm_down = _scaled(tl.load(DP + dpi + (r * DS * D + c * DS), volatile=True), HALF)
                    dw = -dm_down * tl.dot(u, tl.trans(dm), input_precision=PREC)
                    if r == c:
                        dw += P2 * beta[:, None]
                    if c > 0:
                        dw += tl.load(DW + src + r * DS, mask=m2, other=0.0)
                    if NS == 1:
                        dw += dQW_down * tl.dot(tl.trans(dQWs), _load_op(Q, src, m2, HALF), input_precision=PREC)
                    tl.store(DW + src + r * DS, dw, mask=m2)
            tl.store(DBETA + bt, tl.load(DBETA + bt, mask=valid, other=0.0) + db, mask=valid)
            tl.store(DSI + si, tl.load(DSI + si) - dL)
            if NS > 1:  # dQW is complete: dW += dQW^T Q, slab by slab (registers)
                dQWs, dQW_down = _scaled(tl.where(lower, tl.load(DQWK + si) + dQW, 0.0), HALF)
                tl.debug_barrier()  # dW is read back by other threads
                for c in tl.static_range(NS):
                    dw = tl.load(DW + src + c * DS, mask=m2, other=0.0)
                    dw += dQW_down * tl.dot(tl.trans(dQWs), _load_op(Q, src + c * DS, m2, HALF), input_precision=PREC)
                    tl.store(DW + src + c * DS, dw, mask=m2)
            # dQ += dQW W
            for c in tl.static_range(NS):
                dq = tl.load(DQ + src + c * DS, mask=m2, other=0.0)
                dq += dQW_down * tl.dot(dQWs, _load_op(W, src + c * DS, m2, HALF), input_precision=PREC)
                tl.store(DQO + src + c * DS, dq, mask=m2)
        else:
            # R = diag(b) M2 with M2 = X^T W, dR = -WK dKt, P3 = X diag(b) dR: column slabs, as in
            # part 1
            WK = tl.where(strict, _dot_rows(W, K, src, m2, BT, DS, NS, HALF, PREC), 0.0)
            dL = tl.zeros([BT, BT], dtype=tl.float32)
            dWK = tl.zeros([BT, BT], dtype=tl.float32)
            db = tl.zeros([BT], dtype=tl.float32)
            for c in tl.static_range(NS):
                dkt, dkt_down = _scaled(tl.load(DKT + dst + c * DS), HALF)
                dR = -dkt_down * tl.dot(_operand(WK, HALF), dkt, input_precision=PREC)
                dRb, dRb_down = _scaled(dR * beta[:, None], HALF)
                P3 = dRb_down * tl.dot(_inverse(XS, si, HALF), dRb, input_precision=PREC)
                M2 = tl.dot(tl.trans(_inverse(XS, si, HALF)), _load_op(W, src + c * DS, m2, HALF),
                            input_precision=XPREC)
                db += tl.sum(dR * M2, 1)
                P3s, P3_down = _scaled(P3, HALF)
                dL -= P3_down * tl.dot(_operand(M2, HALF), tl.trans(P3s), input_precision=PREC)
                dWK -= dkt_down * tl.dot(_operand(M2 * beta[:, None], HALF), tl.trans(dkt), input_precision=PREC)
                if NS > 1:  # where the head is one slab, P3 joins dW's other terms below
                    tl.store(DW + src + c * DS, tl.load(DW + src + c * DS, mask=m2, other=0.0) + P3, mask=m2)
            # dL and dWK are complete: L = strictly_lower(diag(b) W W^T), WK = strictly_lower(W K^T)
            dL = tl.where(strict, tl.load(DSI + si) + dL, 0.0)
            dWK, dWK_down = _scaled(tl.where(strict, tl.load(DQWK + si_t) + dWK, 0.0), HALF)
            db += tl.sum(dL * _dot_rows(W, W, src, m2, BT, DS, NS, HALF, PREC), 1)
            tl.store(DBETA + bt, tl.load(DBETA + bt, mask=valid, other=0.0) + db, mask=valid)
            dLb, dLb_down = _scaled(dL * beta[:, None], HALF)
            if NS > 1:
                tl.debug_barrier()  # dW is read back by other threads
            for c in tl.static_range(NS):
                dw = tl.load(DW + src + c * DS, mask=m2, other=0.0)
                if NS == 1:
                    dw += P3
                w = _load_op(W, src + c * DS, m2, HALF)
                dw += dLb_down * (tl.dot(dLb, w, input_precision=PREC) + tl.dot(tl.trans(dLb), w, input_precision=PREC))
                dw += dWK_down * tl.dot(dWK, _load_op(K, src + c * DS, m2, HALF), input_precision=PREC)
                tl.store(DW + src + c * DS, dw, mask=m2)
                dk = tl.load(DK + src + c * DS, mask=m2, other=0.0)
                dk += dWK_down * tl.dot(tl.trans(dWK), _load_op(W, src + c * DS, m2, HALF), input_precision=PREC)
                tl.store(DKO + src + c * DS, dk, mask=m2)

    @triton.jit(do_not_specialize=["N", "C"])
    def _edges_fwd_kernel(
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
                    qt = _operand(tl.load(QT + row_ptr + cols[None, :]), HALF)
                    tl.store(QS + row_ptr + slab[None, :],
                             tl.dot(qt, _operand(p, HALF), input_precision=PREC).to(QS.dtype.element_ty))
                    if SAVE:
                        tl.store(PS + saved + b * D * D + in_slab, p.to(PS.dtype.element_ty))
                    m = _operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
                    p = tl.dot(m, _operand(p, HALF), input_precision=PREC)
                tl.store(MC + (bh * NC + c) * D * D + in_slab, p.to(MC.dtype.element_ty))

            if c < NC - 1:
                s = tl.where(cols[:, None] == slab[None, :], 1.0, 0.0)
                for bb in range(0, nb):
                    b = nb - 1 - bb
                    row_ptr = (bh * N * BT + (first + b) * BT + rows)[:, None] * D
                    kt = _operand(tl.load(KT + row_ptr + cols[None, :]), HALF)
                    tl.store(KC + row_ptr + slab[None, :],
                             tl.dot(kt, _operand(s, HALF), input_precision=PREC).to(KC.dtype.element_ty))
                    if SAVE:
                        tl.store(SS + saved + b * D * D + in_slab, s.to(SS.dtype.element_ty))
                    if b > 0:  # S_{-1} is never used
                        m = _operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
                        s = tl.dot(tl.trans(m), _operand(s, HALF), input_precision=PREC)

    @triton.jit(do_not_specialize=["N", "C"])
    def _edges_bwd_kernel(
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
                prod = _operand(tl.load(SAVED + saved + b * D * D + in_slab), HALF)
                dx, dx_down = _scaled(tl.load(DX + row_ptr + slab[None, :]), HALF)
                tl.store(DXT + tile, tl.load(DXT + tile) + dx_down * tl.dot(dx, tl.trans(prod), input_precision=PREC))
                bars, bar_down = _scaled(bar, HALF)
                dm_ptr = DM + (bh * N + first + b) * D * D + square
                if KEYS:
                    if b > 0:
                        tl.store(dm_ptr, tl.load(dm_ptr) + bar_down * tl.dot(prod, tl.trans(bars), input_precision=PREC))
                else:
                    tl.store(dm_ptr, tl.load(dm_ptr) + bar_down * tl.dot(bars, tl.trans(prod), input_precision=PREC))
                x = _operand(tl.load(X + tile), HALF)
                m = _operand(tl.load(MB + (bh * N + first + b) * D * D + square), HALF)
                if KEYS:
                    bar = bar_down * tl.dot(m, bars, input_precision=PREC)
                else:
                    bar = bar_down * tl.dot(tl.trans(m), bars, input_precision=PREC)
                bar += dx_down * tl.dot(tl.trans(x), dx, input_precision=PREC)

    _KERNELS = (_path_fwd_kernel, _bwd_within_kernel, _prep_fwd_kernel, _prep_bwd_kernel,
                _bwd_cross_q_kernel, _bwd_cross_kv_kernel, _edges_fwd_kernel, _edges_bwd_kernel)
    return _KERNELS


# Interpreter (CPU) settings: small blocks so short test sequences span several of them.
# Tests change these to exercise the GPU's block size and several backward programs per head.
INTERPRET_BLOCK = 16
INTERPRET_CHUNKS = (2,)  # blocks per chunk, level by level (_chunk_levels)
INTERPRET_GROUPS = 1
# Programs a head at most in one backward scan (_num_groups). 16 lets the keys-first scan at
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
# From LEVEL_CHUNKS chunks of CHUNK_TOKENS the backward's chunks come in levels (_chunk_levels):
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
# float16 operands (scaled) instead of tf32 (_back_across). At D = 128 that lets the within-chunk
# scan take pairs: 144 KB of shared memory against 272 KB (sm_90, triton 3.9), more than an
# H200 has. At D = 64 it made the queries-first scan slower, 5.07 ms against 4.32 at 16384 tokens.
HALF_ADJOINT_HEAD_DIMS = (128,)
# Head sizes whose 16-bit inputs take float16 operands, tf32's mantissa at twice its rate and in
# half the registers, in the block-local kernels' products: the preprocessing after its
# inversion, its backward and the chunk edges' backward (gradients scaled into float16's range,
# _scaled), and the chunk edges' forward. The chunk edges then hold the whole head, so that the
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
# backward at D = 128) run as one chunk: with them triton 3.6 fails to compile _edges_fwd_kernel
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
# (8, 1) at 16384 tokens of 16 heads. With as many programs as 4-warp scans fill (_num_groups),
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


def _with_fallback(kind: str, key: tuple, D: int, device: torch.device, launch):
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


def _launch(kernel: str, BT: int, D: int, dtype: torch.dtype, num_warps, num_stages) -> dict:
    """Triton launch options of one kernel under the configuration (BT, num_warps, num_stages)."""
    if num_warps is None:  # interpreter: plain launch
        return {}
    table = kernel_launch_table(BT, D, dtype)
    if table is not None:
        num_warps, num_stages = table[kernel]
    elif kernel in _BLOCK_LOCAL:
        num_warps, num_stages = (8 if BT * D >= 4096 else 4), 1
    return {"num_warps": num_warps, "num_stages": num_stages}


def _num_groups(N: int, BH: int, device: torch.device, num_warps=None) -> int:
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


def _within_spans(N: int, C: int, QB: int, NG: int) -> list:
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


def _query_blocks(kernel: str, D: int) -> int:
    """Query blocks a program of kernel ("fwd", "within", "cross_q") takes as one tile at head
    size D: 2 where QUERY_PAIRS says so, else 1."""
    return 2 if D in QUERY_PAIRS[kernel] else 1


def _sum_programs(x: torch.Tensor, programs: int) -> torch.Tensor:
    """The sum over dim 2 of the partial sums of a scan's programs, in a fixed order (so the
    gradients are reproducible); a view when there is one program."""
    return x[:, :, 0] if programs == 1 else x.sum(2)


def _to_blocks(x: torch.Tensor, Tp: int, dtype=torch.float32) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, Tp, ...] in dtype, zero padded at the end of time."""
    x = x.to(dtype).transpose(1, 2)
    pad = Tp - x.shape[2]
    if pad:
        spec = [0, 0] * (x.dim() - 3) + [0, pad]
        x = torch.nn.functional.pad(x, spec)
    return x


_SPANS: dict = {}


def _spans_on(spans: list, device: torch.device) -> torch.Tensor:
    """_within_spans's list as an int32 tensor on device, made once per list: a copy from the host
    waits for the GPU, and a CUDA graph cannot capture one (training runs its first steps
    without a graph)."""
    key = (tuple(spans), device)
    if key not in _SPANS:
        _SPANS[key] = torch.tensor(spans, dtype=torch.int32, device=device)
    return _SPANS[key]


def _in_place(x, dtype):
    """A [B, T, H, D] input in dtype as the within-chunk scan reads it, in place: (x, its strides
    of batch, time and head), its rows unit-strided."""
    x = x.to(dtype)
    if x.stride(3) != 1:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1), x.stride(2)


def _hh_dtype(q):
    """dtype of the stored block products M and of the backward's replayed queries:
    float32 for float32 inputs; float16 (the precision of the carries' dots) for 16-bit ones."""
    return torch.float32 if q.dtype == torch.float32 else torch.float16


def _kernel_inputs(q, k, w, beta):
    """q, k, w, beta contiguous in the [B, T, H(, D)] layout, in dtypes the kernels load.

    w and beta go to float32; q and k keep their dtype (bfloat16 becomes float32 under the CPU
    interpreter, which has no bfloat16 arithmetic)."""
    if q.device.type != "cuda" and q.dtype == torch.bfloat16:
        q, k = q.float(), k.float()
    q, k = q.contiguous(), k.contiguous()
    if w is not None:
        w, beta = w.float().contiguous(), beta.float().contiguous()
    return q, k, w, beta


def _prepare(q, k, w, beta, G, scale, BT, N, prec, sd, launch_opts, save_x):
    """Block-local algebra (Triton, one program per block): (Qt, Kt, M, SI, X), M None without w,
    X (the blocks' inverses [B, H, N, BT, BT], for the backward) None without save_x. X is
    float16 where the block-local kernels take float16 operands (_half_blocks), since the
    backward's products take it so: rounded once when stored, not at every load."""
    B, T, H, D = q.shape
    dev = q.device
    Tp = N * BT
    f32 = dict(dtype=torch.float32, device=dev)
    has_hh = w is not None
    dummy = _dummy(dev)
    Qt = torch.empty(B, H, Tp, D, dtype=sd, device=dev)
    Kt = torch.empty(B, H, Tp, D, dtype=sd, device=dev)
    Mb = torch.empty(B, H, N, D, D, dtype=_hh_dtype(q), device=dev) if has_hh else None
    SI = torch.empty(B, H, N, BT, BT, **f32)
    half = _half_blocks(q.dtype, D)
    X = (torch.empty(B, H, N, BT, BT, dtype=torch.float16 if half else torch.float32, device=dev)
         if has_hh and save_x else None)
    _kernels()[2][(N, B * H)](
        q, k, w if has_hh else dummy, beta if has_hh else dummy, dummy if G is None else G,
        Qt, Kt, dummy if Mb is None else Mb, SI, dummy if X is None else X,
        T, H, N, float(scale),
        D=D, BT=BT, HAS_HH=has_hh, HAS_GATE=G is not None, PREC=prec, HPREC=_hprec(q.dtype, dev),
        SAVE_X=X is not None, XPREC=_xprec(q.dtype, dev), HALF=half, **launch_opts,
    )
    return Qt, Kt, Mb, SI, X


def _gate_cumsum(log_fgate, Tp):
    """G = cumsum(log_fgate) in blocks, in base 2 (times log2(e)), as the kernels' logits are."""
    if log_fgate is None:
        return None
    return (torch.cumsum(_to_blocks(log_fgate, Tp), dim=-1) * math.log2(math.e)).contiguous()


def _prec(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of float32 dots: float32-accurate for float32 inputs (exact under the
    interpreter, three-pass tf32 on the GPU); tf32 for 16-bit inputs, whose data dots run in
    their own dtype."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _xprec(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of the block inversion's products (and of the other products with the inverse
    where the block-local kernels keep float32 operands): float32-accurate for float32 inputs; tf32
    for 16-bit ones (a relative error of about 1e-3 in the block products, the size of their
    float16 storage; three-pass tf32 there spilled registers heavily on the H200)."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _hprec(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of the products that build the Householder factors (the inversion's input, and
    the rest where the preprocessing keeps float32 operands): float32-accurate for
    float32 inputs; tf32 for 16-bit ones, whose block products are stored in float16 (three-pass
    tf32 took twice the preprocessing time there, H200, results/kernel/launch.log)."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _half_blocks(dtype: torch.dtype, D: int) -> bool:
    """Whether the block-local kernels take float16 operands (HALF) for inputs of dtype (the data's,
    or the block products' for the chunk edges) at head size D: 16-bit ones at HALF_BLOCK_HEAD_DIMS."""
    return dtype != torch.float32 and D in HALF_BLOCK_HEAD_DIMS


def _dummy(device):
    return torch.zeros(1, dtype=torch.float32, device=device)


def _storage_dtype(q):
    """dtype of the data tensors the kernels read (q and k moved, v, dO) and of their dots.

    q's own dtype, except bfloat16 under the CPU interpreter, whose bfloat16 dot is wrong
    (numpy has no bfloat16): there the data stay float32.
    """
    if q.device.type != "cuda" and q.dtype == torch.bfloat16:
        return torch.float32
    return q.dtype


def _spec_key(kind, q, has_hh, has_gate):
    """The kernel specialisation a configuration is chosen for. Its last entry is the sequence
    length up to a power of two and at most the largest block, because short sequences take
    smaller blocks (gpu_configs)."""
    largest = max(c[0] for c in _GPU_CONFIGS[kind][q.shape[-1]])
    length = min(1 << (q.shape[1] - 1).bit_length(), largest)
    return (kind, q.shape[-1], q.dtype, has_hh, has_gate, q.device.index, length)


def _chunk_levels(N: int, BT: int, D: int, device: torch.device, one_chunk_tokens: int) -> tuple:
    """Blocks per chunk, level by level, innermost first: keys and queries cross whole chunks in
    one product each. The within-chunk scan takes the pairs within the innermost chunks; the
    cross-chunk scans of a level take the pairs across its chunks within one chunk of the next
    level (within the sequence, at the last level). One chunk, (N,), up to one_chunk_tokens.

    On the GPU, levels double from CHUNK_TOKENS while the sequence holds at least LEVEL_CHUNKS
    chunks of the longest (more than LEVEL_CHUNKS from SHORT_LEVEL_TOKENS on). Each chunk of an
    outer level runs as a sequence of its own (a view), so outer levels whose chunks do not divide
    the sequence go, and so does a level whose chunks span it. On the GPU a sequence left with one
    level of more than LEVEL_CHUNKS chunks takes chunks of LONG_CHUNK_TOKENS instead (_one_level).
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
        levels = (_one_level(N, BT),)
    if levels[0] < N and any(C % 2 for C in levels):
        raise ValueError(f"chunks of {levels} blocks: with several chunks each count must be even")
    return levels


def _forward_chunk(N: int, BT: int, D: int, device: torch.device) -> int:
    """Blocks per chunk of the forward: one chunk up to FWD_ONE_CHUNK_TOKENS; on the GPU beyond
    that, chunks of CHUNK_TOKENS while the sequence holds at most LEVEL_CHUNKS of them and of
    LONG_CHUNK_TOKENS beyond, not the backward's levels. Longer chunks slowed the forward: 3.28
    against 3.20 ms at D = 128, T = 16384, in chunks of 2048 tokens against 1024; at 4096 tokens,
    1.83 against 1.81 in chunks of 1024 against 512 (results/kernel/variants_levels.log,
    variants_levels_more.log). Under the interpreter, the outermost level of INTERPRET_CHUNKS that
    the sequence takes."""
    C = _chunk_levels(N, BT, D, device, FWD_ONE_CHUNK_TOKENS)[-1]
    if C == N or device.type != "cuda":
        return C
    return _one_level(N, BT)


def _one_level(N: int, BT: int) -> int:
    """Blocks per chunk where the chunks on the GPU come in one level: CHUNK_TOKENS while the
    sequence holds at most LEVEL_CHUNKS of them, LONG_CHUNK_TOKENS beyond."""
    return CHUNK_TOKENS // BT if N <= LEVEL_CHUNKS * (CHUNK_TOKENS // BT) else LONG_CHUNK_TOKENS // BT


def _chunk_edges(Qt, Kt, Mb, C, prec, launch_opts, save=False):
    """Queries moved to their chunk's start, keys to their chunk's end, and each chunk's product
    (_edges_fwd_kernel; chunk_edges_reference is the same in torch): Qs, Kc [B, H, Tp, D] in
    Qt's dtype and Mc [B, H, NC, D, D] in Mb's, plus, with save, the products before and after
    each block [B, H, NC, C, D, D] that _chunk_edges_backward needs, also in Mb's dtype. The
    first chunk's Qs, Mc and products before, and the last chunk's Kc and products after, are
    left unset: the scans and the backward do not read them."""
    B, H, Tp, D = Qt.shape
    N = Mb.shape[2]
    NC = -(-N // C)
    dev = Qt.device
    Qs, Kc = torch.empty_like(Qt), torch.empty_like(Kt)
    Mc = torch.empty(B, H, NC, D, D, dtype=Mb.dtype, device=dev)
    PS = SS = _dummy(dev)
    if save:
        PS = torch.empty(B, H, NC, C, D, D, dtype=Mb.dtype, device=dev)
        SS = torch.empty_like(PS)
    _kernels()[6][(NC, B * H)](
        Qt, Kt, Mb, Qs, Kc, Mc, PS, SS, N, C,
        D=D, BT=Tp // N, SAVE=save, PREC=prec, HALF=_half_blocks(Mb.dtype, D), **launch_opts,
    )
    return Qs, Kc, Mc, PS, SS


def _chunk_edges_backward(X, Mb, saved, dX, dMc, dXt, dM, C, prec, launch_opts):
    """Add one side of the chunk edges' gradients into dXt and dM (float32, in place): the
    queries' (X = Qt, saved = PS, dX = dQs, with dMc) or, with dMc None, the keys' (X = Kt,
    saved = SS, dX = dKc). Two launches, so that each side's buffers can go before the other's
    scan; each has a program a chunk but one (the first chunk's queries, the last chunk's keys:
    their terms are zero, and dX is not read there). float16 operands where the block products
    are float16 (_half_blocks)."""
    B, H, Tp, D = X.shape
    N = Mb.shape[2]
    _kernels()[7][(-(-N // C) - 1, B * H)](
        X, Mb, saved, dX, _dummy(X.device) if dMc is None else dMc, dXt, dM, N, C,
        D=D, BT=Tp // N, KEYS=dMc is None, PREC=prec, HALF=_half_blocks(Mb.dtype, D), **launch_opts,
    )


def chunk_edges_reference(Qt, Kt, Mb, C):
    """_chunk_edges in plain torch, differentiable (the tests' reference for the kernels).

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


def _forward(q, k, v, w, beta, log_fgate, scale, keep=False):
    """(O, LSE, kept): with keep, kept is the block-local results (Qt, Kt, M, SI, X) for the
    backward, else None."""
    B, T, H, D = q.shape
    dev = q.device
    sd = _storage_dtype(q)
    has_hh, has_gate = w is not None, log_fgate is not None
    qk, kk, wk, bk = _kernel_inputs(q, k, w, beta)
    prec = _prec(q.dtype, dev)

    def launch(BT, num_warps, num_stages):
        N = -(-T // BT)
        Tp = N * BT
        C = _forward_chunk(N, BT, D, dev)
        Gf = _gate_cumsum(log_fgate, Tp)

        def opts(kernel):
            return _launch(kernel, BT, D, q.dtype, num_warps, num_stages)

        Qt, Kt, Mb, SI, X = _prepare(qk, kk, wk, bk, Gf, scale, BT, N, prec, sd, opts("prep_fwd"), keep)
        Qs, Kc, Mc = Qt, Kt, None
        if has_hh and N > C:
            Qs, Kc, Mc, _, _ = _chunk_edges(Qt, Kt, Mb, C, prec, opts("edges_fwd"))
        dummy = _dummy(dev)
        O = torch.empty(B, H, Tp, D, dtype=q.dtype, device=dev)
        LSE = torch.empty(B, H, Tp, dtype=torch.float32, device=dev)
        QB = _query_blocks("fwd", D)
        _kernels()[0][(-(-N // QB), B * H)](
            Qt, Qs, Kt, Kc, _to_blocks(v, Tp, sd).contiguous(),
            dummy if Mb is None else Mb, dummy if Mc is None else Mc,
            dummy if Gf is None else Gf,
            SI, O, LSE,
            N, C, float(scale),
            D=D, BT=BT, QB=QB, HAS_HH=has_hh, HAS_GATE=has_gate,
            PREC=prec, HH16=q.dtype != torch.float32, **opts("fwd"),
        )
        return O[:, :, :T], LSE[:, :, :T], (Qt, Kt, Mb, SI, X) if keep else None

    return _with_fallback("fwd", _spec_key("fwd", q, has_hh, has_gate), D, dev, launch)


def _across_chunks(C, Qt, Kt, Mb, V, dO, G, lse, delta, dQt, dKt, dV, dM, dGrow, dGcol, *, scale, scan, adj16,
                   opts, hh_dtype):
    """Add the gradients of the pairs of blocks in different chunks of C blocks (scans b to d of the
    backward) into dQt, dKt, dV, dM, dGrow and dGcol, all [B, H, Tp, ...] in place; queries cross
    to their chunk's start, keys to their chunk's end. Mb, G, dM and dGcol may be the dummy."""
    B, H, Tp, D = Qt.shape
    BT, has_hh, prec = scan["BT"], scan["HAS_HH"], scan["PREC"]
    N = Tp // BT
    NC = -(-N // C)
    dev = Qt.device
    f32 = dict(dtype=torch.float32, device=dev)
    dummy = _dummy(dev)
    if has_hh:
        Qs, Kc, Mc, PS, SS = _chunk_edges(Qt, Kt, Mb, C, prec, opts("edges_fwd"), save=True)
    else:
        Qs, Kc, Mc = Qt, Kt, dummy
    # dQs and dL/dMc (queries first, QB blocks at a time), NGq programs per head with their own
    # partial sums
    QB = _query_blocks("cross_q", D)
    NGq = _num_groups(-(-(N - C) // QB), B * H, dev, opts("cross_q").get("num_warps"))
    dQs = torch.empty(B, H, Tp, D, **f32)  # the first chunk's rows are neither written nor read
    dMcp = torch.zeros(B, H, NGq, NC, D, D, **f32) if has_hh else dummy
    RSc = torch.empty(B, H, NGq, NC, QB * BT, D, dtype=hh_dtype, device=dev) if has_hh else dummy
    _kernels()[4][(NGq, B * H)](
        Qs, Kc, V, Mc, G, lse, dO, delta,
        dQs, dMcp, dGrow, RSc,
        N, C, NGq, float(scale), QB=QB, ADJ16=adj16, **scan, **opts("cross_q"),
    )
    del RSc
    if has_hh:
        dMc = _sum_programs(dMcp, NGq)
        _chunk_edges_backward(Qt, Mb, PS, dQs, dMc.contiguous(), dQt, dM, C, prec, opts("edges_bwd"))
        del dMc, dMcp, PS
    else:
        dQt[:, :, C * BT:] += dQs[:, :, C * BT:]
    del dQs
    # dKc and the rest of dV (keys first)
    NGk = _num_groups((NC - 1) * C, B * H, dev, opts("cross_kv").get("num_warps"))
    dKc = torch.empty(B, H, Tp, D, **f32)  # the last chunk's rows are neither written nor read
    KS = torch.empty(B, H, NGk, NC, BT, D, dtype=hh_dtype, device=dev) if has_hh else dummy
    _kernels()[5][(NGk, B * H)](
        Qs, Kc, V, Mc, G, lse, dO, delta,
        dKc, dV, dGcol, KS,
        N, C, NGk, float(scale), **scan, **opts("cross_kv"),
    )
    del KS
    if has_hh:
        _chunk_edges_backward(Kt, Mb, SS, dKc, None, dKt, dM, C, prec, opts("edges_bwd"))
    else:
        dKt[:, :, :(NC - 1) * C * BT] += dKc[:, :, :(NC - 1) * C * BT]


def _backward(q, k, v, w, beta, log_fgate, scale, O, LSE, grad_out, kept=None):
    """Gradients (dq, dk, dv, dw, dbeta, dlog_fgate): dq and dk in q's dtype, dv in v's dtype and
    layout, the rest in float32, dlog_fgate in log_fgate's layout (None where an input is None).
    kept: the forward's block-local results, used when its blocks were the backward's; their
    intra-block logits are overwritten with their gradient."""
    B, T, H, D = q.shape
    dev = q.device
    sd = _storage_dtype(q)
    has_hh, has_gate = w is not None, log_fgate is not None
    qk, kk, wk, bk = _kernel_inputs(q, k, w, beta)
    prec = _prec(q.dtype, dev)
    if not (O.stride(0) == H * O.stride(1) and O.stride(2) == D and O.stride(3) == 1):
        O = O.contiguous()  # the within-chunk scan reads O's rows in place, heads O.stride(1) apart
    # the kept results serve one attempt at most: the within-chunk scan overwrites their logits
    unused = [kept] if kept is not None else []

    def launch(BT, num_warps, num_stages):
        N = -(-T // BT)
        Tp = N * BT
        levels = _chunk_levels(N, BT, D, dev, ONE_CHUNK_TOKENS)
        C = levels[0]
        NC = -(-N // C)
        pad = (0, Tp - T)
        Gf = _gate_cumsum(log_fgate, Tp)
        f32 = dict(dtype=torch.float32, device=dev)

        def opts(kernel):
            return _launch(kernel, BT, D, q.dtype, num_warps, num_stages)

        scan = dict(D=D, BT=BT, HAS_HH=has_hh, HAS_GATE=has_gate, PREC=prec, HH16=q.dtype != torch.float32)
        adj16 = q.dtype != torch.float32 and D in HALF_ADJOINT_HEAD_DIMS  # _back_across
        # the block-local results: the forward's when its blocks were these, else computed again
        kept_now = unused.pop() if unused else None
        if kept_now is not None and kept_now[3].shape[2:] == (N, BT, BT):
            Qt, Kt, Mb, SI, XB = kept_now
        else:
            Qt, Kt, Mb, SI, XB = _prepare(qk, kk, wk, bk, Gf, scale, BT, N, prec, sd, opts("prep_fwd"), True)
        dSI = SI  # the intra-block logits' gradient overwrites them
        # the within-chunk scan reads v and dO in place; the scans across chunks, in blocks
        V, *vs = _in_place(v, sd)
        dO, *dos = _in_place(grad_out, sd)
        delta = torch.empty(B, H, Tp, **f32)  # rowsum(dO o O), written by the within-chunk scan
        lse = torch.nn.functional.pad(LSE, pad).contiguous()
        dummy = _dummy(dev)
        G = Gf if has_gate else dummy

        # 1. pairs of blocks within a chunk, query blocks QBw at a time: NGw programs per chunk
        # (several only when one chunk spans the sequence) with consecutive query tiles; the sums
        # of all but the last are packed, and added to the last one's in program order
        QBw = _query_blocks("within", D)
        NGw = _num_groups(-(-N // QBw), B * H, dev, opts("within").get("num_warps")) if NC == 1 else 1
        spans = _within_spans(N, C, QBw, NGw)
        packed = sum(nb for _, _, nb, _ in spans[:-1])  # blocks per head of the other programs' sums
        dQt = torch.empty(B, H, Tp, D, **f32)
        # (the scan sets every one of its sums: no zeros here)
        dKt = torch.empty(B, H, Tp, D, **f32)
        dV = torch.empty(B, H, Tp, D, **f32)
        dM = torch.empty(B, H, N, D, D, **f32) if has_hh else dummy
        dGrow = torch.empty(B, H, Tp, **f32)
        dGcol = torch.empty(B, H, Tp, **f32) if has_gate else dummy
        dKp = torch.empty(B * H * packed * BT * D, **f32) if packed else dummy
        dVp = torch.empty(B * H * packed * BT * D, **f32) if packed else dummy
        dMp = torch.empty(B * H * packed * D * D, **f32) if packed and has_hh else dummy
        dGcolp = torch.empty(B * H * packed * BT, **f32) if packed and has_gate else dummy
        RS = (torch.empty(B * H * (packed + N) * QBw * BT * D, dtype=_hh_dtype(q), device=dev) if has_hh
              else dummy)
        _kernels()[1][(NC * NGw, B * H)](
            Qt, Kt, V, Mb if has_hh else dummy, G, SI, lse, dO, O, delta,
            dQt, dKt, dV, dM, dGrow, dGcol, dKp, dVp, dMp, dGcolp, dSI, RS,
            _spans_on(spans, dev),
            T, H, O.stride(1), N, C, NGw, float(scale), *vs, *dos, QB=QBw, ADJ16=adj16, **scan, **opts("within"),
        )
        del RS
        for sums, part, size in ((dGcol, dGcolp, BT), (dKt, dKp, BT * D), (dV, dVp, BT * D), (dM, dMp, D * D)):
            if part is not dummy:
                for _, _, nb, at in spans[:-1]:
                    region = part[B * H * at * size:B * H * (at + nb) * size]
                    sums.view(B, H, -1)[:, :, :nb * size] += region.view(B, H, -1)
        del dKp, dVp, dMp, dGcolp

        # 2. pairs across chunks, level by level; an outer level's chunks are sequences of their own
        if N > C:
            V = _to_blocks(V, Tp, sd).contiguous()  # V and dO are in sd already: one cast at most
            dO = _to_blocks(dO, Tp, sd).contiguous()
            for level, span in zip(levels, levels[1:] + (N,)):
                # (no name holds the tensors: step 3 frees some of them early)
                _across_chunks(level, *(x if x is dummy else x.view(1, B * H * N // span, -1, *x.shape[3:])
                                        for x in (Qt, Kt, Mb if has_hh else dummy, V, dO, G, lse, delta,
                                                  dQt, dKt, dV, dM, dGrow, dGcol)),
                               scale=scale, scan=scan, adj16=adj16, opts=opts, hh_dtype=_hh_dtype(q))

        # 3. the block-local algebra; dv's float32 sums go first, as dv in v's dtype and layout
        # (a gradient in another layout than its input's is copied again by autograd)
        del V, dO, delta, lse
        dv = torch.empty_like(v).copy_(dV[:, :, :T].transpose(1, 2))
        del dV
        dq = torch.empty(B, T, H, D, **f32)
        dk = torch.empty(B, T, H, D, **f32)
        dw = torch.empty(B, T, H, D, **f32) if has_hh else dummy
        dbeta = torch.empty(B, T, H, **f32) if has_hh else dummy
        dGl = torch.empty(B, H, Tp, **f32) if has_gate else dummy
        # three parts (see _prep_bwd_kernel), in order; without w only part 0 has work. dq and dk
        # sum in float32, and the part that completes each writes it in the kernels' q dtype: its
        # buffer comes just before that part, and dQt and dq's sums go right after it
        dQWK = torch.empty(B, H, N, BT, BT, **f32) if has_hh else dummy  # partial sums between parts
        done_q, done_k = (1, 2) if has_hh else (0, 0)
        dq_out = dk_out = dummy
        for part in range(3 if has_hh else 1):
            if part == done_q:
                dq_out = dq if qk.dtype == torch.float32 else torch.empty_like(dq, dtype=qk.dtype)
            if part == done_k:
                dk_out = dk if qk.dtype == torch.float32 else torch.empty_like(dk, dtype=qk.dtype)
            _kernels()[3][(N, B * H)](
                qk, kk, wk if has_hh else dummy, bk if has_hh else dummy,
                dQt, dKt, dSI, dM if has_hh else dummy, XB if has_hh else dummy, dQWK,
                dq, dk, dq_out, dk_out, dw, dbeta, dGl,
                T, H, N, float(scale),
                D=D, BT=BT, PART=part, HAS_HH=has_hh, HAS_GATE=has_gate, PREC=prec, XPREC=_xprec(q.dtype, dev),
                HALF=_half_blocks(q.dtype, D),
                **opts("prep_bwd"),
            )
            if part == done_q:
                dQt = dq = dummy
        dlf = None
        if has_gate:
            dG = (dGrow + dGcol + dGl)[:, :, :T]  # dL/dG, G = cumsum(log_fgate)
            dlf = torch.empty_like(log_fgate, dtype=torch.float32)  # in log_fgate's layout
            dlf.copy_(dG.flip(-1).cumsum(-1).flip(-1).transpose(1, 2))
        if not has_hh:
            dw = dbeta = None
        return dq_out.to(q.dtype), dk_out.to(q.dtype), dv, dw, dbeta, dlf

    return _with_fallback("bwd", _spec_key("bwd", q, has_hh, has_gate), D, dev, launch)


class _PathAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, log_fgate, scale, grad_needed):
        # the block-local algebra must stay in float32 whatever autocast says
        keep = KEEP_PREPROCESSING and grad_needed
        with torch.autocast(q.device.type, enabled=False), torch.no_grad():
            O, LSE, kept = _forward(q, k, v, w, beta, log_fgate, scale, keep)
        ctx.save_for_backward(q, k, v, w, beta, log_fgate, O, LSE, *(kept or (None,) * 5))
        ctx.scale = scale
        ctx.kept_spent = False
        return O.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, w, beta, log_fgate, O, LSE, *kept = ctx.saved_tensors
        # the backward overwrites the kept intra-block logits with their gradient: a second
        # backward (retain_graph) computes the block-local algebra again
        kept = None if kept[0] is None or ctx.kept_spent else tuple(kept)
        ctx.kept_spent = True
        with torch.autocast(q.device.type, enabled=False):
            grads = _backward(q, k, v, w, beta, log_fgate, ctx.scale, O, LSE, grad_out, kept)
        like = (q, k, v, w, beta, log_fgate)
        return tuple(None if g is None else g.to(x.dtype) for g, x in zip(grads, like)) + (None, None)


def takes(q) -> bool:
    """Whether the kernel takes queries of q's head size and dtype (path_attention's "auto"
    backend runs the torch implementation for those it does not)."""
    return q.dim() == 4 and q.shape[-1] in SUPPORTED_HEAD_DIMS and q.dtype in _FLOATS


def _check(q, k, v, w, beta, log_fgate):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D], got shape {tuple(q.shape)}")
    B, T, H, D = q.shape
    if T < 1:
        raise ValueError("sequence length must be at least 1")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head size D={D} is not supported by the Triton PaTH kernel; supported: {SUPPORTED_HEAD_DIMS}")
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != tuple(q.shape):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected q's shape {tuple(q.shape)} ([B, T, H, D])")
    if (w is None) != (beta is None):
        raise ValueError("w and beta must be given together (PaTH) or both be None (FoX / plain softmax)")
    if w is not None:
        if tuple(w.shape) != tuple(q.shape):
            raise ValueError(f"w has shape {tuple(w.shape)}, expected {tuple(q.shape)} ([B, T, H, D])")
        if tuple(beta.shape) != (B, T, H):
            raise ValueError(f"beta has shape {tuple(beta.shape)}, expected {(B, T, H)} ([B, T, H])")
    if log_fgate is not None and tuple(log_fgate.shape) != (B, T, H):
        raise ValueError(f"log_fgate has shape {tuple(log_fgate.shape)}, expected {(B, T, H)} ([B, T, H])")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in _FLOATS:
            raise ValueError(f"{name} has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, x in (("w", w), ("beta", beta), ("log_fgate", log_fgate)):
        if x is not None and not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    tensors = [x for x in (q, k, v, w, beta, log_fgate) if x is not None]
    if len({x.device for x in tensors}) != 1:
        raise ValueError("all inputs must be on one device")
    dev = q.device
    if triton is None:
        raise RuntimeError("the Triton PaTH kernel needs the 'triton' package")
    if dev.type == "cuda":
        if _interpreting():
            raise RuntimeError("TRITON_INTERPRET=1 is set: the Triton kernel runs only on CPU tensors then")
    elif dev.type == "cpu":
        if not _interpreting():
            raise RuntimeError(
                "the Triton PaTH kernel needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set "
                "before pathbench.kernels.triton_path is imported); use backend='torch' on the CPU"
            )
    else:
        raise RuntimeError(f"the Triton PaTH kernel supports CUDA tensors, not device {dev.type!r}")


def path_attention_triton(q, k, v, w=None, beta=None, log_fgate=None, scale=None):
    """PaTH / PaTH-FoX / FoX attention output [B, T, H, D] on the Triton kernels (autograd-aware).

    w/beta None drops the Householder part (FoX, or plain causal softmax without a gate);
    log_fgate None drops the forget gate. scale defaults to D**-0.5.

    Under torch.compile the kernels are the opaque operators pathbench::path_attention_forward
    and pathbench::path_attention_backward, so a compiled model stays one graph; their backward
    computes the block-local algebra again instead of keeping it from the forward.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if torch.compiler.is_compiling():
        O, _ = torch.ops.pathbench.path_attention_forward(q, k, v, w, beta, log_fgate, float(scale))
        return O.transpose(1, 2)
    _check(q, k, v, w, beta, log_fgate)
    grad_needed = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, w, beta, log_fgate))
    return _PathAttention.apply(q, k, v, w, beta, log_fgate, float(scale), grad_needed)


# The operators torch.compile sees. The forward gives O [B, H, T, D] and the log-sum-exp of
# the logits [B, H, T] (float32), which the backward needs; the backward gives the gradients
# of q, k, v, w, beta and log_fgate in float32, an empty tensor for an input that is None.
@torch.library.custom_op(
    "pathbench::path_attention_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor? w, Tensor? beta, Tensor? log_fgate, "
           "float scale) -> (Tensor, Tensor)")
def _forward_op(q, k, v, w, beta, log_fgate, scale):
    _check(q, k, v, w, beta, log_fgate)
    with torch.autocast(q.device.type, enabled=False):
        O, LSE, _ = _forward(q, k, v, w, beta, log_fgate, scale)
    return O.contiguous(), LSE.contiguous()


@_forward_op.register_fake
def _forward_op_fake(q, k, v, w, beta, log_fgate, scale):
    B, T, H, D = q.shape
    return q.new_empty(B, H, T, D), q.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op(
    "pathbench::path_attention_backward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor? w, Tensor? beta, Tensor? log_fgate, "
           "Tensor O, Tensor LSE, Tensor grad_out, float scale) -> Tensor[]")
def _backward_op(q, k, v, w, beta, log_fgate, O, LSE, grad_out, scale):
    with torch.autocast(q.device.type, enabled=False):
        grads = _backward(q, k, v, w, beta, log_fgate, scale, O, LSE, grad_out)
    return [q.new_empty(0, dtype=torch.float32) if g is None else g.contiguous() for g in grads]


@_backward_op.register_fake
def _backward_op_fake(q, k, v, w, beta, log_fgate, O, LSE, grad_out, scale):
    return [x.new_empty(x.shape) for x in (q, k, v)] + [
        q.new_empty(0, dtype=torch.float32) if x is None else x.new_empty(x.shape, dtype=torch.float32)
        for x in (w, beta, log_fgate)]


def _forward_op_setup(ctx, inputs, output):
    q, k, v, w, beta, log_fgate, scale = inputs
    O, LSE = output
    ctx.mark_non_differentiable(LSE)  # the backward's input, not a result to train through
    ctx.save_for_backward(q, k, v, w, beta, log_fgate, O, LSE)
    ctx.scale = scale


def _forward_op_backward(ctx, grad_O, grad_LSE):
    q, k, v, w, beta, log_fgate, O, LSE = ctx.saved_tensors
    grads = torch.ops.pathbench.path_attention_backward(
        q, k, v, w, beta, log_fgate, O, LSE, grad_O.transpose(1, 2), ctx.scale)
    inputs = (q, k, v, w, beta, log_fgate)
    return tuple(None if x is None else g.to(x.dtype) for g, x in zip(grads, inputs)) + (None,)


torch.library.register_autograd("pathbench::path_attention_forward", _forward_op_backward,
                                setup_context=_forward_op_setup)
