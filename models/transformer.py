"""The DP paper's decoder-only Transformer (Feng et al.'s minGPT), with the attention ("mixer") pluggable.

    x = Drop(LN(Emb(tokens) + Pos))                     sinusoidal positions, fixed
    x += Drop(Proj(Mixer(LN(x))))            } x depth  pre-LN blocks
    x += Drop(W2 GELU(W1 LN(x)))             }          FFN width 4D, tanh GELU
    logits = Head(LN(x))                                untied head

A mixer maps (B, T, D) -> (B, T, D) and owns its decoding state: given a ``Cache`` it continues from
``cache.pos`` tokens already seen, so prefill (T > 1) and one-token steps (T = 1) share one code path.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cache:
    """Decoding state of a whole model: tokens seen so far, and one dict of tensors per layer."""

    def __init__(self, depth: int, batch: int, max_len: int):
        self.pos, self.batch, self.max_len = 0, batch, max_len
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(depth)]


class Mixer(nn.Module):
    """Sequence mixing inside a block. Subclasses implement forward, exact_flops and state_bytes."""

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def exact_flops(self, length: int) -> int:
        """FLOPs of the mixing itself (not its Linear layers) over one sequence: 2 per multiply-add."""
        raise NotImplementedError

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        """Bytes of state this layer keeps to decode token ``length + 1``."""
        raise NotImplementedError


def sinusoids(max_len: int, width: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...)  (Vaswani et al. 2017, sec. 3.5)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    pe = torch.zeros(max_len, width)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : width // 2]
    return pe


class Block(nn.Module):
    def __init__(self, width: int, mixer: Mixer, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mixer = mixer
        self.proj = nn.Linear(width, width)
        self.ffn = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: Cache | None, layer: int) -> torch.Tensor:
        x = x + self.drop(self.proj(self.mixer(self.ln1(x), cache, layer)))
        return x + self.drop(self.ffn(self.ln2(x)))


class LanguageModel(nn.Module):
    """Decoder-only LM over a pluggable mixer; the uniform interface every architecture exposes."""

    def __init__(self, vocab_size: int, width: int, depth: int, heads: int, max_len: int, dropout: float,
                 make_mixer, arch: str):
        super().__init__()
        self.arch, self.vocab_size, self.width, self.depth, self.heads, self.max_len = (
            arch, vocab_size, width, depth, heads, max_len)
        self.embed = nn.Embedding(vocab_size, width)
        self.register_buffer("pos", sinusoids(max_len, width), persistent=False)
        self.ln_embed = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, make_mixer(), dropout) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        self.apply(init_weights)

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits; with a cache, continue after ``cache.pos`` tokens."""
        start = cache.pos if cache is not None else 0
        T = tokens.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_len {self.max_len}")
        x = self.drop(self.ln_embed(self.embed(tokens) + self.pos[start:start + T]))  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.pos += T
        return self.head(self.ln_f(x))

    def new_cache(self, batch: int) -> Cache:
        return Cache(self.depth, batch, self.max_len)

    # ---- accounting -------------------------------------------------------------------------------------
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def paper_flops(self, length: int) -> int:
        """DP paper convention (thop-style) over T = L + 2 tokens:  2 T (sum_Linear in*out + sum_LN 4 D).

        Attention products, softmax, GELU, dropout and embeddings cost nothing; for the standard model this is
        2 (L+2) (12 M D^2 + D V + 4 (2M + 2) D).
        """
        per_token = sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))
        per_token += sum(4 * m.normalized_shape[0] for m in self.modules() if isinstance(m, nn.LayerNorm))
        return 2 * (length + 2) * per_token

    def exact_flops(self, length: int) -> int:
        """Forward FLOPs over one sequence of ``length`` tokens, 2 per multiply-add: every Linear's matmul plus
        the mixing under the real pattern. Not counted: biases, LayerNorm, GELU, softmax, residual adds."""
        linear = sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))
        return 2 * length * linear + sum(b.mixer.exact_flops(length) for b in self.blocks)

    def state_size(self, length: int, bytes_per_value: int = 4) -> int:
        """Bytes of decoding state needed to produce token ``length + 1``."""
        return sum(b.mixer.state_bytes(length, bytes_per_value) for b in self.blocks)


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform for every weight matrix, zero biases, LayerNorm 1/0 (the DP paper's init)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.xavier_uniform_(module.weight)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def heads_view(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, hd)."""
    B, T, D = x.shape
    return x.view(B, T, heads, D // heads).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hd) -> (B, T, D)."""
    B, H, T, hd = y.shape
    return y.transpose(1, 2).reshape(B, T, H * hd)


__all__ = ["Cache", "LanguageModel", "Mixer", "F", "heads_view", "merge_heads"]
