"""Softmax attention under a position pattern, with a KV cache that keeps only what the pattern can still use.

A pattern says which key positions j each query position i may attend (always j <= i). Standard, sparse,
sliding-window and sink attention differ only in their pattern; each lives in its own module. Every pattern
here is monotone: once position j falls out of query i's reach, no later query reaches it, so a decoding
cache may drop it (``keep``). Full causal attention keeps everything in a preallocated buffer instead.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import Cache, Mixer, heads_view, merge_heads


class Pattern:
    """Causal by default; subclasses narrow ``allowed``."""

    causal_only = True  # full causal: SDPA's is_causal fast path, and a cache that keeps every position

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Bool mask, broadcasting query positions i against key positions j."""
        return j <= i

    def mask(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(T, S) mask for query positions (T,) against key positions (S,)."""
        return self.allowed(queries[:, None], keys[None, :])

    def pairs(self, length: int) -> int:
        """Number of allowed (i, j) pairs in a sequence of ``length`` tokens."""
        pos = torch.arange(length)
        return sum(int(self.mask(pos[i:i + 1], pos[:i + 1]).sum()) for i in range(length))

    def attended(self, length: int) -> int:
        """Earlier positions the next query (position ``length``) may attend: what a cache must keep."""
        return int(self.mask(torch.tensor([length]), torch.arange(length)).sum())


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
        start = cache.pos if cache is not None else 0
        queries = torch.arange(start, start + T, device=x.device)
        if cache is None:
            if self.pattern.causal_only:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.pattern.mask(queries, queries), dropout_p=p)
            return merge_heads(y)
        state = cache.layers[layer]
        if self.pattern.causal_only:  # preallocated once for the whole decode: (B, H, max_len, hd)
            if not state:
                state["k"] = q.new_empty(B, self.heads, cache.max_len, D // self.heads)
                state["v"] = torch.empty_like(state["k"])
            state["k"][:, :, start:start + T] = k
            state["v"][:, :, start:start + T] = v
            keys, K, V = torch.arange(start + T, device=x.device), state["k"][:, :, :start + T], state["v"][:, :, :start + T]
            mask = None if T == 1 else self.pattern.mask(queries, keys)
        else:  # only the positions some future query may still attend
            keys = torch.cat([state["pos"], queries]) if state else queries
            K = torch.cat([state["k"], k], 2) if state else k
            V = torch.cat([state["v"], v], 2) if state else v
            mask = self.pattern.mask(queries, keys)
            keep = self.pattern.allowed(torch.tensor(start + T, device=x.device), keys)
            state["pos"], state["k"], state["v"] = keys[keep], K[:, :, keep], V[:, :, keep]
        y = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, dropout_p=p)
        return merge_heads(y)  # (B, T, D)

    def exact_flops(self, length: int) -> int:
        # q k^T and A v: each allowed pair costs hd multiply-adds per head, i.e. D per pair, twice
        width = self.qkv.in_features
        return 2 * 2 * self.pattern.pairs(length) * width

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        # keys and values of every earlier position the next token may attend
        width = self.qkv.in_features
        return 2 * self.pattern.attended(length) * width * bytes_per_value


def attention_model(arch: str, pattern: Pattern, *, vocab_size, width, depth, heads, max_len, dropout,
                    positions: str = "sinusoidal"):
    """The DP paper's Transformer with softmax attention under ``pattern``."""
    from models.backbone import BlockStack

    return BlockStack(arch, vocab_size, width, depth, max_len, dropout,
                      lambda: SoftmaxAttention(width, heads, dropout, pattern), positions=positions)
