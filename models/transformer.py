"""A small pre-norm decoder-only transformer whose only source of position is its attention.

Choices, and why:
- Token embedding, then `layers` blocks x + attn(norm(x)), x + mlp(norm(x)), a final norm and
  an output head. Pre-norm residual blocks train stably without warm-up tricks at any depth
  this benchmark sweeps.
- No absolute position embedding: the benchmark compares position encodings, so position
  reaches the model only through the attention variant (nope gets none at all).
- RMSNorm (learned scale, no bias, eps 1e-6), as in current decoder-only models.
- MLP: Linear(d, r*d) -> GELU -> Linear(r*d, d) with r = config.mlp_ratio (4), no biases.
- Untied input embedding and output head: vocabularies are tiny, tying saves nothing.
- No dropout: the data are synthetic and fresh every step.
- Initialisation as GPT-2: normal(0, 0.02) for embeddings and linear layers, biases zero, and
  the two projections that write into the residual stream scaled by 1/sqrt(2 * layers).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from pathbench import UserError
from pathbench.models.attention import ATTENTIONS, DecodingState
from pathbench.models.config import ModelConfig, model_config
from pathbench.registry import BUILTIN


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.mlp_ratio * config.d_model, bias=False)
        self.down = nn.Linear(config.mlp_ratio * config.d_model, config.d_model, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=1e-6)
        self.attn = ATTENTIONS.get(config.attention)(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=1e-6)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def decode_step(self, x, state: DecodingState):
        x = x + self.attn.decode_step(self.attn_norm(x), state)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.d_model, eps=1e-6)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(_init_weights)
        for block in self.blocks:
            for projection in (block.attn.out, block.mlp.down):
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * config.layers))

    def forward(self, inputs):
        """inputs: token ids [B, T] -> logits [B, T, vocab_size]."""
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def state_size(self) -> int | None:
        """Numbers carried per sequence from token to token, over all layers (a recurrent
        mixer's matrices); None for attention, whose key and value cache grows with length."""
        sizes = [block.attn.state_size() for block in self.blocks]
        return None if None in sizes else sum(sizes)

    def attention_backend(self, device: torch.device, dtype: torch.dtype) -> str:
        """What computes the attention on ``device`` for activations of ``dtype``."""
        attn = self.blocks[0].attn
        return attn.implementation(
            torch.empty(1, 1, attn.heads, attn.head_dim, device=device, dtype=dtype))

    @torch.no_grad()
    def attention_maps(self, inputs):
        """One [B, H, T, T] tensor of attention weights per layer, for token ids [B, T]."""
        maps = []
        x = self.embed(inputs)
        for block in self.blocks:
            maps.append(block.attn.attention_probs(block.attn_norm(x)))
            x = block(x)
        return maps

    # Generation, on the recurrent form of each attention (pathbench.kernels.recurrent).

    def start_decoding(self) -> list[DecodingState]:
        """Fresh per-layer state for decode_step (nothing seen yet)."""
        return [DecodingState() for _ in self.blocks]

    @torch.no_grad()
    def decode_step(self, tokens, states: list[DecodingState]):
        """Feed one token per sequence, tokens [B]; returns the next-token logits [B, vocab_size].

        Equal to forward(all tokens so far)[:, -1]; states are updated in place (inference
        only: no gradients flow through decoding).
        """
        x = self.embed(tokens)
        for block, state in zip(self.blocks, states):
            x = block.decode_step(x, state)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, prefix, num_new_tokens, greedy=True, generator=None):
        """Continue prefix [B, T0] by num_new_tokens tokens; returns [B, T0 + num_new_tokens].

        greedy=True takes the argmax at each step, otherwise samples from the softmax (with the
        given torch.Generator, if any).
        """
        if prefix.shape[1] == 0:
            raise ValueError("generate needs a prefix of at least one token")
        states = self.start_decoding()
        for t in range(prefix.shape[1]):
            logits = self.decode_step(prefix[:, t], states)
        tokens = [prefix]
        for step in range(num_new_tokens):
            if greedy:
                token = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits.float(), dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            tokens.append(token[:, None])
            if step < num_new_tokens - 1:
                logits = self.decode_step(token, states)
        return torch.cat(tokens, dim=1)


def _init_weights(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_model(config: ModelConfig) -> Transformer:
    return Transformer(config)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_models(layers: int, heads: int, d_model: int, vocab_size: int) -> list[dict]:
    """One row per registered mixer: name, origin (built-in or plugin package), family
    (attention or recurrent), parameters and recurrent state size (None: grows with length).

    A size that no model can have raises UserError; a plugin that fails to build gets
    parameters None and the reason under "error", and the other rows are still listed.
    """
    size = model_config(
        {"layers": layers, "heads": heads, "d_model": d_model, "vocab_size": vocab_size}
    )
    rows = []
    for name, entry in ATTENTIONS.entries().items():
        row = {"name": name, "origin": entry.origin, "family": None, "parameters": None,
               "state_size": None}
        try:
            model = build_model(replace(size, attention=name))
            row["family"] = model.blocks[0].attn.family
            row["parameters"], row["state_size"] = count_parameters(model), model.state_size()
        except Exception as exc:  # third-party code may fail in any way; built-ins may not
            if entry.origin == BUILTIN:
                raise
            message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            row["error"] = message
        rows.append(row)
    return rows
