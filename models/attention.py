"""Softmax attention under a position pattern, with a KV cache that keeps only what the pattern can still use.

A pattern says which key positions j each query position i may attend (always j <= i). Standard, sparse,
sliding-window and sink attention differ only in their pattern; each lives in its own module. Every pattern
here is monotone: once position j falls out of query i's reach, no later query reaches it, so a decoding
cache may drop it (``keep``). Full causal attention keeps everything in a preallocated buffer instead.

A local pattern (every allowed pair has i - j < reach, or j among a few global keys) trains blockwise when
that reads far fewer keys than the sequence holds: queries in blocks of Q >= reach, each block against its own
and the previous block's keys (all its windows can touch) plus the global keys (``Pattern.blocks``), one batched
masked attention call. Its cost grows as L (2 Q + globals), not L^2; at short L the dense masked call stays.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache, Mixer, gather_positions, heads_view, merge_heads


class Pattern:
    """Causal by default; subclasses narrow ``allowed``."""

    causal_only = True  # full causal: SDPA's is_causal fast path, and a cache that keeps every position
    reach: int | None = None  # local patterns: every allowed pair has i - j < reach or j in global_keys

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Bool mask, broadcasting query positions i against key positions j."""
        return j <= i

    def mask(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(T, S) mask for query positions (T,) against key positions (S,)."""
        return self.allowed(queries[:, None], keys[None, :])

    def pairs(self, length: int) -> int:
        """Number of allowed (i, j) pairs in a sequence of ``length`` tokens."""
        pos = torch.arange(length)
        return sum(int(self.mask(pos[i : i + 1], pos[: i + 1]).sum()) for i in range(length))

    def attended(self, length: int) -> int:
        """Earlier positions the next query (position ``length``) may attend: what a cache must keep."""
        return int(self.mask(torch.tensor([length]), torch.arange(length)).sum())

    def global_keys(self, length: int) -> torch.Tensor:
        """Positions beyond the local window that later queries may attend (sinks, block summaries)."""
        return torch.zeros(0, dtype=torch.long)

    def blocks(self, length: int, device=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Blockwise plan for a sequence of ``length`` in n blocks of Q queries, for ``blockwise_attention``: the
        global key positions (G,) and the (n, Q, 2Q + G) mask of each block over its keys (previous block, own
        block, global keys); None where it would not save work (full causal, or keys per block above
        L / BLOCKWISE_SAVING)."""
        if self.reach is None:
            return None
        extra = self.global_keys(length)
        Q = max(self.reach, BLOCK_QUERIES)  # Q >= reach: the previous block holds every earlier key a window reaches
        if (2 * Q + len(extra)) * BLOCKWISE_SAVING > length:
            return None
        starts = torch.arange(math.ceil(length / Q))[:, None] * Q  # (n, 1): first query of each block
        local = starts - Q + torch.arange(2 * Q)  # (n, 2Q): the previous block's positions, then the block's own
        keys = torch.cat([local, extra.expand(len(starts), -1)], 1)  # (n, S)
        # block 0's previous block is padding, not keys; a global key inside the local span is there already
        valid = torch.cat([local >= 0, extra < starts - Q], 1)  # (n, S)
        # the last block may run past the sequence: padded queries (dropped afterwards) see their own padded key
        # (allowed(i, i) holds), so no row is empty; real queries never reach a padded key (j > i)
        queries = starts + torch.arange(Q)  # (n, Q)
        mask = self.allowed(queries[..., None], keys[:, None, :]) & valid[:, None]
        return extra.to(device), mask.to(device)


# blockwise only where a block reads at most 1/this of the keys: measured on 2 CPU cores (benchmarks.bench_models)
BLOCKWISE_SAVING = 4
BLOCK_QUERIES = 64  # smaller blocks make too many small attention products


class SoftmaxAttention(Mixer):
    """Multi-head softmax attention, scale 1/sqrt(D/H):  softmax(q k^T / sqrt(hd) + mask) v."""

    def __init__(self, width: int, heads: int, dropout: float, pattern: Pattern):
        super().__init__()
        self.heads, self.pattern, self.dropout = heads, pattern, dropout
        self.blockwise = True  # False: always the dense masked call (what the benchmark compares against)
        self.qkv = nn.Linear(width, 3 * width)  # fused q, k, v
        # (length, device) -> Pattern.blocks: built on the host once per length, not at every forward
        self.plans: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor] | None] = {}

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        return self.attend(x, cache, layer)

    def at_positions(
        self, x: torch.Tensor, at: torch.Tensor, cache: Cache | None = None, layer: int = 0
    ) -> torch.Tensor:
        """(B, T, D) -> (B, R, D): queries at positions ``at`` (B, R) of this chunk only, against every key their
        pattern allows; keys and values of every position (into the cache too, where there is one). R T attention
        pairs instead of about T^2 / 2: a classification's training step, a greedy decode's prefill."""
        return self.attend(x, cache, layer, at)

    def attend(self, x: torch.Tensor, cache: Cache | None, layer: int, at: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x.shape
        if at is None:
            q, k, v = self.qkv(x).split(D, dim=2)  # (B, T, D) each, one matmul
        else:
            w, b = self.qkv.weight, self.qkv.bias
            q = F.linear(gather_positions(x, at), w[:D], b[:D])  # (B, R, D)
            k, v = F.linear(x, w[D:], b[D:]).split(D, dim=2)  # (B, T, D) each
        q, k, v = (heads_view(t, self.heads) for t in (q, k, v))  # (B, H, T or R, hd)
        if torch.is_autocast_enabled(x.device.type):
            # what autocast does to SDPA's inputs, done here because under vmap (a fused trial, models.fused) autocast
            # reaches only the kernel SDPA dispatches to, not SDPA: the attention would run in float32
            dtype = torch.get_autocast_dtype(x.device.type)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        p = self.dropout if self.training else 0.0
        start = cache.pos if cache is not None else 0
        queries = torch.arange(start, start + T, device=x.device)
        if cache is None and at is None:
            plan = self.plan(T, x.device) if self.blockwise else None
            if self.pattern.causal_only:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
            elif plan is None:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.pattern.mask(queries, queries), dropout_p=p)
            else:
                y = blockwise_attention(q, k, v, *plan, p)
            return merge_heads(y)
        keys, K, V = (queries, k, v) if cache is None else self.remember(cache, layer, k, v)
        mask: torch.Tensor | None = None  # a one-token step of full causal attention reads every key
        if at is not None:
            mask = self.pattern.allowed((start + at)[:, None, :, None], keys)  # (B, 1, R, S)
        elif T > 1 or not self.pattern.causal_only:
            mask = self.pattern.mask(queries, keys)  # (T, S)
        y = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, dropout_p=p)
        return merge_heads(y)  # (B, T or R, D)

    def remember(
        self, cache: Cache, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Adds this chunk's keys and values (B, H, T, hd) to the layer's cache; returns every key position its
        queries may read (S,) and their keys and values (B, H, S, hd)."""
        state, start, T = cache.layers[layer], cache.pos, k.shape[2]
        if self.pattern.causal_only:  # preallocated once for the whole decode: (B, H, max_len, hd)
            if not state:
                state["k"] = k.new_empty(*k.shape[:2], cache.max_len, k.shape[3])
                state["v"] = torch.empty_like(state["k"])
            state["k"][:, :, start : start + T] = k
            state["v"][:, :, start : start + T] = v
            seen = start + T
            return torch.arange(seen, device=k.device), state["k"][:, :, :seen], state["v"][:, :, :seen]
        # only the positions some future query may still attend
        queries = torch.arange(start, start + T, device=k.device)
        keys = torch.cat([state["pos"], queries]) if state else queries
        K = torch.cat([state["k"], k], 2) if state else k
        V = torch.cat([state["v"], v], 2) if state else v
        keep = self.pattern.allowed(torch.tensor(start + T, device=k.device), keys)
        state["pos"], state["k"], state["v"] = keys[keep], K[:, :, keep], V[:, :, keep]
        return keys, K, V

    def plan(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if (length, device) not in self.plans:
            self.plans[length, device] = self.pattern.blocks(length, device)
        return self.plans[length, device]

    def exact_flops(self, length: int) -> int:
        # q k^T and A v: each allowed pair costs hd multiply-adds per head, i.e. D per pair, twice
        width = self.qkv.in_features
        return 2 * 2 * self.pattern.pairs(length) * width

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        # keys and values of every earlier position the next token may attend
        width = self.qkv.in_features
        return 2 * self.pattern.attended(length) * width * bytes_per_value


def blockwise_attention(q, k, v, extra: torch.Tensor, mask: torch.Tensor, dropout: float) -> torch.Tensor:
    """q, k, v (B, H, T, hd), ``Pattern.blocks``' global keys (G,) and mask (n, Q, 2Q + G) -> (B, H, T, hd).

    Block b's keys are blocks b-1 and b of a front-padded k: two shifted views of one (n+1)-block tensor, so
    forward and backward are plain copies and adds (an index gather's backward is a slow scatter-add on CPU).
    Blocks ride in SDPA's head dimension, (B*H, n, Q, hd) with a (1, n, Q, S) mask: 4-D, so CPU flash attention
    runs it, not the materialising math backend."""
    B, H, T, hd = q.shape
    n, Q, S = mask.shape
    qb = F.pad(q, (0, 0, 0, n * Q - T)).reshape(B * H, n, Q, hd)  # queries in blocks, the last one padded

    def keys_of_blocks(t: torch.Tensor) -> torch.Tensor:  # (B, H, T, hd) -> (B*H, n, 2Q + G, hd)
        tb = F.pad(t, (0, 0, Q, n * Q - T)).view(B * H, n + 1, Q, hd)  # a zero block in front, the last padded
        glob = t[:, :, extra].view(B * H, 1, len(extra), hd).expand(-1, n, -1, -1)  # (B*H, n, G, hd)
        return torch.cat([tb[:, :-1], tb[:, 1:], glob], 2)

    y = F.scaled_dot_product_attention(
        qb, keys_of_blocks(k), keys_of_blocks(v), attn_mask=mask[None], dropout_p=dropout
    )  # (B*H, n, Q, hd); CUDA's memory-efficient kernel may return it non-contiguous, hence reshape
    return y.reshape(B, H, n * Q, hd)[:, :, :T]


def attention_model(
    arch: str, pattern: Pattern, *, vocab_size, width, depth, heads, max_len, dropout, positions: str = "sinusoidal"
):
    """The DP paper's Transformer with softmax attention under ``pattern``."""
    return BlockStack(
        arch,
        vocab_size,
        width,
        depth,
        max_len,
        dropout,
        lambda: SoftmaxAttention(width, heads, dropout, pattern),
        positions=positions,
    )
