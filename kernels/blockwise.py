"""Blockwise PaTH attention in plain torch: the training path on machines without Triton.

The blocks of the GPU kernel (ATTENTION.md, "The blockwise algorithm"), written with batched
matmuls so that autograd supplies the backward. For blocks of C = 64 tokens:

1. Per block, one C x C unit lower-triangular solve (the UT form) gives the intra-block
   logits, each query moved to its block's start, each key moved to its block's end, and
   the block's whole Householder product H_last ... H_first as a D x D matrix.
2. The keys of earlier blocks are carried forward block by block, as in the recurrent form
   (recurrent.py) but a block at a time: crossing block p applies its product to all of
   them (k <- P_p k), then block p's own keys, moved to its end, join them. A query block
   moved to its start then meets every earlier key in one matmul, its row of logits is
   complete, and an ordinary softmax and a matmul with the values finish it. (The GPU
   kernel moves queries instead; the cost is the same, O(T^2 D^2 / C) in all, but here a
   query block's whole row is one large matmul rather than one small matmul per key block.)

There is no T x T triangular solve: the work is O(T^2 D) for the logits and the values,
O(T^2 D^2 / C) for carrying the keys and O(T C D) for the blocks' own solves; the logits
take O(T^2) memory, like the reference, which is fine on a CPU at this benchmark's lengths.
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
    intra = intra.masked_fill(~causal, float("-inf"))
    q_start, k_end, intra = q_start.unbind(2), k_end.unbind(2), intra.unbind(2)
    products = None if products is None else products.unbind(2)
    outputs = []
    k_moved = None  # keys of blocks 0 .. p-1 as seen from the start of block p, [B, H, p C, D]
    for p in range(n):
        logits = intra[p]
        if k_moved is not None:
            logits = torch.cat([q_start[p] @ k_moved.transpose(-1, -2), logits], dim=-1)
        seen = (p + 1) * block  # logits: [B, H, C, seen], keys 0 .. seen - 1
        if log_fgate is not None:
            logits = logits + g[:, :, p * block : seen, None] - g[:, :, None, :seen]
        outputs.append(torch.softmax(logits, dim=-1) @ v[:, :, :seen])
        if p < n - 1:  # carry the keys across block p (P_p k, as rows k^T P_p^T)
            if k_moved is not None and products is not None:
                k_moved = k_moved @ products[p].transpose(-1, -2)
            k_moved = k_end[p] if k_moved is None else torch.cat([k_moved, k_end[p]], dim=2)
    out = torch.cat(outputs, dim=2)[:, :, :T]
    return out.transpose(1, 2).to(out_dtype)


def _transport_within_blocks(q, k, w, beta):
    """Everything one block's UT solve gives, for inputs [B, H, n, C, D] (beta [B, H, n, C]).

    Returns q moved to its block's start ((H_i ... H_first)^T q_i), k moved to its block's end
    (H_last ... H_{j+1} k_j), the intra-block logits q_i^T H_i ... H_{j+1} k_j (unmasked), and
    each block's whole product P = H_last ... H_first as a [D, D] matrix.
    """
    block, D = q.shape[-2], q.shape[-1]
    beta = beta[..., None]
    upper = torch.ones(block, block, dtype=torch.bool, device=q.device).triu()
    # qw[i, s]: H_s acts on q_i if s <= i; wk[t, j]: H_t acts on k_j if t > j.
    qw = (q @ w.transpose(-1, -2)).masked_fill(upper.triu(1), 0.0)
    wk = (w @ k.transpose(-1, -2)).masked_fill(upper, 0.0)
    # A = I + strictly_lower(diag(beta) W W^T); the block product is I - W^T U with
    # U = A^-1 diag(beta) W, and A^-1 restricted to [s, t] serves every interval inside the block.
    # The solver reads only the strictly lower part of `a` (unitriangular), so it is not masked.
    a = beta * (w @ w.transpose(-1, -2))
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
