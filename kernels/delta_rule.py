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

The recurrences loop over tokens, each step a few small matmuls per head: the plain
references of the chunked forms below, which the mixers run. Every form computes in float32
(float64 for float64 inputs) whatever autocast says, returned in q's dtype: bfloat16 operands
would round the state, which every later token reads.

``delta_rule_chunked`` computes the delta rule a chunk of C steps at a time, each chunk a few
batched matrix products and one triangular solve, the state carried only from chunk to chunk:
a form whose kernels are large enough for a GPU, in torch alone. Within a chunk that starts
from state S0, write Γ_t for the product of the gates up to step t, u_t for what step t adds
(S_t = exp(g_t) S_{t-1} + k_t u_t^T) and D_ti = Γ_t / Γ_i for i <= t. Unrolling the recurrence,

    S_t = Γ_t S0 + sum_{i<=t} D_ti k_i u_i^T,
    u_t = beta_t (v_t - Γ_t S0^T k_t - sum_{i<t} D_ti (k_i . k_t) u_i),

so the chunk's U [C, D_v] solves (I + diag(beta) strictly_lower(K K^T * D)) U =
diag(beta) (V - diag(Γ) K S0), a unit lower-triangular system; the outputs are
o_t = scale (Γ_t S0^T q_t + sum_{i<=t} D_ti (k_i . q_t) u_i), and the next chunk starts from
Γ_C S0 + K^T diag(D_Ci) U. Several steps per token (DeltaProduct) are a sequence n times as
long whose token t is read after its last step; a token's gate acts before its first step.

``rwkv7_chunked`` does the same for RWKV-7. Within a chunk from state S0, let Λ_t be the
product of the decays exp(w) up to token t (a vector over key channels, Λ_0 = 1) and x_t =
S_{t-1}^T a_t the correction's read. Unrolling S_t = diag(e^{w_t}) S_{t-1} + b_t x_t^T +
k_t v_t^T,

    S_t = diag(Λ_t) S0 + sum_{i<=t} diag(Λ_t / Λ_i) (b_i x_i^T + k_i v_i^T),
    x_t = S0^T (Λ_{t-1} a_t) + sum_{i<t} ((Λ_{t-1} a_t) . (b_i / Λ_i)) x_i
                             + sum_{i<t} ((Λ_{t-1} a_t) . (k_i / Λ_i)) v_i,

