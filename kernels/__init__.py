"""Attention functions shared by every model: layout [B, T, H, D], causal, any float dtype.

- ``path_attention``: PaTH, PaTH-FoX and FoX behind one call (its docstring gives the logits).
  On CUDA tensors it uses the Triton kernel where that is available and takes the inputs (head
  sizes 16, 32, 64 and 128; float32, float16 and bfloat16), elsewhere the blockwise torch
  implementation.
- ``softmax_attention`` (nope, rope=True for rope) and ``sba_attention`` (stick-breaking).
- ``attention_probs``: the [B, H, T, T] attention weights of any built-in variant, for
  inspection; it materialises every logit (PaTH through the reference implementation).

PaTH implementations: ``reference`` (the materialised global UT formula, for tests and
attention maps), ``blockwise`` (per-block solves, the training path without Triton),
``recurrent`` (a key cache updated in place by each new token, for generation) and
``triton_path`` (the GPU kernel). The torch ones are tested against brute force written from
the definitions, the Triton one against them.
"""

from __future__ import annotations

import torch

from pathbench.kernels.blockwise import path_attention_blockwise
from pathbench.kernels.recurrent import RecurrentCache
from pathbench.kernels.reference import path_attention_reference, path_logits
from pathbench.kernels.softmax import (
    apply_rope,
    compute_dtype,
    sba_attention,
    sba_log_weights,
    softmax_attention,
    softmax_logits,
)

__all__ = [
    "BACKENDS",
    "VARIANTS",
    "RecurrentCache",
    "apply_rope",
    "attention_probs",
    "compute_dtype",
    "path_attention",
    "path_attention_blockwise",
    "path_attention_reference",
    "sba_attention",
    "softmax_attention",
]

BACKENDS = ("auto", "torch", "triton")
VARIANTS = ("nope", "rope", "sba", "fox", "path", "path_fox")
TRITON_MODULE = "pathbench.kernels.triton_path"


def path_attention(q, k, v, w=None, beta=None, log_fgate=None, scale=None, backend="auto"):
    """PaTH attention [B, T, H, D] -> [B, T, H, D].

    logit_ij = scale * q_i^T H_i ... H_{j+1} k_j + (G_i - G_j), j <= i, with
    H_t = I - beta_t w_t w_t^T (w_t unit norm, beta_t in (0, 2)) and G = cumsum(log_fgate).
    w=None drops the Householder part (FoX), log_fgate=None the gate (PaTH); w and beta come
    together. beta and log_fgate are [B, T, H]; scale defaults to D**-0.5.

    backend: "auto" (Triton for CUDA tensors when the kernel imports and takes their head size
    and dtype, torch otherwise), "torch" (blockwise, autograd backward) or "triton".
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {backend!r}; valid choices: {', '.join(BACKENDS)}"
        )
    if (w is None) != (beta is None):
        raise ValueError("path_attention needs w and beta together (or neither, for FoX)")
    if backend == "auto":
        backend = "triton" if q.is_cuda and _kernel_takes(q) else "torch"
    if backend == "triton":
        return _triton_kernel()(q, k, v, w, beta, log_fgate, scale)
    return path_attention_blockwise(q, k, v, w, beta, log_fgate, scale)


# Import statements, not importlib: torch.compile traces them, so a compiled model calls the
# kernel without a break in its graph.
def _kernel_takes(q) -> bool:
    """Whether the Triton kernel is installed and takes q's head size and dtype."""
    try:
        from pathbench.kernels.triton_path import takes
    except ImportError:
        return False
    return takes(q)


def _triton_kernel():
    """path_attention_triton; an error that says so when it is not installed."""
    try:
        from pathbench.kernels.triton_path import path_attention_triton
    except ModuleNotFoundError as exc:
        if exc.name == TRITON_MODULE:
            raise NotImplementedError(
                f"the Triton PaTH kernel ({TRITON_MODULE}) is not part of this installation; "
                "use backend='torch'"
            ) from exc
        raise
    return path_attention_triton


def attention_probs(variant, q, k, w=None, beta=None, log_fgate=None, scale=None):
    """Attention weights [B, H, T, T] of a built-in variant (rows sum to 1, or at most 1 for sba).

    Which inputs matter: fox uses log_fgate, path uses w and beta, path_fox all three.
    """
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown attention variant {variant!r}; valid choices: {', '.join(VARIANTS)}"
        )
    if variant == "sba":
        return sba_log_weights(q, k, scale).exp()
    if variant in ("nope", "rope"):
        logits = softmax_logits(q, k, scale, rope=variant == "rope")
    else:
        householder = variant in ("path", "path_fox")
        gated = variant in ("fox", "path_fox")
        logits = path_logits(
            q, k,
            w if householder else None,
            beta if householder else None,
            log_fgate if gated else None,
            scale,
        )
    return torch.softmax(logits, dim=-1)
