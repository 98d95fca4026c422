"""parity (a worked example, not registered in the product): ``k`` bits; the label is ``odd`` if an odd number of
them are 1, else ``even``.

Sequence: ``b_1 .. b_k label <eos>`` (classify family: the prompt is the bits, the answer the label; chance 1/2).
k is uniform in min_length..N for train and exactly N for test. Neither paper has this task; it stands in for one.
"""

from __future__ import annotations

import random

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, split_tokens
from tasks.kernels import kernel
from tasks.registry import register

BIT0, EVEN = 2, 4  # token ids of "0" and "even" (see Parity.symbols: <pad>, <eos>, then "0", "1", "even", "odd")


@kernel
def parity_kernel(rng, n, min_k, test, values, offsets, prompt_len, answer):
    for s in range(len(prompt_len)):
        k = n if test else rng.integers(min_k, n + 1)
        pos = offsets[s]
        odd = 0
        for i in range(k):
            bit = rng.integers(0, 2)
            values[pos + i] = BIT0 + bit
            odd ^= bit
        values[pos + k], values[pos + k + 1] = EVEN + odd, 1  # label, <eos>
        offsets[s + 1] = pos + k + 2
        prompt_len[s] = k
        answer[s] = EVEN + odd


@register
class Parity(Task):
    """``size`` = N, the longest input (every test input)."""

    name = "parity"
    paper = "separations"  # one of tasks.papers.PAPERS: the report groups its figures by it
    test_sizes = (2, 8, 20)  # the tests generate and check every sample at these sizes
    family = "classify"

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        min_k = params.pop("min_length", 1)
        if params:
            raise TaskError(f"unknown parity parameters: {sorted(params)}")
        if not 1 <= min_k <= size:
            raise TaskError(f"parity size N must be >= min_length = {min_k}, got N = {size}")
        return {"min_length": min_k}

    def symbols(self) -> list[str]:
        return ["0", "1", "even", "odd"]

    def max_length(self) -> int:
        return self.size + 1  # N bits and the label

    def space(self, split: str) -> int:
        # every bit string of each length; its label follows, so half are even and half odd (balanced as it is)
        lengths = [self.size] if split == "test" else range(self.params["min_length"], self.size + 1)
        return sum(2**k for k in lengths)

    def generate(self, rng, split, fill, out: Packed) -> None:
        parity_kernel(
            rng,
            self.size,
            self.params["min_length"],
            split == "test",
            out.values,
            out.offsets,
            out.prompt_len,
            out.answer,
        )

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        # the spec read a second time, in plain Python: its samples must pass the checker and match the kernel's
        k = self.size if split == "test" else rnd.randint(self.params["min_length"], self.size)
        bits = [rnd.choice("01") for _ in range(k)]
        return [*bits, "odd" if bits.count("1") % 2 else "even"], k

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        # from the spec alone: count the ones, without the kernel's running xor
        words = self.decode(split_tokens(tokens))
        k = len(words) - 1
        if not self.params["min_length"] <= k <= self.size or prompt_len != k:
            raise TaskError(
                f"parity input must be {self.params['min_length']}..{self.size} bits, "
                f"got {k} tokens and prompt length {prompt_len}"
            )
        if not all(w in ("0", "1") for w in words[:k]):
            raise TaskError("parity input must be bits")
        label = "odd" if words[:k].count("1") % 2 else "even"
        if words[-1] != label:
            raise TaskError(f"parity label must be {label!r}, got {words[-1]!r}")
        check_answer(self, words, answer)
