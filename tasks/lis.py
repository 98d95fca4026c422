"""Longest increasing subsequence with the O(n^2) DP as chain of thought (Feng et al. 2023).

Sequence: ``x_1 .. x_n <sep> cot_1 .. cot_n <sep> answer`` with ``cot_l = 1 + max{cot_i : i < l, x_i < x_l}``
(0 when the set is empty, so cot_l >= 1) and ``answer = max(cot)``: length exactly 2n + 3.
Inputs take values n+1..R-1 and DP values 1..n, one shared number vocabulary 0..R-1.

Input generator (spec): 1, 2 or 3 runs; a planted length uniform in 3..n split among them at random cut points;
each run a sorted sample without replacement from [n+1, R-1]; the planted values at sorted random positions; the
other positions uniform.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, expect, split_tokens
from tasks.kernels import choose, kernel
from tasks.registry import register

SEP = "<sep>"
SEP_ID, NUM0 = 2, 3  # token ids: <sep>, then the numbers 0..R-1 (see LIS.symbols)


@kernel
def lis_kernel(rng, n, r, values, offsets, prompt_len, answer):
    low = n + 1  # inputs live in [n+1, R-1]
    value_pool = np.arange(low, r)
    position_pool = np.arange(n)
    x = np.empty(n, np.int64)
    cot = np.empty(n, np.int64)
    planted_values = np.empty(n, np.int64)
    best = np.zeros(r + 1, np.int64)  # Fenwick tree over values: prefix maximum of cot
    for s in range(len(prompt_len)):
        runs = rng.integers(1, 4)
        planted = rng.integers(3, n + 1)
        # runs - 1 distinct cut points in 1..planted-1 (planted >= 3 >= runs, so there are enough)
        cut1 = rng.integers(1, planted) if runs > 1 else planted
        cut2 = planted
        if runs == 3:
            cut2 = rng.integers(1, planted)
            while cut2 == cut1:
                cut2 = rng.integers(1, planted)
            cut1, cut2 = min(cut1, cut2), max(cut1, cut2)
        start = 0
        for end in (cut1, cut2, planted):
            if end > start:
                planted_values[start:end] = np.sort(choose(rng, value_pool, end - start))
                start = end
        x[:] = rng.integers(low, r, size=n)  # the array form: 3x cheaper per value than scalar draws
        x[np.sort(choose(rng, position_pool, planted))] = planted_values[:planted]
        # cot[i] = 1 + max cot over earlier smaller values: a Fenwick prefix-max query, O(n log R) per sample
        best[:] = 0
        for i in range(n):
            v, m = x[i] - 1, 0
            while v > 0:
                m = max(m, best[v])
                v -= v & -v
            cot[i] = m + 1
            v = x[i]
            while v <= r:
                best[v] = max(best[v], cot[i])
                v += v & -v
        pos = offsets[s]
        values[pos : pos + n] = x + NUM0
        values[pos + n] = SEP_ID
        values[pos + n + 1 : pos + 2 * n + 1] = cot + NUM0
        top = cot.max()
        values[pos + 2 * n + 1] = SEP_ID
        values[pos + 2 * n + 2] = top + NUM0
        values[pos + 2 * n + 3] = 1  # <eos>
        offsets[s + 1] = pos + 2 * n + 4
        prompt_len[s] = n + 1
        answer[s] = top + NUM0


def lis_values(x: list[int]) -> list[int]:
    """The chain of thought, cot_l = length of the longest strictly increasing subsequence ending at x_l, by patience
    sorting in O(n log n) (the checker's own derivation: neither the kernel's Fenwick tree nor the spec's O(n^2) DP,
    which ``lis_dp`` writes out for the reference generator and the tests compare with this).

    tails[k] = the smallest last value of an increasing subsequence of length k + 1 seen so far, increasing in k;
    x_l extends exactly the lengths whose tail is < x_l, so cot_l = bisect_left(tails, x_l) + 1.
    """
    tails: list[int] = []
    cot: list[int] = []
    for v in x:
        k = bisect_left(tails, v)
        tails[k : k + 1] = [v]  # replace tails[k], or append when k == len(tails)
        cot.append(k + 1)
    return cot


def lis_dp(x: list[int]) -> list[int]:
    """The spec's chain of thought, literally: cot_j = 1 + max{cot_i : i < j, x_i < x_j} (0 if none), O(n^2), as in
    the paper's script (the reference generator's derivation)."""
    cot: list[int] = []
    for j in range(len(x)):
        cot.append(1 + max([cot[i] for i in range(j) if x[i] < x[j]], default=0))
    return cot


@register
class LIS(Task):
    """``size`` = n, the input length. ``value_range`` R defaults to max(n + 150, 2n + 50) (spec's choice)."""

    name = "lis"
    paper = "dp"
    test_sizes = (3, 5, 12)
    paper_sizes = (40, 110, 175, 250)  # §6.1

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        if size < 3:
            raise TaskError(f"lis size n must be >= 3 (planted length is uniform in 3..n), got {size}")
        value_range = params.pop("value_range", None) or max(size + 150, 2 * size + 50)
        if params:
            raise TaskError(f"unknown lis parameters: {sorted(params)}")
        if value_range < 2 * size + 1:
            raise TaskError(f"lis value_range must be >= 2n + 1 = {2 * size + 1} for n = {size}, got {value_range}")
        return {"value_range": int(value_range)}

    def symbols(self) -> list[str]:
        return [SEP] + [str(v) for v in range(self.params["value_range"])]

    def max_length(self) -> int:
        return 2 * self.size + 3

    def space(self, split: str) -> int:
        return (self.params["value_range"] - self.size - 1) ** self.size  # the input decides the rest

    def generate(self, rng, split, fill, out: Packed) -> None:
        lis_kernel(rng, self.size, self.params["value_range"], out.values, out.offsets, out.prompt_len, out.answer)

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        n, r = self.size, self.params["value_range"]
        runs, planted = rnd.randint(1, 3), rnd.randint(3, n)
        cuts = [0, *sorted(rnd.sample(range(1, planted), runs - 1)), planted]
        values = [v for lo, hi in zip(cuts, cuts[1:]) for v in sorted(rnd.sample(range(n + 1, r), hi - lo))]
        x = [rnd.randrange(n + 1, r) for _ in range(n)]
        for p, v in zip(sorted(rnd.sample(range(n), planted)), values):
            x[p] = v
        best = lis_dp(x)
        return [*map(str, x), SEP, *map(str, best), SEP, str(max(best))], n + 1

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        n = self.size
        words = self.decode(split_tokens(tokens))
        if len(words) != 2 * n + 3 or prompt_len != n + 1 or words[n] != SEP:
            raise TaskError(f"lis sequence must be x(n) <sep> cot(n) <sep> answer with n = {n}")
        if not all(w.isdigit() for w in words[:n]):
            raise TaskError("lis inputs must be numbers")
        x = [int(w) for w in words[:n]]
        if min(x) <= n or max(x) >= self.params["value_range"]:
            raise TaskError("lis inputs must lie in [n+1, R-1]")
        best = lis_values(x)
        expect(words, words[: n + 1] + [str(v) for v in best] + [SEP, str(max(best))], "lis chain of thought")
        check_answer(self, words, answer)
