"""Arithmetic mod 11 with a chain of thought that collapses one operation per step (Feng et al. 2023).

Generation is top-down: start from the answer and, ``size`` times, replace a random number ``v`` by an
expression ``a op b`` whose value is ``v`` (mod 11). The sequence is that history reversed, joined by ``=``:
``full expression = ... = a op b = answer``. The collapse order is random, so only the answer is a function
of the prompt (the first expression through the first ``=``).
"""

from __future__ import annotations

import numpy as np

from tasks.base import Sample, Task, TaskError, split_tokens
from tasks.registry import register

P = 11  # the modulus: numbers are the residues 0..10
OPS = "+-*/"
INV = [0] + [pow(a, -1, P) for a in range(1, P)]  # INV[b] * b = 1 (mod 11)


def apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return (a + b) % P
    if op == "-":
        return (a - b) % P
    if op == "*":
        return (a * b) % P
    if b == 0:
        raise TaskError("division by zero")
    return (a * INV[b]) % P


def split_value(v: int, op: str, rng: np.random.Generator) -> tuple[int, int]:
    """Operands (a, b) with ``a op b = v`` (mod 11); never divides by 0, and ``*`` uses 0 only for v = 0."""
    if op == "+":
        a = int(rng.integers(P))
        return a, (v - a) % P
    if op == "-":
        a = int(rng.integers(P))
        return a, (a - v) % P
    if op == "*":
        if v == 0:
            a = int(rng.integers(P))
            return (a, int(rng.integers(P))) if a == 0 else (a, 0)
        a = int(rng.integers(1, P))
        return a, (v * INV[a]) % P
    b = int(rng.integers(1, P))
    return (v * b) % P, b


def needs_brackets(left: str | None, right: str | None, op: str) -> bool:
    """Whether ``a op b`` replacing a number between tokens ``left`` and ``right`` must keep its brackets."""
    low = op in "+-"
    return left == "/" or (low and (left in ("*", "-") or right in ("*", "/")))


class Parser:
    """Recursive-descent evaluation mod 11 with the usual precedence; the checker's own, independent code.

    ``spans`` collects the (start, end) token span of every operation whose operands are both plain numbers:
    the operations that may collapse next.
    """

    def __init__(self, words: list[str]):
        self.words, self.i = words, 0
        self.spans: set[tuple[int, int]] = set()

    def parse(self) -> tuple[int, int]:
        """(value, number of operators) of the whole expression."""
        value, ops = self.sum()
        if self.i != len(self.words):
            raise TaskError(f"unexpected token {self.words[self.i]!r}")
        return value, ops

    def peek(self) -> str | None:
        return self.words[self.i] if self.i < len(self.words) else None

    def sum(self) -> tuple[int, int]:
        return self.chain(("+", "-"), self.product)

    def product(self) -> tuple[int, int]:
        return self.chain(("*", "/"), self.atom)

    def chain(self, ops_here: tuple[str, str], operand) -> tuple[int, int]:
        """Left-associative run of ``ops_here`` over operands parsed by ``operand``.

        A pair of plain numbers ``x op y`` inside the run may collapse when it is first or follows ``+`` / ``*``
        (a + (x - y) = a + x - y), but not after ``-`` / ``/`` (a - (x + y) != a - x + y).
        """
        starts, plain, ops_seen = [self.i], [], []
        value, ops = operand()
        plain.append(ops == 0)
        while self.peek() in ops_here:
            op = self.words[self.i]
            ops_seen.append(op)
            self.i += 1
            starts.append(self.i)
            rhs, n = operand()
            plain.append(n == 0)
            value, ops = apply(value, op, rhs), ops + n + 1
        starts.append(self.i)
        for k in range(len(ops_seen)):
            if plain[k] and plain[k + 1] and (k == 0 or ops_seen[k - 1] in ("+", "*")):
                self.spans.add((starts[k], starts[k + 2] - (1 if k + 2 < len(starts) - 1 else 0)))
        return value, ops

    def atom(self) -> tuple[int, int]:
        word = self.peek()
        self.i += 1
        if word == "(":
            start = self.i - 1
            value, ops = self.sum()
            if self.peek() != ")":
                raise TaskError("unbalanced brackets")
            self.i += 1
            if (start + 1, self.i - 1) in self.spans:
                self.spans.add((start, self.i))  # "( a op b )" collapses with its brackets
            return value, ops
        if word is None or not word.isdigit():
            raise TaskError(f"expected a number, got {word!r}")
        return int(word), 0


