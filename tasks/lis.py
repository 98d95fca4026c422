"""Longest increasing subsequence with the O(n^2) DP as chain of thought (Feng et al. 2023).

Sequence: ``x_1 .. x_n <sep> cot_1 .. cot_n <sep> answer`` with ``cot_l = 1 + max{cot_i : i < l, x_i < x_l}``
(0 when the set is empty, so cot_l >= 1) and ``answer = max(cot)``: length exactly 2n + 3.
Inputs take values n+1..R-1 and DP values 1..n, one shared number vocabulary 0..R-1.
"""

from __future__ import annotations

import numpy as np

from tasks.base import Sample, Task, TaskError, split_tokens
from tasks.registry import register

SEP = "<sep>"


def lis_chain(x: np.ndarray) -> np.ndarray:
    """cot values for a batch of inputs, (B, n) -> (B, n), vectorised over the batch."""
    batch, n = x.shape
    cot = np.zeros((batch, n), dtype=np.int64)
    for l in range(n):
        smaller = x[:, :l] < x[:, l:l + 1]  # (B, l)
        cot[:, l] = 1 + np.where(smaller, cot[:, :l], 0).max(axis=1, initial=0)
    return cot


@register
class LIS(Task):
    """``size`` = n, the input length. ``value_range`` R defaults to max(n + 150, 2n + 50) (spec's choice)."""

    name = "lis"

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

    def sample(self, rng: np.random.Generator, split: str) -> Sample:
        n, r = self.size, self.params["value_range"]
        low = n + 1  # inputs live in [n+1, R-1]
        runs = int(rng.integers(1, 4))
        planted = int(rng.integers(3, n + 1))
        cuts = np.sort(rng.choice(np.arange(1, planted), size=min(runs, planted) - 1, replace=False))
        values = [np.sort(rng.choice(np.arange(low, r), size=len(part), replace=False))
                  for part in np.split(np.arange(planted), cuts)]
        x = rng.integers(low, r, size=n)
        x[np.sort(rng.choice(n, size=planted, replace=False))] = np.concatenate(values)
        cot = lis_chain(x[None, :])[0]
        answer = int(cot.max())
        words = [str(v) for v in x] + [SEP] + [str(v) for v in cot] + [SEP, str(answer)]
        return Sample(self.encode(words), n + 1, self.index[str(answer)])

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        n = self.size
        words = self.decode(split_tokens(tokens))
        if len(words) != 2 * n + 3 or words[n] != SEP or words[2 * n + 1] != SEP or prompt_len != n + 1:
            raise TaskError(f"lis sequence must be x(n) <sep> cot(n) <sep> answer with n = {n}")
        x = [int(w) for w in words[:n]]
        if min(x) <= n or max(x) >= self.params["value_range"]:
            raise TaskError("lis inputs must lie in [n+1, R-1]")
        best = []  # plain O(n^2) DP, independent of lis_chain
        for l in range(n):
            best.append(1 + max([best[i] for i in range(l) if x[i] < x[l]], default=0))
        if [int(w) for w in words[n + 1:2 * n + 1]] != best:
            raise TaskError("lis chain of thought differs from the DP")
        if int(words[-1]) != max(best) or self.tokens[answer] != str(max(best)):
            raise TaskError(f"lis answer must be {max(best)}")
