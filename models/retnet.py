"""retnet: multi-scale retention (Sun et al. 2023) with per-head decay gamma_h = 1 - 2^(-5-h).

    Retention(X) = (Q K^T * Gamma) V,  Gamma[n, m] = gamma^(n-m) for n >= m      (parallel form, eq. 5)
    S_n = gamma S_{n-1} + K_n^T V_n,  o_n = Q_n S_n                              (recurrent form, eq. 6)
    MSR(X) = (swish(X W_G) * GroupNorm(heads(X))) W_O                            (eq. 8; W_O is the block's Proj)

Queries and keys are rotated by their absolute position (rotary; RetNet's xPos without its extrapolation
scaling), keys scaled by 1/sqrt(hd).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache
from models.linear_nofm import UnnormalisedLinearAttention
from models.registry import Option, register


def rotate(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary position embedding of (B, H, T, hd) at positions start..start+T-1 (Su et al. 2021)."""
    T, hd = x.shape[2], x.shape[3]
    # angles in float32 whatever x's dtype: bfloat16 holds integers exactly only up to 256, so under bf16 autocast
    # the positions beyond it would round (training would then see other positions than fp32 evaluation)
    freq = 10000.0 ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)  # (hd/2,)
    angle = torch.arange(start, start + T, device=x.device, dtype=torch.float32)[:, None] * freq  # (T, hd/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Retention(UnnormalisedLinearAttention):
    def __init__(self, width: int, heads: int, chunk: int):
        super().__init__(width, heads, chunk, gamma=1 - 2.0 ** (-5 - torch.arange(heads, dtype=torch.float32)))
        self.gate = nn.Linear(width, width)
        self.norm = nn.GroupNorm(heads, width)

    def position(self, q, k, start):
        return rotate(q, start), rotate(k, start)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, D = x.shape
        y = super().forward(x, cache, layer)  # (B, T, D)
        return F.silu(self.gate(x)) * self.norm(y.reshape(B * T, D)).view(B, T, D)


@register("retnet", chunk=Option(64, int, 1))
def build(*, vocab_size, width, depth, heads, max_len, dropout, chunk):
    """Multi-scale retention, swish gate, per-head decay; no position embedding (rotary inside)."""
    return BlockStack(
        "retnet", vocab_size, width, depth, max_len, dropout, lambda: Retention(width, heads, chunk), positions="none"
    )