so the chunk's X solves a unit lower-triangular system, the outputs read S_t with Λ_t r_t the
same way, and the next chunk starts from S_C. The ratios Λ_t / Λ_i are factored into
Λ_t times 1 / Λ_i, which float32 holds while a chunk's summed log decays stay above about -80:
chunks of 16 tokens take log decays down to -5 a token (RWKV-7's are above -0.61).
"""

from __future__ import annotations

import functools

import torch

from pathbench.kernels.softmax import compute_dtype


def _without_autocast(fn):
    """``fn`` with autocast off on its first argument's device: its products in the dtype it
    computes in."""
    @functools.wraps(fn)
    def wrapped(first, *args, **kwargs):
        with torch.autocast(first.device.type, enabled=False):
            return fn(first, *args, **kwargs)
    return wrapped


@_without_autocast
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


@_without_autocast
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


# Steps a chunk holds (rounded down to whole tokens): a C x C system per chunk and head
CHUNK_STEPS = 64


@_without_autocast
def delta_rule_chunked(q, k, v, beta, log_gate=None, scale=None, chunk_steps=CHUNK_STEPS):
    """``delta_rule_recurrence``, the same arguments and result, computed a chunk of steps at a
    time (the module's docstring derives it)."""
    B, T, H, D = q.shape
    steps = k.shape[2]
    scale = D**-0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    # every step of every token in order, heads first: [B, H, T * steps, ...]
    q = q.to(dtype).transpose(1, 2)  # [B, H, T, D]
    k = k.to(dtype).permute(0, 3, 1, 2, 4).flatten(2, 3)
    v = v.to(dtype).permute(0, 3, 1, 2, 4).flatten(2, 3)
    beta = beta.to(dtype).permute(0, 3, 1, 2).flatten(2, 3)
    log_gates = torch.zeros_like(beta)  # a token's gate at its first step, none at the others
    if log_gate is not None:
        log_gates.view(B, H, T, steps)[..., 0] = log_gate.to(dtype).transpose(1, 2)
    tokens = max(1, chunk_steps // steps)  # tokens a chunk holds
    state = q.new_zeros(B, H, D, v.shape[-1])
    outputs = []
    for first in range(0, T, tokens):
        rows = slice(first * steps, min(T, first + tokens) * steps)
        kc, vc, bc = k[:, :, rows], v[:, :, rows], beta[:, :, rows]
        cumulative = log_gates[:, :, rows].cumsum(-1)  # log Γ_t
        n = kc.shape[2]
        later = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()  # i <= t
        gaps = (cumulative[..., :, None] - cumulative[..., None, :]).masked_fill(~later, -torch.inf)
        decay = gaps.exp()  # D_ti, 0 above the diagonal
        system = torch.eye(n, dtype=dtype, device=q.device) + bc[..., None] * (
            (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        written = bc[..., None] * (vc - cumulative.exp()[..., None] * (kc @ state))
        u = torch.linalg.solve_triangular(system, written, upper=False, unitriangular=True)
        read = slice(steps - 1, n, steps)  # each token's last step
        qc = q[:, :, first : first + tokens]
        scores = (qc @ kc.transpose(-1, -2)) * decay[..., read, :]
        outputs.append(scale * (cumulative[..., read].exp()[..., None] * (qc @ state)
                                + scores @ u))
        state = (cumulative[..., -1:].exp()[..., None] * state
                 + kc.transpose(-1, -2) @ (decay[..., -1, :, None] * u))
    return torch.cat(outputs, dim=2).transpose(1, 2).to(out_dtype)


# Tokens an RWKV-7 chunk holds: its log decays, summed over the chunk, must stay above about
# -80 (the module's docstring says why)
RWKV7_CHUNK_TOKENS = 16


@_without_autocast
def rwkv7_chunked(r, w, k, v, a, b, scale=1.0, chunk_tokens=RWKV7_CHUNK_TOKENS):
    """``rwkv7_recurrence``, the same arguments and result, computed a chunk of tokens at a
    time (the module's docstring derives it)."""
    B, T, H, D = r.shape
    out_dtype, dtype = r.dtype, compute_dtype(r.dtype)
    r, w, k, v, a, b = (t.to(dtype).transpose(1, 2) for t in (r, w, k, v, a, b))  # [B, H, T, D]
    state = r.new_zeros(B, H, D, v.shape[-1])  # [B, H, D_k, D_v]
    outputs = []
    for first in range(0, T, chunk_tokens):
        rc, wc, kc, vc, ac, bc = (t[:, :, first : first + chunk_tokens] for t in (r, w, k, v, a, b))
        n = rc.shape[2]
        through = wc.cumsum(2)  # log Λ_t
        reads = ac * (through - wc).exp()  # Λ_{t-1} a_t: x_t reads the state before decaying
        queries = rc * through.exp()  # Λ_t r_t
        b_back, k_back = bc * (-through).exp(), kc * (-through).exp()  # b_i / Λ_i, k_i / Λ_i
        # x_t reads the writes of earlier tokens i < t: strictly lower-triangular products
        system = torch.eye(n, dtype=dtype, device=r.device) - (
            reads @ b_back.transpose(-1, -2)).tril(-1)
        written = reads @ state + (reads @ k_back.transpose(-1, -2)).tril(-1) @ vc
        x = torch.linalg.solve_triangular(system, written, upper=False, unitriangular=True)
        outputs.append(scale * (queries @ state
                                + (queries @ b_back.transpose(-1, -2)).tril() @ x
                                + (queries @ k_back.transpose(-1, -2)).tril() @ vc))
        to_end = (through[:, :, -1:] - through).exp()  # Λ_C / Λ_i
        state = (through[:, :, -1, :, None].exp() * state
                 + (bc * to_end).transpose(-1, -2) @ x + (kc * to_end).transpose(-1, -2) @ vc)
    return torch.cat(outputs, dim=2).transpose(1, 2).to(out_dtype)
