"""Packs: several models of one architecture computed as one (pathbench.models.pack)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pathbench.models import build_model, model_config
from pathbench.models.pack import NotPackable, is_packed, member_state_dict, pack_models

VARIANTS = ["nope", "rope", "sba", "fox", "path", "path_fox"]
MIXERS = ["deltanet", "gated_deltanet", "deltaproduct", "rwkv7"]  # recurrent
VOCAB = 11

pytestmark = pytest.mark.usefixtures("one_thread")


def make_models(attention, seeds):
    config = model_config({"attention": attention, "vocab_size": VOCAB, "layers": 2,
                           "heads": 2, "d_model": 32})
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build_model(config).double())
    return models


@pytest.mark.parametrize("attention", VARIANTS + MIXERS)
def test_a_pack_computes_each_member_on_its_rows_forward_and_backward(attention):
    models = make_models(attention, seeds=[3, 4, 5])
    packed = pack_models(models)
    assert is_packed(packed) and not is_packed(models[0])
    inputs = torch.randint(0, VOCAB, (3, 4, 13), generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(3, 4, 13, VOCAB, dtype=torch.float64)

    logits = packed(inputs.flatten(0, 1)).view(3, 4, 13, VOCAB)
    (logits * upstream).sum().backward()
    for member, model in enumerate(models):
        alone = model(inputs[member])
        (alone * upstream[member]).sum().backward()
        torch.testing.assert_close(logits[member], alone, rtol=1e-12, atol=1e-12)
        packed_params = dict(packed.named_parameters())
        for name, param in model.named_parameters():
            torch.testing.assert_close(packed_params[name].grad[member], param.grad,
                                       rtol=1e-10, atol=1e-12, msg=name)


def test_a_members_weights_load_into_a_single_model():
    models = make_models("path_fox", seeds=[0, 1])
    packed = pack_models(models)
    single = make_models("path_fox", seeds=[7])[0]
    single.load_state_dict(member_state_dict(packed, 1))
    for name, value in models[1].state_dict().items():
        assert torch.equal(single.state_dict()[name], value), name


def test_a_module_without_a_packed_version_is_refused():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

    models = make_models("nope", seeds=[0, 1])
    for model in models:
        model.blocks[0].extra = Scaled()
    with pytest.raises(NotPackable, match=r"blocks\.0\.extra \(Scaled\)"):
        pack_models(models)
