"""Several models of one architecture trained as one: a pack.

The benchmark's models are small, so a training step of one of them is hundreds of kernels
that each leave most of a GPU idle. A pack holds E such models (its members, which differ only
in their weights) in one module whose every kernel does the work of all E.

How: activations keep the usual layout with the members stacked along the batch, [E * B, ...],
member e's sequences in rows e * B to (e + 1) * B. Attention, residual adds and activations
treat every row alike, so they run unchanged on the stacked batch. Only the modules that hold
weights need to know which rows are whose: each is replaced by a packed version holding the E
members' weights stacked, [E, ...], and applying member e's to its rows. Parameter names stay
those of the single model, so ``member_state_dict`` gives back a state dict that a single model
loads.

A model is packable when every parameter belongs to a module of a kind in PACKED (linear
layers, RMSNorm, embeddings, PaTH's depthwise convolution); ``pack_models`` raises
NotPackable otherwise, for example for a plugin with a module of another kind.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from pathbench.models.attention import CausalDepthwiseConv, causal_depthwise_sum


class NotPackable(Exception):
    """The model has a parameter outside the modules that know how to pack."""


def _stacked(tensors) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))


class PackedLinear(nn.Module):
    def __init__(self, modules: list[nn.Linear]):
        super().__init__()
        self.members = len(modules)
        self.weight = _stacked(m.weight for m in modules)  # [E, out, in]
        self.bias = None if modules[0].bias is None else _stacked(m.bias for m in modules)

    def forward(self, x):
        rows = x.reshape(self.members, -1, x.shape[-1])  # [E, rows of one member, in]
        if self.bias is None:
            y = torch.bmm(rows, self.weight.mT)
        else:
            y = torch.baddbmm(self.bias[:, None, :], rows, self.weight.mT)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class PackedRMSNorm(nn.Module):
    def __init__(self, modules: list[nn.RMSNorm]):
        super().__init__()
        self.members = len(modules)
        self.normalized_shape, self.eps = modules[0].normalized_shape, modules[0].eps
        self.weight = _stacked(m.weight for m in modules)  # [E, d]

    def forward(self, x):
        y = F.rms_norm(x, self.normalized_shape, eps=self.eps)
        rows = y.reshape(self.members, -1, y.shape[-1])
        return (rows * self.weight[:, None, :]).reshape(y.shape)


class PackedEmbedding(nn.Module):
    def __init__(self, modules: list[nn.Embedding]):
        super().__init__()
        self.members = len(modules)
        self.weight = _stacked(m.weight for m in modules)  # [E, vocab, d]

    def forward(self, ids):
        # Member e's token t is row e * vocab + t of the members' tables laid end to end.
        vocab = self.weight.shape[1]
        offsets = torch.arange(self.members, device=ids.device)[:, None] * vocab
        stacked_ids = (ids.reshape(self.members, -1) + offsets).reshape(ids.shape)
        return F.embedding(stacked_ids, self.weight.flatten(0, 1))


class PackedDepthwiseConv(nn.Module):
    def __init__(self, modules: list[CausalDepthwiseConv]):
        super().__init__()
        self.members = len(modules)
        self.weight = _stacked(m.weight for m in modules)  # [E, channels, 1, width]

    def forward(self, window):
        # [E * B, L, C] -> [E, B, L, C], against each member's taps [E, 1, 1, C, width]
        E, (rows, L, C) = self.members, window.shape
        taps = self.weight[:, None, None, :, 0]
        out = causal_depthwise_sum(window.reshape(E, rows // E, L, C), taps)
        return out.reshape(rows, -1, C)


PACKED = {
    nn.Linear: PackedLinear,
    nn.RMSNorm: PackedRMSNorm,
    nn.Embedding: PackedEmbedding,
    CausalDepthwiseConv: PackedDepthwiseConv,
}


def pack_models(models: list[nn.Module]) -> nn.Module:
    """One module computing every model of ``models`` (same architecture) on stacked batches:
    inputs [E * B, ...] with model e's batch in rows e * B to (e + 1) * B, outputs likewise.
    The weights are copied; the models are left as they were."""
    packed = copy.deepcopy(models[0])
    for name, module in list(packed.named_modules()):
        kind = PACKED.get(type(module))
        if kind is None:
            if any(True for _ in module.parameters(recurse=False)):
                raise NotPackable(f"{name or 'the model'} ({type(module).__name__}) holds "
                                  f"parameters and has no packed version")
            continue
        parent_name, _, attribute = name.rpartition(".")
        setattr(packed.get_submodule(parent_name), attribute,
                kind([model.get_submodule(name) for model in models]))
    if any(buffer is not None for buffer in packed.buffers()):
        raise NotPackable("the model holds buffers, which packing does not stack")
    return packed


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(module, tuple(PACKED.values())) for module in model.modules())


def member_state_dict(packed: nn.Module, member: int) -> dict:
    """Member ``member``'s weights, under the names of the single model."""
    return {name: value[member].detach().clone() for name, value in packed.state_dict().items()}
