"""The recurrent form of attention: one token at a time, for generation.

PaTH's logit q_t^T H_t ... H_{j+1} k_j reads as "key j as seen from position t". Keeping every
cached key in that form makes decoding ordinary attention: when token t arrives, every cached
key is updated in place, k_j <- H_t k_j = k_j - beta_t w_t (w_t . k_j), and then k_t is
appended as it is (the empty product). One step costs O(t D) per head, like a softmax KV cache.

The same cache serves every variant: nope and sba store keys unchanged (rope stores them
already rotated), fox and path_fox also store the cumulative log forget gate G_j, and the
readout is either a softmax or stick-breaking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pathbench.kernels.softmax import compute_dtype


class RecurrentCache:
    """Keys, values and cumulative log gates of every position so far, for one layer.

    Tensors are [B, H, N, D] (keys, values) and [B, H, N] (gates), N = positions seen.
    """

    def __init__(self):
        self.keys = None
        self.values = None
        self.log_gates = None  # G_j = sum of log f up to and including j
        self.length = 0

    def append(self, k, v, w=None, beta=None, log_fgate=None):
        """Add one token: k, v, w [B, H, D]; beta, log_fgate [B, H].

        With w, first apply H_t = I - beta_t w_t w_t^T to every cached key (the new key itself
        is not transformed: H_t acts only on keys before t). The cache is kept in float32 (or
        float64), since every key goes through one update per later token.
        """
        dtype = compute_dtype(k.dtype)
        if w is not None and self.keys is not None:
            w = w.to(dtype)
            along_w = self.keys @ w[..., :, None]  # [B, H, N, 1]
            self.keys.sub_(beta.to(dtype)[..., None, None] * along_w * w[:, :, None, :])
        gate = None
        if log_fgate is not None:
            previous = 0.0 if self.log_gates is None else self.log_gates[..., -1]
            gate = (previous + log_fgate.to(dtype))[..., None]
        self.keys = _append(self.keys, k.to(dtype)[:, :, None, :])
        self.values = _append(self.values, v.to(dtype)[:, :, None, :])
        self.log_gates = _append(self.log_gates, gate)
        self.length += 1

    def logits(self, q, scale=None):
        """Logits of query q [B, H, D] (the newest position) against every cached key, [B, H, N]."""
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        logits = scale * (self.keys @ q.to(self.keys.dtype)[..., :, None])[..., 0]
        if self.log_gates is not None:
            logits = logits + self.log_gates[..., -1:] - self.log_gates
        return logits

    def softmax_readout(self, q, scale=None):
        """Softmax attention output of query q [B, H, D] over the cache, [B, H, D]."""
        probs = torch.softmax(self.logits(q, scale), dim=-1)
        return (probs[..., None, :] @ self.values)[..., 0, :].to(q.dtype)

    def stick_breaking_readout(self, q, scale=None):
        """Stick-breaking output of q [B, H, D]: the newest key takes its share first."""
        z = self.logits(q, scale)
        log_remain = F.logsigmoid(-z)
        later = log_remain.flip(-1).cumsum(-1).flip(-1)  # sum over m >= j
        later = F.pad(later[..., 1:], (0, 1))  # sum over m > j
        weights = (F.logsigmoid(z) + later).exp()
        return (weights[..., None, :] @ self.values)[..., 0, :].to(q.dtype)


def _append(cache, item):
    if item is None:
        return None
    return item if cache is None else torch.cat([cache, item], dim=2)