def collapses(before: list[str], spans: set[tuple[int, int]], after: list[str]) -> bool:
    """Whether ``after`` is ``before`` with one collapsible span (see Parser.spans) replaced by its value."""
    for i in range(len(after)):
        tail = len(after) - i - 1
        end = len(before) - tail
        if (i, end) in spans and before[:i] == after[:i] and before[end:] == after[i + 1:]:
            inner = [w for w in before[i:end] if w not in "()"]
            if str(apply(int(inner[0]), inner[1], int(inner[2]))) == after[i]:
                return True
    return False


@register
class Arithmetic(Task):
    """``size`` = number of operators N. Train mixes 1..N operators with shares i / (1 + ... + N)."""

    name = "arithmetic"

    @classmethod
    def validate(cls, size: int, **params) -> dict:
        if size < 1:
            raise TaskError(f"arithmetic size (number of operators) must be >= 1, got {size}")
        mixture = params.pop("mixture", "under")
        if mixture not in ("under", "exact"):
            raise TaskError(f"arithmetic mixture must be 'under' or 'exact', got {mixture!r}")
        if params:
            raise TaskError(f"unknown arithmetic parameters: {sorted(params)}")
        return {"mixture": mixture}

    def symbols(self) -> list[str]:
        return [str(v) for v in range(P)] + list("()+-*/=")

    def operators_for(self, rng: np.random.Generator, split: str) -> int:
        n = self.size
        if split == "test" or self.params["mixture"] == "exact":
            return n
        # "under" mixture: i operators with probability i / (1 + ... + N)
        return int(rng.choice(np.arange(1, n + 1), p=np.arange(1, n + 1) / (n * (n + 1) / 2)))

    def sample(self, rng: np.random.Generator, split: str) -> Sample:
        answer = int(rng.integers(P))
        expr = [str(answer)]
        history = [expr]
        for _ in range(self.operators_for(rng, split)):
            numbers = [i for i, w in enumerate(expr) if w.isdigit()]
            i = numbers[int(rng.integers(len(numbers)))]
            op = OPS[int(rng.integers(4))]
            a, b = split_value(int(expr[i]), op, rng)
            left = expr[i - 1] if i > 0 else None
            right = expr[i + 1] if i + 1 < len(expr) else None
            inner = [str(a), op, str(b)]
            if needs_brackets(left, right, op):
                inner = ["(", *inner, ")"]
            expr = expr[:i] + inner + expr[i + 1:]
            history.append(expr)
        words: list[str] = []
        for step in reversed(history):
            words += step + ["="]
        words.pop()  # no '=' after the answer
        prompt_len = len(history[-1]) + 1
        return Sample(self.encode(words), prompt_len, self.index[str(answer)])

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        words = self.decode(split_tokens(tokens))
        steps, current = [], []
        for w in words:
            if w == "=":
                steps.append(current)
                current = []
            else:
                current.append(w)
        steps.append(current)
        if prompt_len != len(steps[0]) + 1:
            raise TaskError("prompt must be the first expression through the first '='")
        parsers = [Parser(s) for s in steps]
        values = [p.parse() for p in parsers]
        truth = values[0][0]
        if values[-1][1] != 0 or len(steps) < 2:
            raise TaskError("the chain must end with a single number")
        for k, (value, ops) in enumerate(values):
            if value != truth:
                raise TaskError(f"step {k} evaluates to {value}, the expression to {truth}")
            if ops != values[0][1] - k:
                raise TaskError(f"step {k} must collapse exactly one operation")
        for k in range(len(steps) - 1):
            if not collapses(steps[k], parsers[k].spans, steps[k + 1]):
                raise TaskError(f"step {k + 1} is not step {k} with one innermost operation replaced by its value")
        if self.tokens[answer] != str(truth) or words[-1] != str(truth):
            raise TaskError(f"answer must be {truth}")
