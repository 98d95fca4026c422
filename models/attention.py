"""Softmax attention under a position pattern, with a preallocated KV cache for decoding.

A pattern says which key positions j each query position i may attend (always j <= i). Standard, sparse,
sliding-window and sink attention differ only in their pattern; each lives in its own module.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.transformer import Cache, Mixer, heads_view, merge_heads


class Pattern:
    """Causal by default; subclasses narrow ``allowed``."""

    causal_only = True  # lets the full forward use SDPA's is_causal fast path

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Bool mask, broadcasting query positions i (T, 1) against key positions j (1, S)."""
        return j <= i

    def mask(self, start: int, T: int, S: int, device) -> torch.Tensor:
        """(T, S) mask for queries start..start+T-1 against keys 0..S-1."""
        i = torch.arange(start, start + T, device=device)[:, None]
        j = torch.arange(S, device=device)[None, :]
        return self.allowed(i, j)

    def pairs(self, length: int) -> int:
        """Number of allowed (i, j) pairs in a sequence of ``length`` tokens, counted row by row."""
        return sum(int(self.mask(i, 1, i + 1, "cpu").sum()) for i in range(length))

    def attended(self, length: int) -> int:
        """Earlier positions the next query (position ``length``) may attend: what a cache must keep."""
        return int(self.mask(length, 1, length, "cpu").sum())


class SoftmaxAttention(Mixer):
    """Multi-head softmax attention, scale 1/sqrt(D/H):  softmax(q k^T / sqrt(hd) + mask) v."""

    def __init__(self, width: int, heads: int, dropout: float, pattern: Pattern):
        super().__init__()
        self.heads, self.pattern, self.dropout = heads, pattern, dropout
        self.qkv = nn.Linear(width, 3 * width)  # fused q, k, v

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (heads_view(t, self.heads) for t in self.qkv(x).split(D, dim=2))  # (B, H, T, hd) each
        p = self.dropout if self.training else 0.0
        if cache is None:
            if self.pattern.causal_only:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.pattern.mask(0, T, T, x.device), dropout_p=p)
            return merge_heads(y)
        start, state = cache.pos, cache.layers[layer]
        if not state:  # allocate once for the whole decode: (B, H, max_len, hd)
            state["k"] = q.new_empty(B, self.heads, cache.max_len, D // self.heads)
            state["v"] = torch.empty_like(state["k"])
        state["k"][:, :, start:start + T] = k
        state["v"][:, :, start:start + T] = v
        S = start + T
        mask = self.pattern.mask(start, T, S, x.device)  # (T, S)
        y = F.scaled_dot_product_attention(q, state["k"][:, :, :S], state["v"][:, :, :S], attn_mask=mask, dropout_p=p)
        return merge_heads(y)  # (B, T, D)

    def exact_flops(self, length: int) -> int:
        # q k^T and A v: each allowed pair costs hd multiply-adds per head, i.e. D per pair, twice
        width = self.qkv.in_features
        return 2 * 2 * self.pattern.pairs(length) * width

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        # keys and values of every position the next token may attend
        width = self.qkv.in_features
        return 2 * self.pattern.attended(length) * width * bytes_per_value
