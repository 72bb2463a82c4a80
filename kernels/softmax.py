"""Softmax attention with or without rotary embedding (nope, rope), and stick-breaking (sba).

Plain torch, any device and float dtype, layout [B, T, H, D]. nope and rope go through
torch's ``scaled_dot_product_attention`` (a fused causal kernel wherever one exists), except
for sequences of at most SHORT_SEQUENCE tokens (the word problems'), which take two batched
matrix products and a softmax: a fused kernel works in tiles of 64 or 128 positions, nearly
all of them padding at such lengths.
Stick-breaking has no softmax to fuse, so it is written out in log space; it materialises the
[T, T] weights, which is fine at the sequence lengths of this benchmark.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

ROPE_BASE = 10000.0
TWO_PI = 2 * math.pi
# softplus(z) is taken as z above this: the term it drops, log(1 + e^-z) < 5e-18, is below even
# float64's resolution there (torch's default of 20 drops 2e-9, which float64 would see).
SOFTPLUS_LINEAR_ABOVE = 40.0
SHORT_SEQUENCE = 64


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything narrower is computed in float32."""
    return torch.promote_types(dtype, torch.float32)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x [B, T, H, D] by its positions (default 0..T-1), "rotate half" pairing.

    Channel c and c + D/2 form a pair turned by angle position * ROPE_BASE**(-2c/D), so that
    (R_i q).(R_j k) depends on i - j only. Angles are computed in float64 and reduced to
    [0, 2 pi) before they are narrowed: in float32 a position of a few thousand would already
    lose the angle's low bits. Their cosines and sines are then taken in x's compute dtype,
    which is what a compiled model does for every element (it fuses the table into its users).
    """
    T, D = x.shape[1], x.shape[-1]
    if D % 2:
        raise ValueError(f"rotary embedding needs an even head dimension, got {D}")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    angles = positions.to(torch.float64)[:, None] * _inverse_frequencies(D, x.device)  # [T, D/2]
    angles = angles - TWO_PI * torch.floor(angles / TWO_PI)
    dtype = compute_dtype(x.dtype)
    cos = angles.to(dtype).cos()[:, None, :]  # broadcast over heads
    sin = angles.to(dtype).sin()[:, None, :]
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def _inverse_frequencies(D: int, device: torch.device) -> torch.Tensor:
    """ROPE_BASE ** (-c / (D/2)) for c < D/2, float64 on ``device``.

    Compiled, the table is a constant of the graph, so that the fused kernels read it instead of
    computing a float64 power for every element. Eager, it is made once per head size and device
    and kept: a call then copies nothing from the host, which a CUDA graph capture forbids.
    """
    if torch.compiler.is_compiling():
        return _frequency_table(D, device)
    return _kept_frequency_table(D, device)


def _frequency_table(D: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([ROPE_BASE ** (-c / (D // 2)) for c in range(D // 2)],
                        dtype=torch.float64, device=device)


_kept_frequency_table = functools.cache(_frequency_table)


def softmax_attention(q, k, v, scale=None, rope=False):
    """Causal softmax attention [B, T, H, D] -> [B, T, H, D]; rope=True rotates q and k first."""
    if rope:
        q, k = apply_rope(q), apply_rope(k)
    if q.shape[1] <= SHORT_SEQUENCE:
        return _short_softmax_attention(q, k, v, scale)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
    )
    return out.transpose(1, 2)


def _short_softmax_attention(q, k, v, scale=None):
    """Causal softmax attention written out, [B, T, H, D] -> [B, T, H, D]: logits in the
    inputs' dtype (as a fused kernel's), softmax in the compute dtype."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
    T = q.shape[2]
    logits = (q @ k.transpose(-1, -2)).to(compute_dtype(q.dtype)) * scale  # [B, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    probs = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return (probs.to(v.dtype) @ v).transpose(1, 2)


def softmax_logits(q, k, scale=None, rope=False):
    """The logits softmax_attention normalises, [B, H, T, T], masked entries -inf (inspection)."""
    if rope:
        q, k = apply_rope(q), apply_rope(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    logits = scale * (q.transpose(1, 2).to(dtype) @ k.transpose(1, 2).to(dtype).transpose(-1, -2))
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~causal, float("-inf"))


def sba_log_weights(q, k, scale=None):
    """log A [B, H, T, T] of stick-breaking attention (masked entries -inf).

    A_ij = sigmoid(z_ij) * prod_{j < m <= i} (1 - sigmoid(z_im)) with z_ij = scale * q_i.k_j:
    key j gets what is left of the stick after every later key m <= i took its share.
    """
    return _sba_log_weights_keys_reversed(q, k, scale).flip(-1)


def _sba_log_weights_keys_reversed(q, k, scale=None):
    """sba_log_weights with the keys in reverse time order (entry [i, T-1-j] is log A_ij).

    With log sigmoid(z) = z - softplus(z) and log(1 - sigmoid(z)) = -softplus(z), the log
    weight is log A_ij = z_ij - sum_{j <= m <= i} softplus(z_im): in reversed key order an
    inclusive cumulative sum along the row, once masked keys (m > i) add nothing, which a
    logit of -inf gives them (softplus(-inf) = 0, and their own log weight stays -inf). Four
    passes over the [T, T] matrix, and autograd's backward stays as short. Reversing the keys
    [B, T, H, D] costs far less than reversing [T, T] matrices. In float32 a log weight loses
    about the rounding of its logit (a relative error of 1e-6 in A at |z| = 60).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    k_reversed = k.flip(1).transpose(1, 2).to(dtype)
    z = (scale * q.transpose(1, 2).to(dtype)) @ k_reversed.transpose(-1, -2)
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril().flip(-1)
    z = z.masked_fill(~causal, float("-inf"))
    return z - F.softplus(z, threshold=SOFTPLUS_LINEAR_ABOVE).cumsum(-1)


def sba_attention(q, k, v, scale=None):
    """Causal stick-breaking attention [B, T, H, D] -> [B, T, H, D] (no position encoding)."""
    weights = _sba_log_weights_keys_reversed(q, k, scale).exp()
    out = weights @ v.flip(1).transpose(1, 2).to(weights.dtype)
    return out.transpose(1, 2).to(q.dtype)
