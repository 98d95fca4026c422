"""linear_nofm: the separations paper's linear Transformer: retention with decay 1, no feature map, no
normalisation: out_t = q_t^T S_t with S_t = sum_{j<=t} k_j v_j^T / sqrt(hd). Kept distinct from the DP paper's
normalised elu + 1 variant (``linear``); ``retnet`` is this mixer with per-head decay, rotary, gate and norm."""

import torch
import torch.nn as nn

from models.backbone import BlockStack, Cache, Mixer, heads_view, merge_heads
from models.linear import chunked_scan
from models.registry import Option, register


class UnnormalisedLinearAttention(Mixer):
    gamma: torch.Tensor  # a buffer: per-head decay (1 unless given)

    def __init__(self, width: int, heads: int, chunk: int, gamma: torch.Tensor | None = None):
        super().__init__()
        self.heads, self.chunk = heads, chunk
        self.qkv = nn.Linear(width, 3 * width)
        self.register_buffer("gamma", torch.ones(heads) if gamma is None else gamma, persistent=False)

    def position(self, q: torch.Tensor, k: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook for position information in q and k (none here: learned positions enter at the embedding)."""
        return q, k

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        D = x.shape[-1]
        q, k, v = (heads_view(t, self.heads) for t in self.qkv(x).split(D, dim=2))  # (B, H, T, hd)
        q, k = self.position(q, k, cache.pos if cache is not None else 0)
        state = cache.layers[layer] if cache is not None else {}
        return merge_heads(chunked_scan(q, k * (D // self.heads) ** -0.5, v, state, self.gamma, False, self.chunk))

    def exact_flops(self, length: int) -> int:
        # per token and head: S = gamma S + k v^T (hd^2), q^T S (hd^2)
        hd = self.qkv.in_features // self.heads
        return 2 * length * self.heads * 2 * hd * hd

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        hd = self.qkv.in_features // self.heads
        return self.heads * hd * hd * bytes_per_value


@register("linear_nofm", chunk=Option(64, int, 1))
def build(*, vocab_size, width, depth, heads, max_len, dropout, chunk):
    """Unnormalised linear attention without feature map (decay 1), learned positions."""
    return BlockStack(
        "linear_nofm",
        vocab_size,
        width,
        depth,
        max_len,
        dropout,
        lambda: UnnormalisedLinearAttention(width, heads, chunk),
        positions="learned",
    )
