"""A pathbench attention variant defined outside pathbench: ALiBi (Press et al., 2022).

Softmax attention with a per-head linear penalty on distance, -slope_h * (i - j), and no
other position encoding; slopes 2^(-8 h / H) for heads h = 1..H.
"""

import torch
import torch.nn.functional as F

from pathbench.models import Attention


class ALiBiAttention(Attention):
    def attend(self, q, k, v, x):
        T = q.shape[1]
        slopes = 2.0 ** (-8.0 * torch.arange(1, self.heads + 1, device=q.device) / self.heads)
        position = torch.arange(T, device=q.device)
        distance = (position[:, None] - position[None, :]).to(q.dtype)
        bias = (-slopes[:, None, None] * distance).to(q.dtype)  # [H, T, T]
        bias = bias.masked_fill(distance < 0, float("-inf"))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias
        )
        return out.transpose(1, 2)
