"""Materialised PaTH attention: every logit from the global UT form of the Householder products
(triton_path/README.md, "The algebra"), in plain torch.

Cost O(T^2 D + T^3) time and O(T^2) memory: the obviously-correct reference that every faster
path is tested against, and the source of attention maps for inspection. Not a training path.
"""

from __future__ import annotations

import torch


def path_logits(q, k, w=None, beta=None, log_fgate=None, scale=None):
    """Causal attention logits [B, H, T, T] (masked entries are -inf), computed in q's dtype.

    logit_ij = scale * q_i^T H_i ... H_{j+1} k_j + (G_i - G_j) for j <= i, with
    H_t = I - beta_t w_t w_t^T and G = cumsum(log_fgate). w=None drops the Householder part
    (FoX); log_fgate=None drops the gate (PaTH).
    """
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, T, D]
    logits = qh @ kh.transpose(-1, -2)
    if w is not None:
        wh = w.transpose(1, 2).to(q.dtype)
        bh = beta.transpose(1, 2).to(q.dtype)  # [B, H, T]
        idx = torch.arange(T, device=q.device)
        # T_mat = I + strictly_lower(diag(beta) W W^T); one solve serves every interval [j+1, i].
        t_mat = torch.eye(T, dtype=q.dtype, device=q.device) + torch.tril(
            bh[..., :, None] * (wh @ wh.transpose(-1, -2)), diagonal=-1
        )
        qw = (qh @ wh.transpose(-1, -2)) * (idx[None, :] <= idx[:, None])  # [i, s]: s <= i
        wk = (wh @ kh.transpose(-1, -2)) * (idx[:, None] > idx[None, :])  # [t, j]: t > j
        solved = torch.linalg.solve_triangular(t_mat, bh[..., :, None] * wk, upper=False)
        logits = logits - qw @ solved
    logits = logits * scale
    if log_fgate is not None:
        g = torch.cumsum(log_fgate.transpose(1, 2).to(q.dtype), dim=-1)  # [B, H, T]
        logits = logits + g[..., :, None] - g[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~causal, float("-inf"))


def path_attention_reference(q, k, v, w=None, beta=None, log_fgate=None, scale=None):
    """PaTH / PaTH-FoX / FoX attention output [B, T, H, D] by materialising every logit."""
    probs = torch.softmax(path_logits(q, k, w, beta, log_fgate, scale), dim=-1)
    return (probs @ v.transpose(1, 2).to(probs.dtype)).transpose(1, 2)
