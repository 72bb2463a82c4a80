"""Attention layers, one per variant, and the registry that names them.

Every layer maps x [B, T, d_model] to [B, T, d_model] causally: q, k, v projections (no
bias), a variant-specific attention, an output projection. Position enters only through the
variant (nope: not at all, rope: rotary q and k, sba: stick-breaking, fox: forget gate,
path: Householder transport, path_fox: both), so the rest of the model carries none.

A plugin registers a subclass of ``Attention`` under the entry-point group
``pathbench.attention``; it is built as ``cls(config)`` and overrides ``attend`` (whole
sequences), and, to support ``attention_maps`` and generation, ``probs`` and ``decode``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pathbench import UserError
from pathbench.kernels import (
    BACKENDS,
    RecurrentCache,
    apply_rope,
    compute_dtype,
    path_attention,
    path_probs,
    resolve_backend,
    sba_attention,
    sba_probs,
    softmax_attention,
    softmax_probs,
)
from pathbench.registry import Registry

W_RANK = 32  # PaTH's w comes from the token through a rank-32 bottleneck
W_CONV_WIDTH = 3  # and a causal depthwise convolution over the last 3 tokens


class DecodingState:
    """What one attention layer carries from token to token while decoding."""

    def __init__(self):
        self.cache = RecurrentCache()
        self.recent = None  # PaTH: the last W_CONV_WIDTH - 1 inputs of the w convolution


class Attention(nn.Module):
    """Multi-head causal self-attention; subclasses decide how position enters."""

    backends = ("auto", "torch")  # the values of ModelConfig.backend this variant takes
    family = "attention"  # tables and figures group models by family: attention, recurrent

    @classmethod
    def check_device(cls, config, device: str) -> None:
        """Raise UserError if this mixer, as ``config`` (a ModelConfig) builds it, cannot run
        on ``device``."""

    @classmethod
    def check_config(cls, config) -> None:
        """Raise UserError for a model configuration this variant cannot be built with."""
        if config.backend not in cls.backends:
            raise UserError(
                f"model config 'backend' {config.backend!r} is not available for attention "
                f"{config.attention!r}; valid choices: {', '.join(cls.backends)}"
            )

    def __init__(self, config):
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.d_model // config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x):
        q, k, v = self.project(x)
        return self.out(self.attend(q, k, v, x).flatten(2))

    def project(self, x):
        """q, k, v [B, T, H, D] (x may also be one token, [B, d_model], giving [B, H, D])."""
        return self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)

    def attention_probs(self, x):
        """Attention weights [B, H, T, T] of this layer for input x [B, T, d_model]."""
        q, k, _ = self.project(x)
        return self.probs(q, k, x)

    def decode_step(self, x, state: DecodingState):
        """One token x [B, d_model] -> [B, d_model], given everything before it in state."""
        q, k, v = self.project(x)
        return self.out(self.decode(q, k, v, x, state).flatten(1))

    def implementation(self, q) -> str:
        """What computes this attention for queries like q [B, T, H, D]: "torch" or "triton"."""
        return "torch"

    def state_size(self) -> int | None:
        """Numbers this layer carries per sequence from token to token; None where it grows
        with the sequence (attention's cache of keys and values)."""
        return None

    def attend(self, q, k, v, x):
        """[B, T, H, D] attention output; x is the layer input, for data-dependent parts."""
        raise NotImplementedError

    def probs(self, q, k, x):
        """[B, H, T, T] attention weights for q, k [B, T, H, D]."""
        raise NotImplementedError(f"{type(self).__name__} does not provide attention maps")

    def decode(self, q, k, v, x, state):
        """[B, H, D] output for one token (q, k, v [B, H, D], x [B, d_model])."""
        raise NotImplementedError(f"{type(self).__name__} does not support decoding")


ATTENTIONS = Registry("attention", "pathbench.attention", Attention)


@ATTENTIONS.register("nope")
class NoPEAttention(Attention):
    """Causal softmax attention with no position encoding at all."""

    def attend(self, q, k, v, x):
        return softmax_attention(q, k, v)

    def probs(self, q, k, x):
        return softmax_probs(q, k)

    def decode(self, q, k, v, x, state):
        state.cache.append(k, v)
        return state.cache.softmax_readout(q)


@ATTENTIONS.register("rope")
class RoPEAttention(Attention):
    """Softmax attention with rotary embedding of q and k (base 10000)."""

    @classmethod
    def check_config(cls, config) -> None:
        super().check_config(config)
        if (config.d_model // config.heads) % 2:
            raise UserError(f"rope needs an even head dimension; d_model / heads = "
                            f"{config.d_model // config.heads}")

    def attend(self, q, k, v, x):
        return softmax_attention(q, k, v, rope=True)

    def probs(self, q, k, x):
        return softmax_probs(q, k, rope=True)

    def decode(self, q, k, v, x, state):
        position = torch.tensor([state.cache.length], device=q.device)
        q, k = (apply_rope(t[:, None], position)[:, 0] for t in (q, k))
        state.cache.append(k, v)
        return state.cache.softmax_readout(q)


@ATTENTIONS.register("sba")
class StickBreakingAttention(Attention):
    """Stick-breaking attention: each key takes a sigmoid share of what later keys left."""

    def attend(self, q, k, v, x):
        return sba_attention(q, k, v)

    def probs(self, q, k, x):
        return sba_probs(q, k)

    def decode(self, q, k, v, x, state):
        state.cache.append(k, v)
        return state.cache.stick_breaking_readout(q)


def causal_depthwise_sum(window: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """A depthwise convolution over time as a sum of shifted products: window [..., T + width
    - 1, C], taps [..., C, width] (broadcast against window's leading dimensions) -> [..., T, C],
    out[t] = sum_j taps[j] * window[t + j], in the taps' dtype and returned in window's.

    Written out rather than F.conv1d, whose [B, C, T] layout costs transposes: a compiled step
    fuses these few products with their neighbours.
    """
    width = taps.shape[-1]
    length = window.shape[-2] - width + 1
    inputs = window.to(taps.dtype)
    out = inputs[..., :length, :] * taps[..., 0]
    for j in range(1, width):
        out = out + inputs[..., j : j + length, :] * taps[..., j]
    return out.to(window.dtype)


class CausalDepthwiseConv(nn.Module):
    """One filter per channel over the last ``width`` positions: [B, T + width - 1, C] -> [B, T, C].

    The caller supplies the ``width - 1`` positions before the first output (zeros, or the
    inputs already seen while decoding), so whole sequences and single tokens share it.
    """

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width))  # as Conv1d's weight
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # Conv1d's default initialisation

    def forward(self, window):
        return causal_depthwise_sum(window, self.weight[:, 0])


class PathFamilyAttention(Attention):
    """fox, path and path_fox: softmax attention with a forget gate and/or Householder transport.

    - forget gate: f_t = sigmoid(u_f . x_t + b_f) per head, added to the logits as
      G_i - G_j with G = cumsum(log f) (log f computed as logsigmoid, never as log(sigmoid)).
    - Householder: H_t = I - beta_t w_t w_t^T, w_t = per-head L2 normalisation (in float32,
      or float64 for a float64 model) of a causal depthwise convolution (width 3, over time)
      of a rank-32 map of x_t, and beta_t = 2 sigmoid(u_b . x_t + b_b) per head, clipped at
      config.beta_max.
    """

    householder = False
    forget_gate = False
    backends = BACKENDS

    def __init__(self, config):
        super().__init__(config)
        self.backend = config.backend
        d_model, heads = config.d_model, config.heads
        if self.forget_gate:
            self.forget_proj = nn.Linear(d_model, heads)
        if self.householder:
            self.beta_max = config.beta_max
            self.w_down = nn.Linear(d_model, W_RANK, bias=False)
            self.w_up = nn.Linear(W_RANK, d_model, bias=False)
            self.w_conv = CausalDepthwiseConv(d_model, W_CONV_WIDTH)
            self.beta_proj = nn.Linear(d_model, heads)

    def position_inputs(self, x, recent=None):
        """w, beta, log_fgate for x [B, T, d_model] (absent parts are None), and the new `recent`.

        recent: the last W_CONV_WIDTH - 1 inputs of the w convolution before x (zeros before
        the first token); the returned one ends with x, for the next decoding step.
        """
        w = beta = log_fgate = None
        dtype = compute_dtype(x.dtype)  # float32, or float64 for a float64 model
        if self.forget_gate:
            log_fgate = F.logsigmoid(self.forget_proj(x).to(dtype))
        if self.householder:
            low_rank = self.w_up(self.w_down(x))  # [B, T, d_model]
            if recent is None:
                recent = low_rank.new_zeros(x.shape[0], W_CONV_WIDTH - 1, x.shape[-1])
            window = torch.cat([recent, low_rank], dim=1)  # [B, T + 2, d_model]
            conv = self.w_conv(window).to(dtype).unflatten(-1, (self.heads, self.head_dim))
            w = F.normalize(conv, dim=-1)
            beta = (2 * torch.sigmoid(self.beta_proj(x).to(dtype))).clamp(max=self.beta_max)
            recent = window[:, -(W_CONV_WIDTH - 1):]
        return w, beta, log_fgate, recent

    def implementation(self, q) -> str:
        return resolve_backend(q, self.backend)

    def attend(self, q, k, v, x):
        w, beta, log_fgate, _ = self.position_inputs(x)
        return path_attention(q, k, v, w, beta, log_fgate, backend=self.backend)

    def probs(self, q, k, x):
        w, beta, log_fgate, _ = self.position_inputs(x)
        return path_probs(q, k, w, beta, log_fgate)

    def decode(self, q, k, v, x, state):
        w, beta, log_fgate, state.recent = self.position_inputs(x[:, None], state.recent)
        state.cache.append(k, v, *(None if t is None else t[:, 0] for t in (w, beta, log_fgate)))
        return state.cache.softmax_readout(q)


@ATTENTIONS.register("fox")
class FoXAttention(PathFamilyAttention):
    """Forgetting attention: softmax logits plus a learned cumulative log forget gate."""

    forget_gate = True


@ATTENTIONS.register("path")
class PaTHAttention(PathFamilyAttention):
    """PaTH: logits transported by the data-dependent Householder product H_i ... H_{j+1}."""

    householder = True


@ATTENTIONS.register("path_fox")
class PaTHFoXAttention(PathFamilyAttention):
    """PaTH with FoX's forget gate added to the logits."""

    householder = True
    forget_gate = True
