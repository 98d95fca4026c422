"""String equality ``w1 [sep] w2`` (separations paper), shared by eq_random, eq_one and eq_ncp.

Train lengths k = 2 |w1| = 2 |w2| are uniform over the even values k_min, k_min + 2, ..., N (k_min = N/10 rounded
up to even, at least 2); test inputs have k = N exactly. The modes:
- ``random`` (eq_random, alphabet 2): w2 = w1 with probability 1/2, else uniform; the label is computed.
- ``one`` (eq_one, alphabet 1024): w2 = w1 with probability 1/2, else w1 with one position changed.
- ``ncp`` (eq_ncp, alphabet 1024): always w2 = w1; no label (next-character prediction).
"""

from __future__ import annotations

import math
import random

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, split_tokens
from tasks.kernels import kernel

SEP, NO, YES = "[sep]", "<no>", "<yes>"
SEP_ID, NO_ID, YES_ID = 2, 3, 4  # token ids (see Equality.symbols); the symbols follow, from id sym0
RANDOM, ONE, NCP = 0, 1, 2  # kernel modes


@kernel
def equality_kernel(rng, n, min_k, alphabet, sym0, mode, test, values, offsets, prompt_len, answer):
    for s in range(len(prompt_len)):
        half = n // 2 if test else min_k // 2 + rng.integers(0, (n - min_k) // 2 + 1)
        pos = offsets[s]
        w1, w2 = values[pos : pos + half], values[pos + half + 1 : pos + 2 * half + 1]
        for i in range(half):
            w1[i] = sym0 + rng.integers(0, alphabet)
        values[pos + half] = SEP_ID
        w2[:] = w1
        if mode != NCP and rng.random() >= 0.5:  # a negative candidate
            if mode == RANDOM:
                for i in range(half):
                    w2[i] = sym0 + rng.integers(0, alphabet)
            else:  # one position, changed to one of the other alphabet - 1 symbols
                i = rng.integers(0, half)
                w2[i] = sym0 + (w2[i] - sym0 + rng.integers(1, alphabet)) % alphabet
        end = pos + 2 * half + 1
        if mode == NCP:
            prompt_len[s], answer[s] = 1, values[end - 1]
        else:
            label = YES_ID if (w1 == w2).all() else NO_ID
            values[end] = label
            end += 1
            prompt_len[s], answer[s] = 2 * half + 1, label
        values[end] = 1  # <eos>
        offsets[s + 1] = end + 1


class Equality(Task):
    """``size`` = N, the even length of the test inputs (|w1| + |w2|)."""

    mode: int
    default_alphabet: int

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        alphabet = params.pop("alphabet", cls.default_alphabet)
        tenth = math.ceil(size / 10)
        min_k = params.pop("min_length", None) or max(2, tenth + tenth % 2)  # N/10, rounded up to even
        if params:
            raise TaskError(f"unknown {cls.name} parameters: {sorted(params)}")
        if size < 2 or size % 2:
            raise TaskError(f"{cls.name} size N must be even and >= 2 (|w1| = |w2| = N/2), got {size}")
        if min_k % 2 or not 2 <= min_k <= size:
            raise TaskError(f"{cls.name} min_length must be even and in 2..N = {size}, got {min_k}")
        if not 2 <= alphabet <= 60_000:
            raise TaskError(f"{cls.name} alphabet must be in 2..60000, got {alphabet}")
        return {"alphabet": alphabet, "min_length": min_k}

    def symbols(self) -> list[str]:
        labels = [] if self.mode == NCP else [NO, YES]
        return [SEP, *labels] + [str(v) for v in range(self.params["alphabet"])]

    def max_length(self) -> int:
        return self.size + 1 + (self.mode != NCP)  # w1 [sep] w2, then the label

    def halves(self, split: str) -> range:
        """The possible |w1| of ``split``."""
        return (
            range(self.size // 2, self.size // 2 + 1)
            if split == "test"
            else range(self.params["min_length"] // 2, self.size // 2 + 1)
        )

    def positives(self, half: int) -> int:
        return self.params["alphabet"] ** half

    def space(self, split: str) -> int:
        # the positives (w2 = w1) are the smaller class, so balanced distinct samples number at most twice them
        return sum((1 if self.mode == NCP else 2) * self.positives(h) for h in self.halves(split))

    def generate(self, rng, split, fill, out: Packed) -> None:
        equality_kernel(
            rng,
            self.size,
            self.params["min_length"],
            self.params["alphabet"],
            self.index["0"],
            self.mode,
            split == "test",
            out.values,
            out.offsets,
            out.prompt_len,
            out.answer,
        )

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        n, alphabet = self.size, self.params["alphabet"]
        half = n // 2 if split == "test" else rnd.randrange(self.params["min_length"], n + 1, 2) // 2
        w1 = [rnd.randrange(alphabet) for _ in range(half)]
        w2 = w1[:]
        if self.mode == NCP:
            return [*map(str, w1), SEP, *map(str, w2)], 1
        if rnd.random() >= 0.5:
            if self.mode == RANDOM:
                w2 = [rnd.randrange(alphabet) for _ in range(half)]
            else:
                i = rnd.randrange(half)
                w2[i] = rnd.choice([s for s in range(alphabet) if s != w1[i]])
        words = [*map(str, w1), SEP, *map(str, w2)]
        return words + [YES if w1 == w2 else NO], len(words)

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        words = self.decode(split_tokens(tokens))
        body = words if self.mode == NCP else words[:-1]
        if body.count(SEP) != 1:
            raise TaskError(f"{self.name} input must be w1 {SEP} w2")
        w1, w2 = body[: body.index(SEP)], body[body.index(SEP) + 1 :]
        if len(w1) != len(w2) or len(w1) not in self.halves("train"):
            raise TaskError(f"{self.name} needs |w1| = |w2| in {self.halves('train')}, got {len(w1)} and {len(w2)}")
        if not all(w.isdigit() for w in w1 + w2):
            raise TaskError(f"{self.name} strings must be alphabet symbols")
        if prompt_len != (1 if self.mode == NCP else len(body)):
            raise TaskError(f"{self.name} prompt length must be {1 if self.mode == NCP else len(body)}")
        differences = sum(a != b for a, b in zip(w1, w2))
        if self.mode == NCP and differences:
            raise TaskError(f"{self.name} must repeat w1 exactly, {differences} symbols differ")
        if self.mode == ONE and differences > 1:
            raise TaskError(f"{self.name} negatives differ in exactly one symbol, got {differences}")
        if self.mode != NCP and words[-1] != (NO if differences else YES):
            raise TaskError(f"{self.name} label must be {NO if differences else YES}, got {words[-1]!r}")
        check_answer(self, words, answer)
