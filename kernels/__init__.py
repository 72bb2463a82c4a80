"""Attention functions shared by every model: layout [B, T, H, D], causal, any float dtype.

- ``path_attention``: PaTH, PaTH-FoX and FoX behind one call (its docstring gives the logits).
  On CUDA tensors it uses the Triton kernel where that is available and takes the inputs (head
  sizes 16, 32, 64 and 128; float32, float16 and bfloat16), elsewhere the blockwise torch
  implementation.
- ``softmax_attention`` (nope, rope=True for rope) and ``sba_attention`` (stick-breaking).
- ``softmax_probs``, ``sba_probs`` and ``path_probs``: [B, H, T, T] attention weights, for
  inspection; they materialise every logit (PaTH through the reference implementation).

The recurrent token mixers' recurrences (the delta rule, RWKV-7's state update) are in
``delta_rule``; their models call them directly.

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
    "RecurrentCache",
    "apply_rope",
    "compute_dtype",
    "path_attention",
    "path_attention_blockwise",
    "path_attention_reference",
    "path_probs",
    "resolve_backend",
    "sba_attention",
    "sba_probs",
    "softmax_attention",
    "softmax_probs",
]

BACKENDS = ("auto", "torch", "triton")
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
    if (w is None) != (beta is None):
        raise ValueError("path_attention needs w and beta together (or neither, for FoX)")
    if resolve_backend(q, backend) == "triton":
        return _triton_kernel()(q, k, v, w, beta, log_fgate, scale)
    return path_attention_blockwise(q, k, v, w, beta, log_fgate, scale)


def resolve_backend(q, backend="auto") -> str:
    """The implementation path_attention runs for queries like q: "triton" or "torch"."""
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {backend!r}; valid choices: {', '.join(BACKENDS)}"
        )
    if backend == "auto":
        return "triton" if q.is_cuda and _kernel_takes(q) else "torch"
    return backend


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


def softmax_probs(q, k, scale=None, rope=False):
    """Softmax attention weights [B, H, T, T] (rotary q and k with rope=True)."""
    return torch.softmax(softmax_logits(q, k, scale, rope=rope), dim=-1)


def sba_probs(q, k, scale=None):
    """Stick-breaking attention weights [B, H, T, T] (each row sums to at most 1)."""
    return sba_log_weights(q, k, scale).exp()


def path_probs(q, k, w=None, beta=None, log_fgate=None, scale=None):
    """PaTH-family attention weights [B, H, T, T], the inputs as for path_attention."""
    return torch.softmax(path_logits(q, k, w, beta, log_fgate, scale), dim=-1)
