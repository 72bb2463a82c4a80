"""Linear recurrent token mixers, chosen like the attention variants (``model.attention``) and
placed in the same decoder block, so that only the mixer differs between models.

Every mixer keeps the attention layers' q, k, v and output projections and adds the small
projections its recurrence reads from the layer input x. As in the published layers of the
delta-rule family, q, k and v pass through a short causal convolution (each channel a filter
over its last SHORT_CONV_WIDTH projections) and SiLU, and q and k are then L2-normalised per
head: with it a single layer sees the tokens just before each one, as PaTH's w does through
its own convolution (flip-flop asks for that: a bit is stored only after a write).

- ``deltanet``: the delta rule, beta_t = 2 sigmoid(u_b . x_t + b_b) per head, in (0, 2) so
  that a step's eigenvalue 1 - beta can be negative (Grazzi et al., 2024).
- ``gated_deltanet``: the same with a gate exp(g_t), g_t = logsigmoid(u_g . x_t + b_g) per
  head, applied to the state before each token's update (Yang et al., 2025).
- ``deltaproduct``: ``model.householder_steps`` delta-rule steps per token, each with its own
  key, value and beta (the first key and value from the shared projection, the others from
  one more linear map): a product of that many generalised Householder factors per token
  (Siems et al., 2025), as PaTH's transport is a product of Householder factors across tokens.
- ``rwkv7``: RWKV-7's state update (Peng et al., 2025): a per-channel decay
  w_t = -e^-0.5 sigmoid(u_w x_t + b_w) (log scale), the removal key kappa = k / |k|, an
  in-context learning rate iclr = sigmoid(u_a x_t + b_a) per channel, and
  S <- diag(e^w) S - (kappa * iclr)(kappa^T S) + (kappa * iclr) v^T, read by the query. The
  short convolution above takes the place of RWKV-7's token shift; its bonus term, output
  gate and group norm are left out: the block around the mixer is the benchmark's, for every
  mixer alike.

On CUDA (backend "auto" or "fla") the recurrences run through fla-core's chunked operators
(``pip install -e ".[fla]"``), in bfloat16; elsewhere, and with backend "torch" on CUDA too,
through ``pathbench.kernels.delta_rule``: the delta rule a chunk of steps at a time
(``delta_rule_chunked``) and RWKV-7 a chunk of tokens at a time (``rwkv7_chunked``), both
tested against the plain recurrences.
One exception: fla-core refuses the gated delta rule's backward on Hopper GPUs under Triton
3.4 to 3.7.0, which miscompile one of its kernels (fla-core issue #640), so there "auto" takes
the torch form for gated_deltanet and "fla" is refused before training.
Every parameter lives in a linear layer or a convolution of the kind PaTH uses, so packs
(``pathbench.models.pack``) take these mixers as they are. Generation and attention maps are
not provided: the mixers train and are scored on whole sequences.
"""

from __future__ import annotations

import importlib.util
import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from pathbench import UserError
from pathbench.kernels import compute_dtype
from pathbench.kernels.delta_rule import delta_rule_chunked, rwkv7_chunked
from pathbench.models.attention import ATTENTIONS, Attention, CausalDepthwiseConv

FLA_INSTALL = 'pip install -e ".[fla]"'
RWKV7_DECAY_SCALE = math.exp(-0.5)  # RWKV-7's bound on the log decay: w in (-e^-0.5, 0)
SHORT_CONV_WIDTH = 4  # q, k and v see the projections of their token and the 3 before it


def fla_installed() -> bool:
    return importlib.util.find_spec("fla") is not None


def fla_gate_refused(capability: tuple[int, int], triton_version: str) -> bool:
    """Whether fla-core refuses a gated delta rule's backward on a GPU of this compute
    capability under this Triton: on Hopper (9.x) with Triton 3.4.0 up to 3.7.1, which
    computes its gradients wrongly (fla-core issue #640)."""
    release = tuple(int(part) for part in re.findall(r"\d+", triton_version)[:3])
    return capability[0] == 9 and (3, 4, 0) <= release < (3, 7, 1)


def _fla_gate_refused_here() -> bool:
    """fla_gate_refused for this machine's first GPU and Triton (False where there is no GPU
    to ask, as on a cluster's login node: its workers then decide)."""
    if not torch.cuda.is_available():
        return False
    import triton

    return fla_gate_refused(torch.cuda.get_device_capability(0), triton.__version__)


