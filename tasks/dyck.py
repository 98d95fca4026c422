"""Bounded Dyck-(2, 2) recognition (separations paper): two bracket types, nesting depth at most 2.

Sequence: ``c_1 .. c_N label <eos>`` (classify family), N even, train and test alike (the spec gives both
classes length exactly N). Labels are drawn 50/50.
- Positive: N - 2 steps of a walk: at depth 2 close the top; at depth 0 open one of the two types; else one of
  the two openers or the matching closer, uniformly. Then at depth 0 a random pair, at depth 2 both closers.
- Negative: a positive with c distinct positions (c uniform in 1..N/10) each either switched to the other type or
  turned around (open <-> close), with probability 1/2 each; redone while the result is still in the language.
"""

from __future__ import annotations

import random

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, split_tokens
from tasks.kernels import choose, kernel
from tasks.registry import register

BRACKETS = "()[]"
NO, YES = "<no>", "<yes>"
OPEN0, NO_ID, YES_ID = 2, 6, 7  # token ids: ( ) [ ] as 2..5 (type t opens at 2 + 2t, closes at 3 + 2t)


@kernel
def in_language(word) -> bool:
    """Balanced, matched and never deeper than 2 (token ids)."""
    stack = np.empty(3, np.int64)
    depth = 0
    for c in word:
        kind, closing = (c - OPEN0) // 2, (c - OPEN0) % 2
        if not closing:
            if depth == 2:
                return False
            stack[depth] = kind
            depth += 1
        elif depth == 0 or stack[depth - 1] != kind:
            return False
        else:
            depth -= 1
    return depth == 0


@kernel
def dyck_kernel(rng, n, values, offsets, prompt_len, answer):
    word = np.empty(n, np.int64)
    positions = np.arange(n)
    stack = np.empty(2, np.int64)
    for s in range(len(prompt_len)):
        positive = rng.random() < 0.5
        while True:
            depth = 0
            for i in range(n - 2):
                move = 2 if depth == 2 else rng.integers(0, 2) if depth == 0 else rng.integers(0, 3)
                if move < 2:  # open type `move`
                    word[i] = OPEN0 + 2 * move
                    stack[depth] = move
                    depth += 1
                else:
                    depth -= 1
                    word[i] = OPEN0 + 2 * stack[depth] + 1
            if depth == 0:
                kind = rng.integers(0, 2)
                word[n - 2], word[n - 1] = OPEN0 + 2 * kind, OPEN0 + 2 * kind + 1
            else:
                word[n - 2], word[n - 1] = OPEN0 + 2 * stack[1] + 1, OPEN0 + 2 * stack[0] + 1
            if positive:
                break
            for p in choose(rng, positions, rng.integers(1, n // 10 + 1)):
                # ids 2..5 = ( ) [ ]: xor 2 switches the type, xor 1 turns the bracket around
                word[p] = OPEN0 + ((word[p] - OPEN0) ^ (2 if rng.random() < 0.5 else 1))
            if not in_language(word):
                break
        pos = offsets[s]
        values[pos : pos + n] = word
        label = YES_ID if positive else NO_ID
        values[pos + n], values[pos + n + 1] = label, 1  # label, <eos>
        offsets[s + 1] = pos + n + 2
        prompt_len[s] = n
        answer[s] = label


def is_member(word: list[str]) -> bool:
    """Bounded Dyck-(2, 2) membership by a plain stack (the checker's own code, not the kernel's)."""
    stack: list[str] = []
    for w in word:
        if w in "([":
            stack.append(w)
            if len(stack) > 2:
                return False
        elif not stack or stack.pop() + w not in ("()", "[]"):
            return False
    return not stack


@register
class Dyck(Task):
    """``size`` = N, the (even) length of every word."""

    name = "dyck"
    paper = "separations"
    test_sizes = (10, 12, 20)
    paper_sizes = (20, 50, 100, 200, 400)  # §6 says {20, ..., 400}: index lookup's, as Figure 2 draws them
    family = "classify"

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        if params:
            raise TaskError(f"unknown dyck parameters: {sorted(params)}")
        if size < 10 or size % 2:
            raise TaskError(f"dyck size N must be even and >= 10 (negatives flip 1..N/10 brackets), got {size}")
        return {}

    def symbols(self) -> list[str]:
        return [*BRACKETS, NO, YES]

    def max_length(self) -> int:
        return self.size + 1

    def space(self, split: str) -> int:
        # words of depth <= 2: a top-level block opens one of 2 types around j depth-1 pairs (2^(j+1) ways), so
        # f(m) = sum_j 2^(j+1) f(m-1-j) = 2 * 4^(m-1) words of m pairs: the positives are the smaller class
        return 2 * (2 * 4 ** (self.size // 2 - 1))

    def generate(self, rng, split, fill, out: Packed) -> None:
        dyck_kernel(rng, self.size, out.values, out.offsets, out.prompt_len, out.answer)

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        n, positive = self.size, rnd.random() < 0.5
        closer = {"(": ")", "[": "]"}
        while True:
            word: list[str] = []
            stack: list[str] = []
            for _ in range(n - 2):
                choices = ["close"] if len(stack) == 2 else ["(", "["] if not stack else ["(", "[", "close"]
                move = rnd.choice(choices)
                word.append(closer[stack.pop()] if move == "close" else move)
                if move != "close":
                    stack.append(move)
            if stack:
                word += [closer[s] for s in reversed(stack)]
            else:
                word += rnd.choice([["(", ")"], ["[", "]"]])
            if positive:
                break
            for p in rnd.sample(range(n), rnd.randint(1, n // 10)):
                swap = "([)]" if rnd.random() < 0.5 else "()[]"  # switch the type, or turn it around
                word[p] = swap[swap.index(word[p]) ^ (2 if swap == "([)]" else 1)]
            if not is_member(word):
                break
        return [*word, YES if positive else NO], n

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        words = self.decode(split_tokens(tokens))
        word, label = words[:-1], words[-1]
        if len(word) != self.size or prompt_len != self.size or not all(w in BRACKETS for w in word):
            raise TaskError(f"dyck input must be {self.size} brackets")
        member = is_member(word)
        if label != (YES if member else NO):
            raise TaskError(f"dyck label must be {YES if member else NO}, got {label!r}")
        check_answer(self, words, answer)
