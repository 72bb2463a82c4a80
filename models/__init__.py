"""Small decoder-only transformers whose attention variant is the only source of position.

``build_model(model_config({...}))`` gives a ``Transformer``; the attention variants live in
the ``ATTENTIONS`` registry (built-ins: nope, rope, sba, fox, path, path_fox, and the recurrent
mixers deltanet, gated_deltanet, deltaproduct, rwkv7 of ``recurrent``; other packages add
theirs through the entry-point group ``pathbench.attention``, see ``attention.Attention``).
"""

from pathbench.models.attention import ATTENTIONS, Attention, DecodingState
from pathbench.models.config import ModelConfig, model_config
from pathbench.models import recurrent  # noqa: F401  (registers the recurrent mixers)
from pathbench.models.transformer import (
    Transformer,
    build_model,
    count_parameters,
    describe_models,
)

__all__ = [
    "ATTENTIONS",
    "Attention",
    "DecodingState",
    "ModelConfig",
    "Transformer",
    "build_model",
    "count_parameters",
    "describe_models",
    "model_config",
]
