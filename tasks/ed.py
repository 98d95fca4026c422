"""Edit distance with the whole DP table as chain of thought (Feng et al. 2023).

Sequence: ``A | B <sep>``, then for each row i = 1..|A| the values dp[i][1..|B|] and ``,``, then ``<sep>`` and
dp[|A|][|B|]; length |A| + |B| + 4 + |A| (|B| + 1). Costs: insert 2, delete 2, replace 3 (match 0). The table is
initialised dp[i][j] = i + j, so the first row and column grow by 1 per step (the original generator's quirk, kept;
``textbook_init`` switches to 2 per step).

Strings (spec): 3..10 distinct letters; A = n of them; with probability 0.4 B is a random string of length
n-3..n+2, else A after ``diff`` (uniform 1..n, drawn once per sample) random edits, each a delete (an insert when
|B| <= 2), a substitution or an insert with probability 1/3; redo while A == B or |B| leaves n-3..n+2; the
shorter string first.

The ``ed_local`` variant (tasks.ed_local) re-emits the letters inside the chain. Both report the locality
window m per sample: the largest distance from a generated value (a DP cell, a copied letter, the answer) back to
the nearest earlier token holding a value it depends on (the letters it compares, its three DP neighbours, the
letter it copies).
"""

from __future__ import annotations

import random
import string

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, expect, split_tokens
from tasks.kernels import choose, kernel
from tasks.registry import register

LETTERS = string.ascii_lowercase
BAR, SEP, COMMA = "|", "<sep>", ","
BAR_ID, SEP_ID, COMMA_ID, LETTER0 = 2, 3, 4, 5  # token ids, see ED.symbols
NUM0 = LETTER0 + len(LETTERS)
INSERT, DELETE, REPLACE = 2, 2, 3


@kernel
def locality(a: int, b: int, local: bool) -> tuple[int, int]:
    """(window over every generated value, window over the DP cells only) for strings of lengths a <= b."""
    p0 = a + b + 2  # position of the first chain token
    row = 2 * b + 2 if local else b + 1  # tokens per row, ',' included
    cells = 0
    for i in range(1, a + 1):
        for j in range(1, b + 1):
            here = p0 + (i - 1) * row + (2 * j if local else j - 1)
            # its letters: the row's copy of A[i-1] and the B copy just before it, or the input's A[i-1]
            earliest = p0 + (i - 1) * row if local else i - 1
            if i > 1:
                up = here - row  # dp[i-1][j]
                if j > 1:
                    up -= 2 if local else 1  # dp[i-1][j-1]
                earliest = min(earliest, up)
            cells = max(cells, here - earliest)
    window = max(cells, 3)  # the answer is 3 tokens after the last cell
    if local:
        for i in range(1, a + 1):
            start = p0 + (i - 1) * row
            window = max(window, start - (i - 1))  # the row's letter copies A[i-1], in the input
            # each B copy copies the one a row up (row 1: the input's B[j-1] at a + j)
            window = max(window, row if i > 1 else start + 2 * b - 1 - (a + b))
    return window, cells


@kernel
def ed_kernel(rng, n, local, textbook, values, offsets, prompt_len, answer, window, cell_window):
    alphabet = np.arange(len(LETTERS))
    a_str = np.empty(n, np.int64)
    b_str = np.empty(2 * n + 1, np.int64)  # n letters plus up to n inserts
    dp = np.empty((n + 1, n + 3), np.int64)
    border = 2 if textbook else 1
    for s in range(len(prompt_len)):
        diff = rng.integers(1, n + 1)
        while True:
            using = rng.integers(3, 11)
            letters = choose(rng, alphabet, using)
            for i in range(n):
                a_str[i] = letters[rng.integers(0, using)]
            if rng.random() < 0.4:
                m = rng.integers(n - 3, n + 3)
                for i in range(m):
                    b_str[i] = letters[rng.integers(0, using)]
            else:
                m = n
                b_str[:n] = a_str
                for _ in range(diff):
                    edit = rng.integers(0, 3)
                    if edit == 0 and m > 2:
                        p = rng.integers(0, m)
                        b_str[p : m - 1] = b_str[p + 1 : m].copy()
                        m -= 1
                    elif edit == 1:
                        b_str[rng.integers(0, m)] = letters[rng.integers(0, using)]
                    else:
                        p = rng.integers(0, m + 1)
                        b_str[p + 1 : m + 1] = b_str[p:m].copy()
                        b_str[p] = letters[rng.integers(0, using)]
                        m += 1
            if n - 3 <= m <= n + 2 and not (m == n and (a_str == b_str[:n]).all()):
                break
        first, second = (b_str[:m], a_str) if m < n else (a_str, b_str[:m])
        la, lb = len(first), len(second)
        for i in range(la + 1):
            dp[i, 0] = border * i
        for j in range(lb + 1):
            dp[0, j] = border * j
        for i in range(1, la + 1):
            for j in range(1, lb + 1):
                match = 0 if first[i - 1] == second[j - 1] else REPLACE
                dp[i, j] = min(dp[i - 1, j] + DELETE, dp[i, j - 1] + INSERT, dp[i - 1, j - 1] + match)
        pos = offsets[s]
        values[pos : pos + la] = first + LETTER0
        values[pos + la] = BAR_ID
        values[pos + la + 1 : pos + la + 1 + lb] = second + LETTER0
        pos += la + lb + 1
        values[pos] = SEP_ID
        prompt_len[s] = pos + 1 - offsets[s]
        pos += 1
        for i in range(1, la + 1):
            if local:
                values[pos] = first[i - 1] + LETTER0
                pos += 1
            for j in range(1, lb + 1):
                if local:
                    values[pos] = second[j - 1] + LETTER0
                    pos += 1
                values[pos] = dp[i, j] + NUM0
                pos += 1
            values[pos] = COMMA_ID
            pos += 1
        values[pos], values[pos + 1], values[pos + 2] = SEP_ID, dp[la, lb] + NUM0, 1  # ..., <eos>
        offsets[s + 1] = pos + 3
        answer[s] = dp[la, lb] + NUM0
        window[s], cell_window[s] = locality(la, lb, local)


