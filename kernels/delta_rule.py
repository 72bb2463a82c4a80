"""Linear recurrent token mixers in plain torch: the delta rule (DeltaNet, Gated DeltaNet,
DeltaProduct) and RWKV-7's state update. The CPU path, and the reference of fla-core's fused
operators on a GPU (``pathbench.models.recurrent``).

Each head carries a state S [D_k, D_v] from token to token and reads it with its query,
o_t = scale * S_t^T q_t (layout [B, T, H, D] as every kernel here).

- ``delta_rule_recurrence``: per token, S <- exp(g_t) S (a gate, Gated DeltaNet), then for each
  of its n Householder steps j (n = 1: DeltaNet; n > 1: DeltaProduct)
  S <- S + beta_j k_j (v_j - S^T k_j)^T = (I - beta_j k_j k_j^T) S + beta_j k_j v_j^T.
  With unit keys, I - beta k k^T has the eigenvalue 1 - beta along k: beta in (0, 2) lets it
  be negative, what state tracking needs (Grazzi et al., 2024).
- ``rwkv7_recurrence``: S <- diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T, a vector decay
  and a rank-one correction (RWKV-7 takes a = -kappa, b = kappa * iclr, the removal key and
  its in-context learning rate), in fla-core's argument order for ``chunk_rwkv7``.

The loops are over tokens, each step a few small matmuls per head: cost O(T D^2) and memory
O(T D^2) for autograd, fine at this benchmark's lengths on a CPU. Computed in float32 (float64
for float64 inputs), returned in q's dtype.
"""

from __future__ import annotations

import torch

from pathbench.kernels.softmax import compute_dtype


def delta_rule_recurrence(q, k, v, beta, log_gate=None, scale=None):
    """The (gated, multi-step) delta rule, [B, T, H, D] out.

    q [B, T, H, D]; k, v [B, T, n, H, D] and beta [B, T, n, H]: n Householder steps per token
    (n = 1 for DeltaNet); log_gate [B, T, H] (log of the gate, <= 0) or None; scale defaults
    to D**-0.5.
    """
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    state = q.new_zeros(B, H, D, v.shape[-1])  # [B, H, D_k, D_v]
    outputs = []
    for t in range(T):
        if log_gate is not None:
            state = state * log_gate[:, t].to(dtype).exp()[..., None, None]
        for j in range(k.shape[2]):
            key, value, rate = k[:, t, j], v[:, t, j], beta[:, t, j]  # [B, H, D], [B, H]
            read = torch.einsum("bhkv,bhk->bhv", state, key)  # S^T k
            state = state + torch.einsum("bhk,bhv->bhkv", rate[..., None] * key, value - read)
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return torch.stack(outputs, dim=1).to(out_dtype)


def rwkv7_recurrence(r, w, k, v, a, b, scale=1.0):
    """RWKV-7's state update, [B, T, H, D] out: r (the query), w (log decay, < 0), k, a, b
    [B, T, H, D_k] and v [B, T, H, D_v]."""
    B, T, H, D = r.shape
    out_dtype, dtype = r.dtype, compute_dtype(r.dtype)
    r, w, k, v, a, b = (t.to(dtype) for t in (r, w, k, v, a, b))
    state = r.new_zeros(B, H, D, v.shape[-1])
    outputs = []
    for t in range(T):
        correction = torch.einsum("bhk,bhkv->bhv", a[:, t], state)  # a^T S, before the decay
        state = (w[:, t].exp()[..., None] * state
                 + torch.einsum("bhk,bhv->bhkv", b[:, t], correction)
                 + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t]))
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", state, r[:, t]))
    return torch.stack(outputs, dim=1).to(out_dtype)
