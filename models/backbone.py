"""What every architecture shares: the ``LanguageModel`` interface, its decoding ``Cache``, and the block stack
most of them are built from.

The block stack is the DP paper's decoder (Feng et al.'s minGPT) with the sequence mixer pluggable:

    x = Drop(LN(Emb(tokens) + Pos))                     positions: sinusoidal, learned, or none
    x += Drop(Proj(Mixer(LN(x))))            } x depth  pre-LN blocks (Proj optional: some mixers project)
    x += Drop(W2 GELU(W1 LN(x)))             }          FFN width 4D, tanh GELU (optional)
    logits = Head(LN(x))                                untied head

A mixer maps (B, T, D) -> (B, T, D) and owns its decoding state: given a ``Cache`` it continues after
``cache.pos`` tokens, so prefill (T > 1) and one-token steps (T = 1) share one code path.

Asked for the logits at a few positions only (``at``: a classification's answer and <eos>, the only tokens its loss
reads), the last block computes only those rows: its mixer's output there (``Mixer.at_positions``: attention's queries
at those positions against every key), its FFN and the head. The loss and its gradients are the same; at the
separations paper's index lookup (L = 402, one layer, width 64) a training step costs about an eighth.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class Cache:
    """Decoding state of a whole model: tokens seen so far, and one dict of tensors per layer."""

    def __init__(self, depth: int, batch: int, max_len: int):
        self.pos, self.batch, self.max_len = 0, batch, max_len
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(depth)]


class Mixer(nn.Module):
    """Sequence mixing inside a block: implement forward, exact_flops and state_bytes."""

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def at_positions(
        self, x: torch.Tensor, at: torch.Tensor, cache: Cache | None = None, layer: int = 0
    ) -> torch.Tensor:
        """(B, T, D) -> (B, R, D): the output at positions ``at`` (B, R) of this chunk only, every position still read
        (and cached). By default all of it computed, then gathered: a recurrent mixer's scan needs every position."""
        return gather_positions(self(x, cache, layer), at)

    def exact_flops(self, length: int) -> int:
        """FLOPs of the mixing itself, beyond its nn.Linear layers, over one sequence: 2 per multiply-add."""
        raise NotImplementedError

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        """Bytes of state this layer keeps to decode token ``length + 1``."""
        raise NotImplementedError


class LanguageModel(nn.Module):
    """The interface of every architecture: (B, T) tokens -> (B, T, V) logits, or with ``at`` (B, R) positions the
    (B, R, V) logits there only; cached decoding; accounting."""

    arch: str
    vocab_size: int
    width: int
    depth: int
    max_len: int
    # why torch.func.vmap cannot batch K of these models (``models.fused``), whose members then run one after another;
    # None: it can
    unbatched: str | None = None

    def new_cache(self, batch: int) -> Cache:
        return Cache(self.depth, batch, self.max_len)

    def check_length(self, cache: Cache | None, T: int) -> int:
        start = cache.pos if cache is not None else 0
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_len {self.max_len}")
        return start

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def linear_macs(self) -> int:
        """Multiply-adds per token of every nn.Linear (and of nn.LSTM's gate matmuls, which are Linear in all but
        name): what a matmul-only counter sees."""
        macs = sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))
        for m in self.modules():
            if isinstance(m, nn.LSTM):  # per layer: 4 gates x H x (input + H)
                macs += sum(
                    4 * m.hidden_size * ((m.input_size if i == 0 else m.hidden_size) + m.hidden_size)
                    for i in range(m.num_layers)
                )
        return macs

    def paper_flops(self, length: int) -> int:
        """DP paper convention (thop-style) over T = L + 2 tokens:  2 T (sum_Linear in*out + sum_LN 4 D + conv).

        Attention products, scans, softmax, GELU, dropout and embeddings cost nothing; for the standard model
        this is 2 (L+2) (12 M D^2 + D V + 4 (2M + 2) D).
        """
        per_token = self.linear_macs()
        per_token += sum(4 * m.normalized_shape[0] for m in self.modules() if isinstance(m, nn.LayerNorm))
        per_token += sum(
            m.out_channels * m.in_channels // m.groups * m.kernel_size[0]
            for m in self.modules()
            if isinstance(m, nn.Conv1d)
        )
        return 2 * (length + 2) * per_token

    def exact_flops(self, length: int) -> int:
        """Forward FLOPs over one sequence of ``length`` tokens, 2 per multiply-add: every Linear (and LSTM gate)
        matmul plus each mixer's own work under its real pattern. Not counted: biases, norms, activations,
        softmax, residual adds."""
        return 2 * length * self.linear_macs() + sum(
            m.exact_flops(length) for m in self.modules() if isinstance(m, Mixer)
        )

    def state_size(self, length: int, bytes_per_value: int = 4) -> int:
        """Bytes of decoding state needed to produce token ``length + 1``."""
        return sum(m.state_bytes(length, bytes_per_value) for m in self.modules() if isinstance(m, Mixer))

    @torch.no_grad()
    def greedy(self, prompts: torch.Tensor, stop: int) -> torch.Tensor:
        """(B, P) prompts -> (B, <= max_len + 1): the greedy continuation with the cache (the prefix is never
        recomputed), until every row has produced the token ``stop`` or the cache is full."""
        B, P = prompts.shape
        cache = self.new_cache(B)
        last = torch.full((B, 1), P - 1, device=prompts.device)  # the prefill's one position read
        logits = self(prompts, cache, at=last)[:, -1]  # (B, V)
        out, done = [prompts], torch.zeros(B, dtype=torch.bool, device=prompts.device)
        while True:
            nxt = logits.argmax(-1)  # (B,)
            out.append(nxt[:, None])
            done |= nxt == stop
            if done.all() or cache.pos >= self.max_len:
                break
            logits = self(nxt[:, None], cache)[:, -1]
        return torch.cat(out, 1)


