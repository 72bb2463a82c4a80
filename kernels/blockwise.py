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


def path_logits_blockwise(q, k, w=None, beta=None, log_fgate=None, scale=None, block=BLOCK):
    """Causal PaTH logits [B, H, T, T] (masked entries -inf), equal to reference.path_logits.

    Computed in float32 (float64 for float64 inputs). w=None gives FoX (or plain softmax
    logits when log_fgate is None too).
    """
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    qh = q.transpose(1, 2).to(dtype)  # [B, H, T, D]
    kh = k.transpose(1, 2).to(dtype)
    if w is None:
        logits = qh @ kh.transpose(-1, -2)
    else:
        logits = _householder_logits(qh, kh, w.transpose(1, 2).to(dtype),
                                     beta.transpose(1, 2).to(dtype), block)
    logits = logits * scale
    if log_fgate is not None:
        g = torch.cumsum(log_fgate.transpose(1, 2).to(dtype), dim=-1)  # G_t, [B, H, T]
        logits = logits + g[..., :, None] - g[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~causal, float("-inf"))


def _householder_logits(q, k, w, beta, block):
    """q^T H_i ... H_{j+1} k_j for every pair (unmasked, unscaled); inputs [B, H, T, D]."""
    B, H, T, D = q.shape
    n = -(-T // block)  # number of blocks
    pad = n * block - T
    # Padding tokens get beta = 0, so their H is the identity; their rows and columns are
    # cut off at the end.
    q, k, w = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, block, D) for x in (q, k, w))
    beta = F.pad(beta, (0, pad)).view(B, H, n, block, 1)

    eye = torch.eye(block, dtype=q.dtype, device=q.device)
    strictly_lower = torch.ones(block, block, dtype=torch.bool, device=q.device).tril(-1)
    lower = strictly_lower | eye.bool()
    # A = I + strictly_lower(diag(beta) W W^T); its inverse restricted to [s, t] serves every
    # interval inside the block.
    a = eye + (beta * (w @ w.transpose(-1, -2))).masked_fill(~strictly_lower, 0.0)
    a_inv = torch.linalg.solve_triangular(a, eye.expand_as(a), upper=False, unitriangular=True)
    u = a_inv @ (beta * w)  # block product = I - W^T U
    qw = (q @ w.transpose(-1, -2)).masked_fill(~lower, 0.0)  # [i, s]: H_s acts on q_i if s <= i
    wk = (w @ k.transpose(-1, -2)).masked_fill(~strictly_lower, 0.0)  # [t, j]: if t > j
    solved_wk = a_inv @ (beta * wk)

    intra = q @ k.transpose(-1, -2) - qw @ solved_wk
    q_start = q - qw @ u  # (H_i ... H_first)^T q_i: each query moved to its block's start
    k_end = k - solved_wk.transpose(-1, -2) @ w  # H_last ... H_{j+1} k_j: moved to block end

    # logits[b, h, query block, key block, i, j]; blocks above the diagonal stay -inf.
    logits = q.new_full((B, H, n, n, block, block), float("-inf"))
    blocks = torch.arange(n, device=q.device)
    logits[:, :, blocks, blocks] = intra
    q_moving = q_start[:, :, 1:]  # query blocks 1..n-1, to meet key blocks one to their left
    for distance in range(1, n):
        key_blocks = blocks[: n - distance]
        logits[:, :, blocks[distance:], key_blocks] = q_moving @ k_end[:, :, key_blocks].transpose(-1, -2)
        if distance < n - 1:
            # Query block p crosses key block p - distance; the first query block is done.
            q_moving = q_moving[:, :, 1:]
            crossed = blocks[1 : n - distance]
            q_moving = q_moving - (q_moving @ w[:, :, crossed].transpose(-1, -2)) @ u[:, :, crossed]
    logits = logits.transpose(3, 4).reshape(B, H, n * block, n * block)
    return logits[..., :T, :T]


def path_attention_blockwise(q, k, v, w=None, beta=None, log_fgate=None, scale=None, block=BLOCK):
    """PaTH / PaTH-FoX / FoX attention output [B, T, H, D] from the blockwise logits."""
    probs = torch.softmax(path_logits_blockwise(q, k, w, beta, log_fgate, scale, block), dim=-1)
    out = probs @ v.transpose(1, 2).to(probs.dtype)
    return out.transpose(1, 2).to(q.dtype)