class RecurrentMixer(Attention):
    """A mixer whose state is a D x D matrix per head, updated token by token."""

    family = "recurrent"
    backends = ("auto", "torch", "fla")

    @classmethod
    def check_device(cls, config, device: str) -> None:
        if device == "cuda" and config.backend != "torch" and not fla_installed():
            raise UserError(f"{config.attention} runs on a GPU through fla-core's fused "
                            f"operators, which are not installed: {FLA_INSTALL} (or "
                            f"model.backend=torch for pathbench's own, in torch)")

    @classmethod
    def check_config(cls, config) -> None:
        super().check_config(config)
        if config.backend == "fla" and not fla_installed():
            raise UserError(f"model config 'backend' 'fla' needs fla-core: {FLA_INSTALL}")

    def __init__(self, config):
        super().__init__(config)
        self.backend = config.backend
        self.qkv_conv = CausalDepthwiseConv(3 * config.d_model, SHORT_CONV_WIDTH)

    def project(self, x):
        """q, k, v [B, T, H, D] for whole sequences x [B, T, d_model]: the projections through
        the short convolution and SiLU."""
        qkv = short_convolution(self.qkv_conv, self.qkv(x))
        return qkv.unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)

    def implementation(self, q) -> str:
        if self.backend == "auto":
            return "fla" if q.is_cuda and fla_installed() else "torch"
        return self.backend

    def state_size(self) -> int:
        """The state matrix of every head, and the convolutions' last SHORT_CONV_WIDTH - 1
        inputs."""
        convolved = sum(module.weight.shape[0] for module in self.modules()
                        if isinstance(module, CausalDepthwiseConv))
        return self.heads * self.head_dim**2 + (SHORT_CONV_WIDTH - 1) * convolved


def short_convolution(conv: CausalDepthwiseConv, projected: torch.Tensor) -> torch.Tensor:
    """SiLU of ``conv`` over ``projected`` [B, T, C], zeros before the first token."""
    window = F.pad(projected, (0, 0, conv.weight.shape[-1] - 1, 0))  # [B, T + width - 1, C]
    return F.silu(conv(window))


class DeltaRuleMixer(RecurrentMixer):
    """The delta rule with ``steps`` Householder steps per token, gated or not."""

    gated = False

    @classmethod
    def check_device(cls, config, device: str) -> None:
        super().check_device(config, device)
        if (cls.gated and device == "cuda" and config.backend == "fla"
                and _fla_gate_refused_here()):
            raise UserError(f"fla-core refuses {config.attention}'s backward on Hopper GPUs "
                            f"under Triton 3.4 to 3.7.0, as here (wrong gradients, fla-core "
                            f"issue #640): use Triton 3.7.1 or later, or model.backend=torch "
                            f"(or auto)")

    def __init__(self, config, steps: int = 1):
        super().__init__(config)
        self.steps = steps
        d_model, heads = config.d_model, config.heads
        self.beta_proj = nn.Linear(d_model, steps * heads)
        if steps > 1:  # keys and values of the steps after the first
            self.more_kv = nn.Linear(d_model, 2 * (steps - 1) * d_model, bias=False)
            self.more_kv_conv = CausalDepthwiseConv(2 * (steps - 1) * d_model,
                                                    SHORT_CONV_WIDTH)
        if self.gated:
            self.gate_proj = nn.Linear(d_model, heads)

    def implementation(self, q) -> str:
        chosen = super().implementation(q)
        if (chosen == "fla" and self.gated and self.backend == "auto"
                and _fla_gate_refused_here()):
            return "torch"
        return chosen

    def attend(self, q, k, v, x):
        k, v = k[:, :, None], v[:, :, None]  # [B, T, steps, H, D]
        if self.steps > 1:
            more = short_convolution(self.more_kv_conv, self.more_kv(x))
            more = more.unflatten(-1, (2, self.steps - 1, self.heads, self.head_dim))
            k = torch.cat([k, more[:, :, 0]], dim=2)
            v = torch.cat([v, more[:, :, 1]], dim=2)
        dtype = compute_dtype(q.dtype)
        q, k = F.normalize(q.to(dtype), dim=-1), F.normalize(k.to(dtype), dim=-1)
        beta = 2 * torch.sigmoid(self.beta_proj(x).to(dtype)).unflatten(-1, (self.steps,
                                                                             self.heads))
        log_gate = F.logsigmoid(self.gate_proj(x).to(dtype)) if self.gated else None
        if self.implementation(q) == "fla":
            return outside_compile(_fla_delta_rule)(q, k, v, beta, log_gate).to(v.dtype)
        return delta_rule_chunked(q, k, v, beta, log_gate).to(v.dtype)


