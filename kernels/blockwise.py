"""Blockwise PaTH attention in plain torch: the training path on machines without Triton.

The blocks of the GPU kernel (triton_path/README.md, "The blockwise algorithm"), written with
batched matmuls. For blocks of C = 64 tokens:

1. Within each block (`_WithinBlocks`): one C x C unit lower-triangular matrix, inverted once,
   gives the intra-block logits, each query moved to its block's start, each key moved to its
   block's end, and the block's whole Householder product H_last ... H_first as a D x D matrix.
2. Across blocks (`_AcrossBlocks`): the keys of earlier blocks are carried forward block by
   block, as in the recurrent form (recurrent.py) but a block at a time: crossing block p
   applies its product to all of them (k <- P_p k), then block p's own keys, moved to its end,
   join them. A query block moved to its start then meets every earlier key in one matmul, its
   row of logits is complete, and an ordinary softmax and a matmul with the values finish it.
   (The GPU kernel moves queries instead; the cost is the same, O(T^2 D^2 / C) in all, but here
   a query block's whole row is one large matmul rather than one small matmul per key block.)

Both steps have hand-written backward passes that reuse what the forward computed (the block
inverses, the attention weights, the carried keys): autograd through the same operations
solved the triangular systems a second time and gave every slice it took a gradient the size of
the whole tensor. The backward's cost is about twice the forward's matmuls and little else.

There is no T x T triangular solve: the work is O(T^2 D) for the logits and the values,
O(T^2 D^2 / C) for carrying the keys and O(T C (C + D)) within the blocks; the attention
weights take O(T^2) memory, like the reference, which is fine on a CPU at this benchmark's
lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from pathbench.kernels.softmax import compute_dtype

BLOCK = 64
# Blocks per batch of the within-block algebra: small enough that its dozen intermediates stay
# in the CPU's caches.
WITHIN_CHUNK = 32


def path_attention_blockwise(q, k, v, w=None, beta=None, log_fgate=None, scale=None, block=BLOCK):
    """PaTH / PaTH-FoX / FoX attention [B, T, H, D] -> [B, T, H, D], equal to the reference.

    Computed in float32 (float64 for float64 inputs) whatever autocast says, returned in q's
    dtype. w=None gives FoX (or plain causal softmax attention when log_fgate is None too).
    """
    # autocast would give the block algebra's matmuls 16-bit operands (and refuse the ones
    # written into float32 buffers); the backward passes below turn it off as well
    with torch.autocast(q.device.type, enabled=False):
        return _blockwise(q, k, v, w, beta, log_fgate, scale, block)


def _blockwise(q, k, v, w, beta, log_fgate, scale, block):
    B, T, H, D = q.shape
    # A sequence shorter than a block takes one block of the next power of two: the padding's
    # work grows as the block's square (a word problem of 8 tokens in a block of 64 did 64x).
    block = min(block, 1 << (T - 1).bit_length())
    scale = D**-0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    n = -(-T // block)  # number of blocks
    pad = n * block - T

    def padded(x):  # [B, T, H, ...] -> [B, n * block, H, ...]; F.pad would copy even with pad 0
        x = x.to(dtype)
        return F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x

    def blocks(x):  # [B, T, H, ...] -> [n, B * H, block, ...]: a block of every head is a batch
        x = padded(x).unflatten(1, (n, block)).movedim((1, 3), (0, 2))
        return x.flatten(1, 2).contiguous()

    # Padding tokens get beta = 0, so their H is the identity; and no real query sees them.
    q, k = blocks(q * scale), blocks(k)
    v = padded(v).transpose(1, 2).flatten(0, 1)  # [B * H, n * block, D]
    if w is None:
        causal = torch.ones(block, block, dtype=torch.bool, device=q.device).tril()
        q_start, k_end, products = q, k, None
        intra = (q @ k.mT).masked_fill(~causal, float("-inf"))
    else:
        q_start, k_end, intra, products = _WithinBlocks.apply(q, k, blocks(w), blocks(beta))
    g = None
    if log_fgate is not None:  # G_t, [B * H, n * block]
        g = padded(torch.cumsum(log_fgate.to(dtype), dim=1)).transpose(1, 2).flatten(0, 1)
    out = _AcrossBlocks.apply(q_start, k_end, intra, products, v, g)
    return out[:, :T].unflatten(0, (B, H)).transpose(1, 2).to(out_dtype)


class _WithinBlocks(torch.autograd.Function):
    """Everything one block's UT form gives, for q, k, w [..., C, D] and beta [..., C].

    Returns q moved to its block's start ((H_i ... H_first)^T q_i), k moved to its block's end
    (H_last ... H_{j+1} k_j), the intra-block logits q_i^T H_i ... H_{j+1} k_j (-inf above the
    diagonal), and each block's whole product P = H_last ... H_first as a [D, D] matrix.

    With A = I + strictly_lower(diag(beta) W W^T), U = A^-1 diag(beta) W and
    Y = A^-1 diag(beta) wk, where qw[i, s] = q_i.w_s for s <= i (H_s acts on q_i) and
    wk[t, j] = w_t.k_j for t > j (H_t acts on k_j), zero elsewhere:

        intra = Q K^T - qw Y,   q_start = Q - qw U,   k_end = K - Y^T W,   P = I - W^T U.

    A^-1 restricted to [s, t] is the inverse of A restricted to [s, t], so the one inverse
    serves every interval inside the block.
    """

    @staticmethod
    def forward(ctx, q, k, w, beta):
        blocks_shape, (C, D) = q.shape[:-2], q.shape[-2:]
        q, k, w = (x.flatten(0, -3) for x in (q, k, w))
        beta = beta.flatten(0, -2)[..., None]
        outputs = (torch.empty_like(q), torch.empty_like(k), q.new_empty(len(q), C, C),
                   q.new_empty(len(q), D, D))
        ctx.saved = []
        for start in range(0, len(q), WITHIN_CHUNK):
            rows = slice(start, start + WITHIN_CHUNK)
            ctx.saved.append(_within_forward(q[rows], k[rows], w[rows], beta[rows],
                                             *(x[rows] for x in outputs)))
        return tuple(x.unflatten(0, blocks_shape) for x in outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_q_start, d_k_end, d_intra, d_products):
        with torch.autocast(d_q_start.device.type, enabled=False):
            return _WithinBlocks._backward(ctx, d_q_start, d_k_end, d_intra, d_products)

    @staticmethod
    def _backward(ctx, d_q_start, d_k_end, d_intra, d_products):
        blocks_shape = d_q_start.shape[:-2]
        d_outputs = [x.flatten(0, -3) for x in (d_q_start, d_k_end, d_intra, d_products)]
        d_q, d_k, d_w = (torch.empty_like(d_outputs[0]) for _ in range(3))
        d_beta = d_q.new_empty(d_q.shape[:-1])
        for saved, start in zip(ctx.saved, range(0, len(d_q), WITHIN_CHUNK)):
            rows = slice(start, start + WITHIN_CHUNK)
            _within_backward(saved, *(x[rows] for x in d_outputs),
                             *(x[rows] for x in (d_q, d_k, d_w, d_beta)))
        return tuple(x.unflatten(0, blocks_shape) for x in (d_q, d_k, d_w, d_beta))


def _within_forward(q, k, w, beta, q_start, k_end, intra, products):
    """`_WithinBlocks`'s outputs for q, k, w [M, C, D] and beta [M, C, 1], written into the last
    four arguments; returns what `_within_backward` needs."""
    C, D = q.shape[-2:]
    gram = w @ w.mT
    # The inverse itself rather than solves against each right-hand side: torch's batched CPU
    # solver is slow, the inverse is needed again in the backward, and a matmul with it is
    # cheap. The solver reads only the strictly lower part of beta * gram.
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    a_inv = torch.linalg.solve_triangular(beta * gram, eye.expand_as(gram), upper=False,
                                          unitriangular=True)
    qw = (q @ w.mT).tril_()
    wk = (w @ k.mT).tril_(-1)
    u = a_inv @ (beta * w)
    y = a_inv @ (beta * wk)
    torch.bmm(q, k.mT, out=intra).baddbmm_(qw, y, alpha=-1)
    intra.masked_fill_(eye.new_ones(C, C, dtype=torch.bool).triu_(1), float("-inf"))
    torch.baddbmm(q, qw, u, alpha=-1, out=q_start)
    torch.baddbmm(k, y.mT, w, alpha=-1, out=k_end)
    torch.baddbmm(torch.eye(D, dtype=q.dtype, device=q.device), w.mT, u, alpha=-1, out=products)
    return q, k, w, beta, gram, a_inv, qw, wk, u, y


def _within_backward(saved, d_q_start, d_k_end, d_intra, d_products, d_q, d_k, d_w, d_beta):
    """Gradients of `_within_forward`'s inputs from its outputs', written into the last four
    arguments (d_beta [M, C])."""
    q, k, w, beta, gram, a_inv, qw, wk, u, y = saved
    d_intra = d_intra.tril()  # the entries above the diagonal are constants (-inf)
    # Gradients of the four outputs' terms qw Y, qw U, Y^T W, W^T U (each is subtracted).
    d_qw = (d_intra @ y.mT).baddbmm_(d_q_start, u.mT).neg_().tril_()
    d_y = (qw.mT @ d_intra).baddbmm_(w, d_k_end.mT).neg_()
    d_u = (qw.mT @ d_q_start).baddbmm_(w, d_products).neg_()
    torch.bmm(y, d_k_end, out=d_w).baddbmm_(u, d_products.mT).neg_()
    # U and Y solve A X = diag(beta) R for R = W, wk: the right-hand sides get A^-T dX, and A
    # gets -(A^-T dX) X^T, of which only its strictly lower part is a variable.
    d_rhs_u, d_rhs_y = a_inv.mT @ d_u, a_inv.mT @ d_y
    d_a = (d_rhs_u @ u.mT).baddbmm_(d_rhs_y, y.mT).neg_().tril_(-1)
    torch.sum(d_a * gram, dim=-1, out=d_beta)
    d_beta += (d_rhs_u * w).sum(-1) + (d_rhs_y * wk).sum(-1)
    d_gram = beta * d_a
    d_wk = (beta * d_rhs_y).tril_(-1)
    d_w.addcmul_(beta, d_rhs_u)
    d_w.baddbmm_(d_gram + d_gram.mT, w).baddbmm_(d_qw.mT, q).baddbmm_(d_wk, k)
    torch.baddbmm(d_q_start, d_intra, k, out=d_q).baddbmm_(d_qw, w)
    torch.baddbmm(d_k_end, d_intra.mT, q, out=d_k).baddbmm_(d_wk.mT, w)


class _AcrossBlocks(torch.autograd.Function):
    """Attention output [N, n C, D] from the blocks' transports (N = batch x heads).

    q_start and k_end are [n, N, C, D], intra [n, N, C, C] (-inf above the diagonal), products
    [n, N, D, D] (None for FoX: nothing to carry), v [N, n C, D], g the cumulative log forget
    gate [N, n C] (None without the gate).
    """

    @staticmethod
    def forward(ctx, q_start, k_end, intra, products, v, g):
        n, N, C, D = q_start.shape
        outputs, probs, keys = [], [], []
        carried = k_end.new_empty(N, 0, D)  # keys of blocks 0 .. p-1 seen from block p's start
        for p in range(n):
            seen = (p + 1) * C  # logits: [N, C, seen], keys 0 .. seen - 1
            logits = torch.cat([q_start[p] @ carried.mT, intra[p]], dim=-1)
            if g is not None:
                # The gate's G_i - G_j without G_i: a constant along a softmax row changes
                # neither the weights nor, therefore, any gradient.
                logits -= g[:, None, :seen]
            probs.append(torch.softmax(logits, dim=-1))
            outputs.append(probs[p] @ v[:, :seen])
            keys.append(carried)
            if p < n - 1:  # carry the keys across block p (P_p k, as rows k^T P_p^T)
                if products is not None:
                    carried = carried @ products[p].mT
                carried = torch.cat([carried, k_end[p]], dim=1)
        out = torch.cat(outputs, dim=1)
        ctx.save_for_backward(q_start, products, v, out)
        ctx.probs, ctx.keys, ctx.has_gate = probs, keys, g is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        with torch.autocast(d_out.device.type, enabled=False):
            return _AcrossBlocks._backward(ctx, d_out)

    @staticmethod
    def _backward(ctx, d_out):
        q_start, products, v, out = ctx.saved_tensors
        probs, keys = ctx.probs, ctx.keys
        n, N, C, D = q_start.shape
        d_q_start = torch.empty_like(q_start)
        d_k_end = torch.zeros_like(q_start)  # the last block's keys and product are never used
        d_intra = q_start.new_empty(n, N, C, C)
        d_products = None if products is None else torch.zeros_like(products)
        d_v = torch.zeros_like(v)
        d_g = v.new_zeros(N, n * C) if ctx.has_gate else None
        # Softmax backward: d logits = p * (d p - sum_j p_j d p_j), and that sum is d_out . out.
        d_out = d_out.contiguous()
        row_dots = (d_out * out).sum(-1, keepdim=True)
        d_carried = None  # gradient of the keys seen from block p + 1's start
        for p in reversed(range(n)):
            rows, seen = slice(p * C, (p + 1) * C), (p + 1) * C
            d_v[:, :seen].baddbmm_(probs[p].mT, d_out[:, rows])
            d_logits = (d_out[:, rows] @ v[:, :seen].mT).sub_(row_dots[:, rows]).mul_(probs[p])
            if d_g is not None:
                d_g[:, :seen] -= d_logits.sum(1)
            d_intra[p] = d_logits[..., p * C:]
            d_cross = d_logits[..., : p * C]
            torch.bmm(d_cross, keys[p], out=d_q_start[p])
            d_keys = d_cross.mT @ q_start[p]
            if d_carried is not None:  # keys seen from block p + 1 = [keys[p] P_p^T, k_end[p]]
                d_k_end[p] = d_carried[:, p * C:]
                d_moved = d_carried[:, : p * C]
                if products is not None:
                    torch.bmm(d_moved.mT, keys[p], out=d_products[p])
                    d_moved = d_moved @ products[p]
                d_keys += d_moved
            d_carried = d_keys
        return d_q_start, d_k_end, d_intra, d_products, d_v, d_g
