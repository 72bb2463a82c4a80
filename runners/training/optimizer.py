"""AdamW with gradient-norm clipping for a pack of E models, each with its own learning rate.

Every member is optimised exactly as it would be alone: decoupled weight decay on matrices
only, Adam moments and bias correction as in ``torch.optim.AdamW``, and clipping of the member's
own global gradient norm. Only the bookkeeping is shared: all parameters live in one flat
[E, N] buffer (member e's weights in row e) and their gradients in another, so that zeroing,
clipping and the update are a dozen kernels whatever the number of parameter tensors, and
every member's learning rate is one entry of a device tensor that a captured CUDA graph reads.

A single, unpacked model is a pack of one (E = 1).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

# A member's slice of the flat buffers is strided (one row of [E, N]), and so are the parameter
# and gradient views over it. Backward adds into such a gradient in place, which is what is
# wanted here, but torch warns that the gradient's layout is not a dense one.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")


# Every parameter starts on a 16-byte boundary, as do the members' rows. Compiled kernels may load
# a parameter in 16-byte vectors; one compiled for a block whose parameters were aligned is
# reused for the next block, whose parameters might not be (a misaligned-address fault).
ALIGN_BYTES = 16


def aligned_starts(widths: list[int], align: int) -> list[int]:
    """Where each of ``widths`` columns begins when every start is a multiple of ``align``,
    and last, the total width (a multiple of ``align`` too)."""
    starts = [0]
    for width in widths:
        starts.append(starts[-1] + -(-width // align) * align)
    return starts


class PackedAdamW:
    def __init__(self, model: nn.Module, lrs: list[float], weight_decay: float,
                 grad_clip: float, member_axis: bool, betas=(0.9, 0.98), eps: float = 1e-8):
        """lrs: each member's peak learning rate (E of them). member_axis: the parameters are
        packed, [E, ...] (pathbench.models.pack); without it the model is a single one (E = 1)
        and its parameters have their usual shapes."""
        members = len(lrs)
        params = [p for p in model.parameters() if p.requires_grad]
        first = params[0]
        widths = [p.numel() // members for p in params]
        starts = aligned_starts(widths, ALIGN_BYTES // first.element_size())
        self.members, self.grad_clip, self.betas, self.eps = members, grad_clip, betas, eps
        # the columns between parameters stay zero, as do their gradients and moments
        self.params = torch.zeros(members, starts[-1], dtype=first.dtype, device=first.device)
        self.grads = torch.zeros_like(self.params)
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        # Decay on matrices only (a packed matrix has the members' axis in front of its two):
        # decaying gains and biases toward zero only hurts.
        self.decay = torch.zeros(1, starts[-1], dtype=first.dtype, device=first.device)
        self.peak_lr = torch.tensor(lrs, dtype=first.dtype).view(members, 1).to(first.device)
        self.lr = torch.zeros_like(self.peak_lr)
        self.step_count = torch.zeros((), dtype=first.dtype, device=first.device)
        for p, width, start in zip(params, widths, starts):
            columns = slice(start, start + width)
            self.params[:, columns] = p.detach().reshape(members, width)
            # The parameter becomes a view of its columns, and its gradient too: backward adds
            # into an existing gradient in place, so it lands in self.grads.
            p.data = self.params[:, columns].view(p.shape)
            p.grad = self.grads[:, columns].view(p.shape)
            if p.dim() - member_axis >= 2:
                self.decay[:, columns] = weight_decay

    # Changes device memory with a kernel, never with a copy from the host, which would wait
    # for every queued step to finish.
    def freeze(self, member: int) -> None:
        """Learning rate 0 for ``member`` from now on: its weights no longer change."""
        self.peak_lr[member] = 0.0

    def zero_grad(self) -> None:
        self.grads.zero_()

    @torch.no_grad()
    def step(self, lr_factor) -> None:
        """Clip each member's gradient to norm grad_clip, then one AdamW update at each
        member's peak learning rate times ``lr_factor`` (a number, or a tensor on the device:
        the schedule)."""
        torch.mul(self.peak_lr, lr_factor, out=self.lr)
        norms = torch.linalg.vector_norm(self.grads, dim=1, keepdim=True)
        self.grads.mul_((self.grad_clip / (norms + 1e-6)).clamp_(max=1.0))
        beta1, beta2 = self.betas
        self.step_count += 1
        self.params.mul_(1 - self.lr * self.decay)
        self.exp_avg.lerp_(self.grads, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grads, self.grads, value=1 - beta2)
        step_size = self.lr / (1 - beta1**self.step_count)
        denominator = (self.exp_avg_sq / (1 - beta2**self.step_count)).sqrt_().add_(self.eps)
        self.params.addcdiv_(self.exp_avg * step_size, denominator, value=-1)
