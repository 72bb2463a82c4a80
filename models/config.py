"""ModelConfig: everything that decides a model's shape, checked strictly."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from pathbench import UserError
from pathbench.models.attention import ATTENTIONS
from pathbench.settings import coerce


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only transformer of `layers` blocks with `heads` heads of d_model / heads dims."""

    vocab_size: int
    attention: str = "path"  # a name in pathbench.models.ATTENTIONS
    layers: int = 1
    heads: int = 2
    d_model: int = 64
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model
    beta_max: float = 2.0  # upper clip of PaTH's beta (< 2 keeps low-precision runs stable)
    householder_steps: int = 2  # deltaproduct's delta-rule steps per token
    # the attention's implementation: "auto" (Triton on CUDA where it takes the shape, else
    # torch), "torch" or "triton"; the attention class lists the ones it has
    backend: str = "auto"


FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
# Upper bounds far beyond any model this benchmark trains, so that a typo (layers 100000) is an
# error at once instead of a machine filling its memory.
LIMITS = {"vocab_size": 1_000_000, "layers": 256, "heads": 256, "d_model": 16_384,
          "mlp_ratio": 64, "householder_steps": 16}


def model_config(values: dict) -> ModelConfig:
    """A ModelConfig from a dict (strings from the command line are converted by field type).

    Unknown keys, a missing vocab_size, unconvertible or out-of-range values raise UserError
    naming the key and what is allowed.
    """
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise UserError(
            f"unknown model config key {unknown[0]!r}; valid keys: {', '.join(FIELDS)}"
        )
    if "vocab_size" not in values:
        raise UserError("model config needs 'vocab_size'")
    hints = typing.get_type_hints(ModelConfig)
    converted = {key: coerce(f"model config {key!r}", value, hints[key])
                 for key, value in values.items()}
    config = ModelConfig(**converted)

    attention = ATTENTIONS.get(config.attention)  # a UserError naming the valid choices
    for key in LIMITS:
        value, limit = getattr(config, key), LIMITS[key]
        if not 1 <= value <= limit:
            raise UserError(
                f"model config {key!r} must be an integer from 1 to {limit}, got {value}"
            )
    if config.d_model % config.heads:
        raise UserError(
            f"model config 'd_model' ({config.d_model}) must be divisible by "
            f"'heads' ({config.heads})"
        )
    if not 0.0 < config.beta_max <= 2.0:
        raise UserError(f"model config 'beta_max' must be in (0, 2], got {config.beta_max}")
    attention.check_config(config)
    return config