def sinusoids(max_len: int, width: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...)  (Vaswani et al. 2017, sec. 3.5)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    pe = torch.zeros(max_len, width)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : width // 2]
    return pe


class Block(nn.Module):
    def __init__(self, width: int, mixer: Mixer, dropout: float, proj: bool = True, ffn: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.mixer = mixer
        self.proj = nn.Linear(width, width) if proj else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.ffn: nn.Sequential | None
        if ffn:
            self.ln2 = nn.LayerNorm(width)
            self.ffn = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
            )
        else:
            self.ffn = None

    def forward(self, x: torch.Tensor, cache: Cache | None, layer: int, at: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D); with ``at`` (B, R) positions, (B, R, D): only those rows go on."""
        if at is None:
            x = x + self.drop(self.proj(self.mixer(self.ln1(x), cache, layer)))
        else:
            x = gather_positions(x, at) + self.drop(self.proj(self.mixer.at_positions(self.ln1(x), at, cache, layer)))
        return x if self.ffn is None else x + self.drop(self.ffn(self.ln2(x)))


class BlockStack(LanguageModel):
    """Embedding, ``depth`` pre-LN blocks around a pluggable mixer, final LayerNorm and an untied head."""

    pos: torch.Tensor | None  # position embeddings: a buffer (sinusoidal), a Parameter (learned) or None

    def __init__(
        self,
        arch: str,
        vocab_size: int,
        width: int,
        depth: int,
        max_len: int,
        dropout: float,
        make_mixer,
        positions: str = "sinusoidal",
        proj: bool = True,
        ffn: bool = True,
    ):
        super().__init__()
        self.arch, self.vocab_size, self.width, self.depth, self.max_len = arch, vocab_size, width, depth, max_len
        self.embed = nn.Embedding(vocab_size, width)
        if positions == "sinusoidal":
            self.register_buffer("pos", sinusoids(max_len, width), persistent=False)
        elif positions == "learned":
            self.pos = nn.Parameter(torch.zeros(max_len, width))
        else:  # recurrent mixers know order by construction
            self.pos = None
        self.ln_embed = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, make_mixer(), dropout, proj, ffn) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        self.apply(init_weights)
        if positions == "learned":
            assert self.pos is not None
            nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None, at: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits; with a cache, continue after ``cache.pos`` tokens; with ``at`` (B, R)
        positions of these tokens, (B, R, V), the last block computing only those."""
        T = tokens.shape[1]
        start = self.check_length(cache, T)
        x = self.embed(tokens)  # (B, T, D)
        if self.pos is not None:
            x = x + self.pos[start : start + T]
        x = self.drop(self.ln_embed(x))
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, at if i == self.depth - 1 else None)
        if cache is not None:
            cache.pos += T
        return self.head(self.ln_f(x))


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform for every weight matrix, zero biases, LayerNorm 1/0 (the DP paper's init)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.xavier_uniform_(module.weight)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def gather_positions(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """(B, T, D) at (B, R) positions -> (B, R, D)."""
    return x.gather(1, at[..., None].expand(-1, -1, x.shape[-1]))


def heads_view(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, hd)."""
    B, T, D = x.shape
    return x.view(B, T, heads, D // heads).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hd) -> (B, T, D)."""
    B, H, T, hd = y.shape
    return y.transpose(1, 2).reshape(B, T, H * hd)
