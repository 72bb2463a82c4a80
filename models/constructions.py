"""Models with set weights: what an architecture can express, apart from what training finds.

``flipflop_two_layer_path`` is a two-layer PaTH transformer of the flip-flop model's size (two
heads, width 64) that solves flip-flop at any length: the existence claim of the PaTH paper
(its Theorem A.1), built for this project's own model, not trained.

How it works. A Householder factor with beta = 1 is a projection: H_t = I - w_t w_t^T removes
the component along w_t from every key that a later query reads through it (PaTH's logit is
q_i^T H_i ... H_{j+1} k_j). So a token can *erase* the keys before it along one direction,
and a query that looks along that direction sees only the keys written since the last erasure.
Every Householder below has beta = 1 and w_t one of two unit directions per token class: the
direction the layer's queries look along (erase), or a direction no query or key uses (keep).
Only head 0 of each layer works; head 1, the MLPs and every other weight are zero.

Residual stream (width 64): dims 0-4 the token, embedded as a one-hot; dim 5
"this bit was written" (layer 1); dims 6, 7 "the last written bit is 0 / 1" (layer 2). Each
norm divides by the root mean square, so the attention inputs below are 8 (or 8 / sqrt(2)
where dim 5 is set) in the token's dim.

- Layer 1, previous instruction: bit tokens query along e_A, instruction tokens key along e_A
  and erase it. A bit's query reaches the instruction just before it (nothing erases between
  them) and no earlier one. Its value is 1 for ``w``: dim 5 = [the previous token is ``w``].
  Instruction tokens query along e_B, which only bits key: they read bits, whose value is 0.
- Layer 2, last write: ``r`` queries along e_A; bits key along e_A with weight dim 5 - 1/2
  (+ for a written bit, - for any other) and instruction tokens with a large negative weight;
  every ``w`` erases e_A. Of the written bits, only the last write's is not erased, so the read
  attends to it alone; its value, the bit, goes to dims 6, 7, and the output head reads them.

The logit margins are about 45 (layer 1) and 64 (layer 2), so that even 16,384 positions of
leftover weight (e^-45 each) cannot move an output: the errors are exactly zero, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pathbench.models.config import model_config
from pathbench.models.transformer import Transformer

# flip-flop's tokens: the instructions write, read, ignore, and the two bits
FLIPFLOP_TOKENS = ("w", "r", "i", "0", "1")
WRITTEN, LAST_ZERO, LAST_ONE = 5, 6, 7  # residual dims the two layers write
# head-0 dims: the direction queries look along (and Householders erase), the one only
# instruction queries and bit keys use (layer 1), a direction nothing reads (Householders that
# keep), and the two bit values (layer 2)
LOOK, OTHER, UNUSED, VALUE_ZERO, VALUE_ONE = range(5)
Q_SCALE_1 = 2.0  # layer 1: logit 8 * 2 * 8 * 2 / sqrt(32) = 45
Q_SCALE_2, K_SCALE_2 = 4.0, 4.0  # layer 2: logit 8 * 4 * (8 / sqrt(2)) * 4 / 2 / sqrt(32) = 64


def flipflop_two_layer_path(vocab: list[str]) -> Transformer:
    """The two-layer PaTH model (2 heads, width 64) with set weights that solves flip-flop, for
    the task's vocabulary ``vocab`` (token strings; flip-flop's five, in any order)."""
    if sorted(vocab) != sorted(FLIPFLOP_TOKENS):
        raise ValueError(f"the flip-flop construction needs the tokens {FLIPFLOP_TOKENS}, got "
                         f"{vocab}")
    write, read, ignore, zero, one = map(vocab.index, FLIPFLOP_TOKENS)
    instructions, bits = (write, read, ignore), (zero, one)
    config = model_config({"vocab_size": len(vocab), "attention": "path", "layers": 2,
                           "heads": 2, "d_model": 64})
    model = Transformer(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (model.norm, *(n for b in model.blocks for n in (b.attn_norm, b.mlp_norm))):
            norm.weight.fill_(1.0)
        for token in range(len(vocab)):
            model.embed.weight[token, token] = 1.0
        first, second = (block.attn for block in model.blocks)
        d = config.d_model
        for attn in (first, second):
            attn.w_conv.weight[:, 0, -1] = 1.0  # w_t from token t alone
            # beta = 2 sigmoid(0) = 1 (beta_proj is zero): every Householder is a projection

        q, k, v = first.qkv.weight[:d], first.qkv.weight[d:2 * d], first.qkv.weight[2 * d:]
        for token in bits:
            q[LOOK, token] = Q_SCALE_1
            k[OTHER, token] = Q_SCALE_1
            _householder(first, token, erase=False)
        for token in instructions:
            q[OTHER, token] = Q_SCALE_1
            k[LOOK, token] = Q_SCALE_1
            _householder(first, token, erase=True)
        v[0, write] = 1.0 / 8.0  # the input is 8 in the token's dim: a value of 1
        first.out.weight[WRITTEN, 0] = 1.0

        q, k, v = second.qkv.weight[:d], second.qkv.weight[d:2 * d], second.qkv.weight[2 * d:]
        q[LOOK, read] = Q_SCALE_2
        k[LOOK, WRITTEN] = K_SCALE_2
        for token in bits:
            k[LOOK, token] = -K_SCALE_2 / 2
        for token in instructions:
            k[LOOK, token] = -2 * K_SCALE_2
        for token in range(len(vocab)):
            _householder(second, token, erase=token == write)
        v[VALUE_ZERO, zero] = v[VALUE_ONE, one] = 1.0
        second.out.weight[LAST_ZERO, VALUE_ZERO] = second.out.weight[LAST_ONE, VALUE_ONE] = 1.0

        model.head.weight[zero, LAST_ZERO] = model.head.weight[one, LAST_ONE] = 1.0
        model.head.weight[zero, LAST_ONE] = model.head.weight[one, LAST_ZERO] = -1.0
    return model.eval()


def _householder(attn, token: int, erase: bool) -> None:
    """Make ``token``'s Householder direction in head 0 the erased one (LOOK) or one that no
    query or key uses (UNUSED). w_t = normalize(w_up(w_down(x_t))): the rank-32 bottleneck's
    channel ``token`` carries the token to that direction; head 1 gets w = 0 (H = I)."""
    attn.w_down.weight[token, token] = 1.0
    attn.w_up.weight[LOOK if erase else UNUSED, token] = 1.0


@dataclass(frozen=True)
class Construction:
    """A model with set weights for one task: ``name`` is how tables show it beside trained
    models, ``claim`` what scoring it tests."""

    name: str
    task: str
    build: Callable[[list[str]], Transformer]  # the task's vocabulary -> the model
    claim: str


CONSTRUCTIONS = {construction.task: construction for construction in [
    Construction("path_construction", "flipflop", flipflop_two_layer_path,
                 "two PaTH layers solve flip-flop at any length (the PaTH paper's Theorem A.1)"),
]}
