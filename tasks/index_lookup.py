"""Index lookup (separations paper): ``k`` symbols, then a position token ``p``; the label is the p-th symbol.

Sequence: ``s_1 .. s_k @p label <eos>`` (classify family: the prompt is ``s_1 .. s_k @p``, the answer the label,
one of the |Sigma| = 64 symbol tokens, chance 1/64). k is uniform in 10..N for train and exactly N for test; p is
uniform in 1..k and has its own vocabulary of N position tokens.

The paper (App. H.1): "we first sample a length k uniformly between 10 and N ... and then sample N symbols ... Lastly,
we sample a position between 1 and k". Read as written (``full_length``), every string holds N symbols and k only
bounds the position asked; by default a string holds k symbols, the reading that gives k a use of its own.
"""

from __future__ import annotations

import random

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, split_tokens
from tasks.kernels import kernel
from tasks.registry import register

SYM0 = 2  # token ids: the symbols, then the position tokens (see IndexLookup.symbols)


@kernel
def index_lookup_kernel(rng, n, min_k, symbols, full, test, values, offsets, prompt_len, answer):
    pos0 = SYM0 + symbols  # id of position token @1
    for s in range(len(prompt_len)):
        k = n if test else rng.integers(min_k, n + 1)
        length = n if full else k  # symbols in the string; p is drawn from 1..k either way
        pos = offsets[s]
        for i in range(length):
            values[pos + i] = SYM0 + rng.integers(0, symbols)
        p = rng.integers(1, k + 1)
        label = values[pos + p - 1]
        values[pos + length], values[pos + length + 1], values[pos + length + 2] = pos0 + p - 1, label, 1  # @p ..
        offsets[s + 1] = pos + length + 3
        prompt_len[s] = length + 1
        answer[s] = label


@register
class IndexLookup(Task):
    """``size`` = N, the longest input (every test input)."""

    name = "index_lookup"
    paper = "separations"
    test_sizes = (10, 12, 20)
    paper_sizes = (20, 50, 100, 200, 400)  # §6
    family = "classify"

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        symbols = params.pop("symbols", 64)
        min_k = params.pop("min_length", 10)
        full = params.pop("full_length", False)
        if params:
            raise TaskError(f"unknown index_lookup parameters: {sorted(params)}")
        if not 2 <= symbols <= 60_000:
            raise TaskError(f"index_lookup symbols must be in 2..60000, got {symbols}")
        if not 1 <= min_k <= size:
            raise TaskError(f"index_lookup size N must be >= min_length = {min_k}, got N = {size}")
        if not isinstance(full, bool):
            raise TaskError(f"index_lookup full_length must be true or false, got {full!r}")
        # named only when set: the default's datasets stay byte for byte as generated before (their metadata and
        # seeds hold the parameters)
        return {"symbols": symbols, "min_length": min_k} | ({"full_length": True} if full else {})

    @property
    def full_length(self) -> bool:
        """Every string N symbols long, the position still asked in 1..k (the paper's words read as written)."""
        return self.params.get("full_length", False)

    def symbols(self) -> list[str]:
        return [str(v) for v in range(self.params["symbols"])] + [f"@{p}" for p in range(1, self.size + 1)]

    def max_length(self) -> int:
        return self.size + 2

    def space(self, split: str) -> int:
        if split == "test" or self.full_length:  # N symbols, p in 1..N (full: p <= k <= N)
            return self.params["symbols"] ** self.size * self.size
        lengths = range(self.params["min_length"], self.size + 1)
        return sum(self.params["symbols"] ** k * k for k in lengths)

    def generate(self, rng, split, fill, out: Packed) -> None:
        index_lookup_kernel(
            rng,
            self.size,
            self.params["min_length"],
            self.params["symbols"],
            self.full_length,
            split == "test",
            out.values,
            out.offsets,
            out.prompt_len,
            out.answer,
        )

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        k = self.size if split == "test" else rnd.randint(self.params["min_length"], self.size)
        length = self.size if self.full_length else k
        symbols = [str(rnd.randrange(self.params["symbols"])) for _ in range(length)]
        p = rnd.randint(1, k)
        return [*symbols, f"@{p}", symbols[p - 1]], length + 1

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        words = self.decode(split_tokens(tokens))
        k = len(words) - 2
        shortest = self.size if self.full_length else self.params["min_length"]
        if not shortest <= k <= self.size or prompt_len != k + 1:
            raise TaskError(
                f"index_lookup input must be {shortest}..{self.size} symbols and a "
                f"position, got {k} tokens and prompt length {prompt_len}"
            )
        if not all(w.isdigit() for w in words[:k] + words[-1:]):
            raise TaskError("index_lookup input and label must be symbols")
        if not words[k].startswith("@") or not 1 <= int(words[k][1:]) <= k:
            raise TaskError(f"index_lookup token {k} must be a position in 1..{k}, got {words[k]!r}")
        label = words[int(words[k][1:]) - 1]
        if words[-1] != label:
            raise TaskError(f"index_lookup label must be {label!r} (symbol at {words[k]}), got {words[-1]!r}")
        check_answer(self, words, answer)
