"""Blockwise PaTH attention in plain torch: the training path on machines without Triton.

The same blocks as the GPU kernel (ATTENTION.md, "The blockwise algorithm"), written with
batched matmuls so that autograd supplies the backward. For blocks of C = 64 tokens:

1. Per block, one C x C unit lower-triangular solve (the UT form) gives the block's
   Householder product H_last ... H_first = I - W^T U with U = A^-1 diag(beta) W, and from the
   same solve the intra-block logits, each query moved to its block's start and each key
   moved to its block's end.
2. Every query block then walks left over the key blocks, one block per step (all query
   blocks advance together): the logits against a key block are moved-queries times
   moved-keys, and crossing a block applies its product, q^T <- q^T - (q^T W^T) U.

Work is O(T^2 D + T C D) and there is no T x T triangular solve; compared with the
materialised reference (reference.py) only the solve disappears, which is what dominates
there. The logits of all blocks are gathered into one [T, T] matrix and normalised by an
ordinary softmax: the memory is the same O(T^2) as the reference, fine on a CPU at the
sequence lengths of this benchmark.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pathbench.kernels.softmax import compute_dtype

BLOCK = 64


def path_attention_blockwise(q, k, v, w=None, beta=None, log_fgate=None, scale=None, block=BLOCK):
    """PaTH / PaTH-FoX / FoX attention [B, T, H, D] -> [B, T, H, D], equal to the reference.

    Computed in float32 (float64 for float64 inputs), returned in q's dtype. w=None gives
    FoX (or plain causal softmax attention when log_fgate is None too).
    """
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    n = -(-T // block)  # number of blocks
    pad = n * block - T

    def blocks(x):  # [B, T, H, ...] -> [B, H, n, block, ...], zero-padded to whole blocks
        x = x.to(dtype).transpose(1, 2)
        return F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad)).unflatten(2, (n, block))

    # Padding tokens get beta = 0, so their H is the identity; and no real query sees them.
    q, k, v = blocks(q * scale), blocks(k), blocks(v)
    if w is None:
        q_start, k_end, intra = q, k, q @ k.transpose(-1, -2)
        products = None
    else:
        q_start, k_end, intra, products = _transport_within_blocks(q, k, blocks(w), blocks(beta))
    causal = torch.ones(block, block, dtype=torch.bool, device=q.device).tril()

    # logits[d]: query block p against key block p - d, for p = d .. n-1, [B, H, n - d, C, C].
    logits = [intra.masked_fill(~causal, float("-inf"))]
    q_moving = q_start[:, :, 1:]  # query blocks 1..n-1, to meet the key block to their left
    for distance in range(1, n):
        logits.append(q_moving @ k_end[:, :, : n - distance].transpose(-1, -2))
        q_moving = q_moving[:, :, 1:]  # query block `distance` has met all its keys
        if products is not None:  # the others cross key block p - distance
            q_moving = q_moving @ products[:, :, 1 : n - distance]
    if log_fgate is not None:
        g = blocks(torch.cumsum(log_fgate.to(dtype), dim=1))  # G_t, [B, H, n, C]
        logits = [s + g[:, :, d:, :, None] - g[:, :, : n - d, None, :] for d, s in enumerate(logits)]

    # Softmax over all key blocks of each query row; the shift is any upper bound of the row.
    def align(x, d):  # a per-distance tensor over query blocks d..n-1 -> over all n blocks
        return F.pad(x, (0, 0) * (x.dim() - 3) + (d, 0))

    row_max = torch.stack([align(s.amax(-1), d) for d, s in enumerate(logits)]).amax(0)
    row_max = row_max.detach()[..., None]  # the softmax does not depend on it
    weights = [torch.exp(s - row_max[:, :, d:]) for d, s in enumerate(logits)]
    total = sum(align(e.sum(-1), d) for d, e in enumerate(weights))
    out = sum(align(e @ v[:, :, : n - d], d) for d, e in enumerate(weights)) / total[..., None]
    return out.flatten(2, 3)[:, :, :T].transpose(1, 2).to(out_dtype)


def _transport_within_blocks(q, k, w, beta):
    """Everything one block's UT solve gives, for inputs [B, H, n, C, D] (beta [B, H, n, C]).

    Returns q moved to its block's start ((H_i ... H_first)^T q_i), k moved to its block's end
    (H_last ... H_{j+1} k_j), the intra-block logits q_i^T H_i ... H_{j+1} k_j (unmasked), and
    each block's whole product H_last ... H_first as a [D, D] matrix (for row vectors: q^T P).
    """
    block, D = q.shape[-2], q.shape[-1]
    beta = beta[..., None]
    eye = torch.eye(block, dtype=q.dtype, device=q.device)
    strictly_lower = torch.ones(block, block, dtype=torch.bool, device=q.device).tril(-1)
    lower = strictly_lower | eye.bool()
    # A = I + strictly_lower(diag(beta) W W^T); the block product is I - W^T U, U = A^-1 diag(beta) W,
    # and A^-1 restricted to [s, t] serves every interval inside the block.
    a = eye + (beta * (w @ w.transpose(-1, -2))).masked_fill(~strictly_lower, 0.0)
    a_inv = torch.linalg.solve_triangular(a, eye.expand_as(a), upper=False, unitriangular=True)
    qw = (q @ w.transpose(-1, -2)).masked_fill(~lower, 0.0)  # [i, s]: H_s acts on q_i if s <= i
    wk = (w @ k.transpose(-1, -2)).masked_fill(~strictly_lower, 0.0)  # [t, j]: on k_j if t > j
    solved_wk = a_inv @ (beta * wk)
    u = a_inv @ (beta * w)

    intra = q @ k.transpose(-1, -2) - qw @ solved_wk
    q_start = q - qw @ u
    k_end = k - solved_wk.transpose(-1, -2) @ w
    products = torch.eye(D, dtype=q.dtype, device=q.device) - w.transpose(-1, -2) @ u
    return q_start, k_end, intra, products