@ATTENTIONS.register("deltanet")
class DeltaNetMixer(DeltaRuleMixer):
    """DeltaNet: the delta rule, beta in (0, 2)."""


@ATTENTIONS.register("gated_deltanet")
class GatedDeltaNetMixer(DeltaRuleMixer):
    """Gated DeltaNet: the delta rule with a per-head gate on the state, beta in (0, 2)."""

    gated = True


@ATTENTIONS.register("deltaproduct")
class DeltaProductMixer(DeltaRuleMixer):
    """DeltaProduct: model.householder_steps delta-rule steps per token, beta in (0, 2)."""

    def __init__(self, config):
        super().__init__(config, steps=config.householder_steps)


@ATTENTIONS.register("rwkv7")
class RWKV7Mixer(RecurrentMixer):
    """RWKV-7's state update: per-channel decay, normalised removal key, in-context rate."""

    def __init__(self, config):
        super().__init__(config)
        self.decay_proj = nn.Linear(config.d_model, config.d_model)
        self.rate_proj = nn.Linear(config.d_model, config.d_model)

    def attend(self, q, k, v, x):
        dtype = compute_dtype(q.dtype)
        shape = (self.heads, self.head_dim)
        w = -RWKV7_DECAY_SCALE * torch.sigmoid(self.decay_proj(x).to(dtype)).unflatten(-1, shape)
        rate = torch.sigmoid(self.rate_proj(x).to(dtype)).unflatten(-1, shape)
        kappa = F.normalize(k.to(dtype), dim=-1)
        r, write = F.normalize(q.to(dtype), dim=-1), kappa * rate
        scale = self.head_dim**-0.5
        args = (r, w, write, v.to(dtype), -kappa, write)
        if self.implementation(q) == "fla":
            return outside_compile(_fla_rwkv7)(*args, scale=scale).to(v.dtype)
        # Compiled, the loop over chunks would be unrolled, and compiling it takes time in
        # proportion to the sequence length; run eagerly, its kernels still join the step's
        # CUDA graph.
        return outside_compile(rwkv7_chunked)(*args, scale=scale).to(v.dtype)


# fla-core's operators run eagerly, outside compiled graphs (fla-core marks its own delta-rule
# operators so), on contiguous bfloat16 copies; their kernels still join the step's CUDA graph.


def outside_compile(fn):
    """``fn``, run eagerly even inside a compiled function. Wrapped when called, not when this
    module is imported: torch.compiler imports Triton, which must not happen before a CPU test
    session has chosen Triton's interpreter."""
    return torch.compiler.disable(fn)


def _fla_rwkv7(r, w, k, v, a, b, scale):
    from fla.ops.rwkv7 import chunk_rwkv7

    output, _ = chunk_rwkv7(*(t.to(torch.bfloat16).contiguous() for t in (r, w, k, v, a, b)),
                            scale=scale)
    return output


def _fla_delta_rule(q, k, v, beta, log_gate):
    """fla-core's chunked operator for these inputs (``delta_rule_recurrence``'s layout), in
    bfloat16."""
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_product import chunk_gated_delta_product
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    steps = k.shape[2]
    q, k, v, beta = (t.to(torch.bfloat16) for t in (q, k, v, beta))
    if log_gate is not None:
        log_gate = log_gate.contiguous()
    q = q.contiguous()
    if steps > 1:  # token t's steps at rows t * steps + j
        output, _ = chunk_gated_delta_product(
            q, k.flatten(1, 2).contiguous(), v.flatten(1, 2).contiguous(), log_gate,
            beta.flatten(1, 2).contiguous(), num_householder=steps)
    elif log_gate is not None:
        output, _ = chunk_gated_delta_rule(q, k[:, :, 0].contiguous(), v[:, :, 0].contiguous(),
                                           log_gate, beta[:, :, 0].contiguous())
    else:
        output, _ = chunk_delta_rule(q, k[:, :, 0].contiguous(), v[:, :, 0].contiguous(),
                                     beta[:, :, 0].contiguous())
    return output
