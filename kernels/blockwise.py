"""Blockwise PaTH attention in plain torch: the training path on machines without Triton.

The blocks of the GPU kernel (ATTENTION.md, "The blockwise algorithm"), written with batched
matmuls so that autograd supplies the backward. For blocks of C = 64 tokens:

1. Per block, one C x C unit lower-triangular solve (the UT form) gives the intra-block
   logits, each query moved to its block's start, each key moved to its block's end, and
   the block's whole Householder product H_last ... H_first as a D x D matrix.
2. Each query block walks left over the key blocks: its logits against a key block are its
   moved queries times that block's moved keys, and crossing the block applies the block's
   product (q^T <- q^T P). The row of logits of a query block is then complete, and an
   ordinary softmax and a matmul with the values finish it.

There is no T x T triangular solve: the work is O(T^2 D) for the logits and the values,
O(T^2 D^2 / C) for the transport and O(T C D) for the blocks' own solves; the logits take
O(T^2) memory, like the reference, which is fine on a CPU at this benchmark's lengths.
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
    if log_fgate is not None:
        g = torch.cumsum(log_fgate.to(dtype), dim=1).transpose(1, 2)  # G_t, [B, H, T]
        g = F.pad(g, (0, pad))
    v = v.flatten(2, 3)  # [B, H, n * C, D]

    # Lists of per-block tensors: autograd then gathers each one's gradient once, instead of
    # once per slice of the whole tensor.
    q_start, k_end, intra = q_start.unbind(2), k_end.unbind(2), intra.unbind(2)
    products = None if products is None else products.unbind(2)
    outputs = []
    for p in range(n):
        # Query block p walks left: logits against key block r, then cross it (q^T <- q^T P_r).
        row = [intra[p].masked_fill(~causal, float("-inf"))]
        q_moving = q_start[p]
        for r in range(p - 1, -1, -1):
            row.append(q_moving @ k_end[r].transpose(-1, -2))
            if products is not None and r > 0:
                q_moving = q_moving @ products[r]
        logits = torch.cat(row[::-1], dim=-1)  # [B, H, C, (p + 1) C]: keys 0 .. (p + 1) C - 1
        seen = (p + 1) * block
        if log_fgate is not None:
            logits = logits + g[:, :, p * block : seen, None] - g[:, :, None, :seen]
        outputs.append(torch.softmax(logits, dim=-1) @ v[:, :, :seen])
    out = torch.cat(outputs, dim=2)[:, :, :T]
    return out.transpose(1, 2).to(out_dtype)


def _transport_within_blocks(q, k, w, beta):
    """Everything one block's UT solve gives, for inputs [B, H, n, C, D] (beta [B, H, n, C]).

    Returns q moved to its block's start ((H_i ... H_first)^T q_i), k moved to its block's end
    (H_last ... H_{j+1} k_j), the intra-block logits q_i^T H_i ... H_{j+1} k_j (unmasked), and
    each block's whole product H_last ... H_first as a [D, D] matrix (for row vectors: q^T P).
    """
    block, D = q.shape[-2], q.shape[-1]
    beta = beta[..., None]
    eye = torch.eye(block, dtype=q.dtype, device=q.device)
    upper = torch.ones(block, block, dtype=torch.bool, device=q.device).triu()
    # qw[i, s]: H_s acts on q_i if s <= i; wk[t, j]: H_t acts on k_j if t > j.
    qw = (q @ w.transpose(-1, -2)).masked_fill(upper.triu(1), 0.0)
    wk = (w @ k.transpose(-1, -2)).masked_fill(upper, 0.0)
    # A = I + strictly_lower(diag(beta) W W^T); the block product is I - W^T U with
    # U = A^-1 diag(beta) W, and A^-1 restricted to [s, t] serves every interval inside the block.
    a = eye + (beta * (w @ w.transpose(-1, -2))).masked_fill(upper, 0.0)
    rhs = beta * torch.cat([wk, w], dim=-1)
    # A^-1 rhs, solved as rhs^T A^-T: the same numbers, but torch's CPU solver is about twice as
    # fast this way round for row-major batches.
    solved = torch.linalg.solve_triangular(a.transpose(-1, -2), rhs.transpose(-1, -2), upper=True,
                                           left=False, unitriangular=True).transpose(-1, -2)
    solved_wk, u = solved.split([block, D], dim=-1)
    # What the block's Householders take away from q: within the block, and up to its start.
    moved_intra, moved_start = (qw @ solved).split([block, D], dim=-1)

    intra = q @ k.transpose(-1, -2) - moved_intra
    q_start = q - moved_start
    k_end = k - solved_wk.transpose(-1, -2) @ w
    products = torch.eye(D, dtype=q.dtype, device=q.device) - w.transpose(-1, -2) @ u
    return q_start, k_end, intra, products