@register
class ED(Task):
    """``size`` = n, the length of A; B has n-3..n+2 letters, so n >= 4."""

    name = "ed"
    paper = "dp"
    test_sizes = (4, 5, 8)
    paper_sizes = (6, 12, 16, 20)  # §6.1: averaged string lengths
    local = False  # ed_local re-emits the letters each cell compares
    features = ("locality_window", "cell_locality_window")

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        if size < 4:
            raise TaskError(f"{cls.name} size n must be >= 4 (B has n-3..n+2 letters), got {size}")
        textbook = params.pop("textbook_init", False)
        if not isinstance(textbook, bool):
            raise TaskError(f"{cls.name} textbook_init must be true or false, got {textbook!r}")
        if params:
            raise TaskError(f"unknown {cls.name} parameters: {sorted(params)}")
        return {"textbook_init": textbook}

    def max_value(self) -> int:
        """Largest possible DP value: dp[i][j] <= dp[0][j-i] + 3i for i <= j <= n + 2, i <= n (the shorter first)."""
        border = 2 if self.params["textbook_init"] else 1
        return border * 2 + 3 * self.size

    def symbols(self) -> list[str]:
        return [BAR, SEP, COMMA, *LETTERS] + [str(v) for v in range(self.max_value() + 1)]

    def max_length(self) -> int:
        a, b = self.size, self.size + 2
        return a + b + 4 + a * ((2 if self.local else 1) * b + 1 + self.local)

    def space(self, split: str) -> int:
        return sum(len(LETTERS) ** (self.size + m) for m in range(self.size - 3, self.size + 3))

    def generate(self, rng, split, fill, out: Packed) -> None:
        ed_kernel(
            rng,
            self.size,
            self.local,
            self.params["textbook_init"],
            out.values,
            out.offsets,
            out.prompt_len,
            out.answer,
            out.features["locality_window"],
            out.features["cell_locality_window"],
        )

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        n = self.size
        diff = rnd.randint(1, n)
        while True:
            letters = rnd.sample(LETTERS, rnd.randint(3, 10))
            a = [rnd.choice(letters) for _ in range(n)]
            if rnd.random() < 0.4:
                b = [rnd.choice(letters) for _ in range(rnd.randint(n - 3, n + 2))]
            else:
                b = a[:]
                for _ in range(diff):
                    edit = rnd.randrange(3)
                    if edit == 0 and len(b) > 2:
                        del b[rnd.randrange(len(b))]
                    elif edit == 1:
                        b[rnd.randrange(len(b))] = rnd.choice(letters)
                    else:
                        b.insert(rnd.randrange(len(b) + 1), rnd.choice(letters))
            if a != b and n - 3 <= len(b) <= n + 2:
                break
        first, second = (b, a) if len(b) < len(a) else (a, b)
        prompt = [*first, BAR, *second, SEP]
        return prompt + self.chain(first, second), len(prompt)

    def chain(self, first: list[str], second: list[str]) -> list[str]:
        """The chain of thought after the prompt, by the plain O(|A| |B|) DP."""
        border = 2 if self.params["textbook_init"] else 1
        prev = [border * j for j in range(len(second) + 1)]
        out = []
        for i, letter in enumerate(first, 1):
            row = [border * i]
            for j, other in enumerate(second, 1):
                row.append(min(prev[j] + DELETE, row[j - 1] + INSERT, prev[j - 1] + (letter != other) * REPLACE))
            if self.local:
                out += [letter] + [w for pair in zip(second, map(str, row[1:])) for w in pair] + [COMMA]
            else:
                out += [str(v) for v in row[1:]] + [COMMA]
            prev = row
        return out + [SEP, str(prev[-1])]

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        n = self.size
        words = self.decode(split_tokens(tokens))
        if BAR not in words or SEP not in words or words.index(BAR) > words.index(SEP):
            raise TaskError(f"{self.name} prompt must be A | B <sep>")
        bar, sep = words.index(BAR), words.index(SEP)
        first, second = words[:bar], words[bar + 1 : sep]
        if not all(w in LETTERS and len(w) == 1 for w in first + second):
            raise TaskError(f"{self.name} strings must be letters")
        if (
            not (
                len(first) <= len(second)
                and n in (len(first), len(second))
                and n - 3 <= len(first)
                and len(second) <= n + 2
            )
            or first == second
        ):
            raise TaskError(
                f"{self.name} strings must differ, have lengths n = {n} and n-3..n+2, shorter first; "
                f"got {len(first)} and {len(second)}"
            )
        if prompt_len != sep + 1:
            raise TaskError(f"{self.name} prompt must end at the first <sep>")
        expect(words, words[: sep + 1] + self.chain(first, second), f"{self.name} chain of thought")
        check_answer(self, words, answer)
