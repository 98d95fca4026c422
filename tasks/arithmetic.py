"""Arithmetic mod 11 with a chain of thought that collapses one operation per step (Feng et al. 2023).

Generation is top-down: start from the answer and, ``size`` times, replace a random number ``v`` by an
expression ``a op b`` whose value is ``v`` (mod 11). The sequence is that history reversed, joined by ``=``:
``full expression = ... = a op b = answer``. The collapse order is random, so only the answer is a function
of the prompt (the first expression through the first ``=``).
"""

from __future__ import annotations

import math
import random

import numpy as np

from tasks.base import Packed, Task, TaskError, check_answer, split_tokens
from tasks.kernels import kernel
from tasks.registry import register

P = 11  # the modulus: numbers are the residues 0..10
OPS = "+-*/"
INV = [0] + [pow(a, -1, P) for a in range(1, P)]  # INV[b] * b = 1 (mod 11)
INV_TABLE = np.array(INV)
SYMBOLS = [str(v) for v in range(P)] + list("()" + OPS + "=")
# token ids (after <pad>, <eos>), compile-time constants of the kernel
NUM0, LPAREN, RPAREN, PLUS, MINUS, TIMES, DIV, EQUALS = (2 + SYMBOLS.index(w) for w in ("0", *"()+-*/="))


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


@kernel
def needs_brackets(left: int, right: int, op: int) -> bool:
    """Whether ``a op b`` replacing a number between token ids ``left`` and ``right`` (-1: none) keeps its brackets:
    always after ``/``; for + and -, also after ``*`` or ``-`` and before ``*`` or ``/``."""
    low = op == PLUS or op == MINUS
    return left == DIV or (low and (left == TIMES or left == MINUS or right == TIMES or right == DIV))


@kernel
def replacement(rng, v: int) -> tuple[int, int, int]:
    """(a, op, b) with ``a op b = v`` (mod 11): a uniform operand and operator among the valid pairs (redrawn
    together otherwise, as in Feng et al.'s generator): ``*`` takes a = 0 only for v = 0, ``/`` never divides by 0."""
    while True:
        a, op = rng.integers(0, P), PLUS + rng.integers(0, 4)
        if op == PLUS:
            return a, op, (v - a) % P
        if op == MINUS:
            return a, op, (a - v) % P
        if op == TIMES:
            if a == 0:
                if v == 0:
                    return a, op, rng.integers(0, P)
            else:
                return a, op, (v * INV_TABLE[a]) % P
        elif v == 0 and a == 0:  # 0 / b with b != 0
            b = rng.integers(0, P)
            if b != 0:
                return a, op, b
        elif v != 0 and a != 0:
            return a, op, (a * INV_TABLE[v]) % P


@kernel
def arithmetic_kernel(rng, size, mixture, values, offsets, prompt_len, answer):
    """``mixture``: 1 draws the operator count i with probability i / (1 + ... + N), 0 uses N."""
    width = 4 * size + 1  # longest expression: the first operator adds 2 tokens, each later one at most 4
    history = np.empty((size + 1, width), np.int64)  # history[k]: the expression after k replacements
    lengths = np.empty(size + 1, np.int64)
    for s in range(len(prompt_len)):
        ops = size
        if mixture:
            u = rng.integers(0, size * (size + 1) // 2)
            ops = 1
            while ops * (ops + 1) // 2 <= u:
                ops += 1
        v = rng.integers(0, P)
        history[0, 0], lengths[0] = NUM0 + v, 1
        for k in range(1, ops + 1):
            prev, n, new = history[k - 1], lengths[k - 1], history[k]
            pick = rng.integers(0, k)  # the expression holds k numbers: pick one uniformly
            i = -1
            while pick >= 0:
                i += 1
                pick -= prev[i] < NUM0 + P
            a, op, b = replacement(rng, prev[i] - NUM0)
            brackets = needs_brackets(prev[i - 1] if i > 0 else -1, prev[i + 1] if i + 1 < n else -1, op)
            new[:i] = prev[:i]
            j = i
            if brackets:
                new[j] = LPAREN
                j += 1
            new[j], new[j + 1], new[j + 2] = NUM0 + a, op, NUM0 + b
            j += 3
            if brackets:
                new[j] = RPAREN
                j += 1
            new[j : j + n - i - 1] = prev[i + 1 : n]
            lengths[k] = j + n - i - 1
        pos = offsets[s]
        for k in range(ops, -1, -1):  # the history reversed, joined by '='
            values[pos : pos + lengths[k]] = history[k, : lengths[k]]
            pos += lengths[k]
            values[pos] = EQUALS if k else 1  # '=' between steps, <eos> at the end
            pos += 1
        offsets[s + 1] = pos
        prompt_len[s] = lengths[ops] + 1
        answer[s] = NUM0 + v


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
        if (i, end) in spans and before[:i] == after[:i] and before[end:] == after[i + 1 :]:
            inner = [w for w in before[i:end] if w not in "()"]
            if str(apply(int(inner[0]), inner[1], int(inner[2]))) == after[i]:
                return True
    return False


@register
class Arithmetic(Task):
    """``size`` = number of operators N. Train mixes 1..N operators with shares i / (1 + ... + N)."""

    name = "arithmetic"
    paper = "dp"
    test_sizes = (1, 3, 6)
    paper_sizes = (6, 10, 13, 16)  # §6.1: operators
    # L as the DP paper's Table 2 states it, by number of operators (as quoted in issue 11; docs/datasets.md's
    # table quotes 85 for 6 operators)
    paper_lengths = {6: 87, 10: 221, 13: 355, 16: 505}

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
        return SYMBOLS

    def max_length(self) -> int:
        # expressions after k >= 1 replacements hold at most 4k - 1 tokens; N + 1 of them joined by N '='
        return 2 * self.size * (self.size + 1) + 1

    def space(self, split: str) -> int:
        # a sequence is its replacement history: at step k, one of k numbers, then an operator and operands
        # (at most 11 + 11 + 21 + 10 = 53 choices, for the value 0); 11 answers to start from
        def histories(ops: int) -> int:
            return P * 53**ops * math.factorial(ops)

        if split == "test" or self.params["mixture"] == "exact":
            return histories(self.size)
        return sum(histories(i) for i in range(1, self.size + 1))

    def generate(self, rng, split, fill, out: Packed) -> None:
        # "under" (the paper's train mixture): i operators with share i / (1 + ... + N); the draws that replace
        # duplicates beyond the planned count ("fill") have N operators, as in Feng et al.'s generator
        mixture = split == "train" and not fill and self.params["mixture"] == "under"
        arithmetic_kernel(rng, self.size, mixture, out.values, out.offsets, out.prompt_len, out.answer)

    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        n = self.size
        ops = n if split == "test" else rnd.choices(range(1, n + 1), weights=range(1, n + 1))[0]
        history = [[str(rnd.randrange(P))]]
        for _ in range(ops):
            expr = history[-1]
            i = rnd.choice([k for k, w in enumerate(expr) if w.isdigit()])
            x = int(expr[i])
            while True:  # a uniform operand a and operator among the pairs with a op b = x, b computed
                a, op = rnd.randrange(P), rnd.choice(OPS)
                if op in "+-":
                    b = (x - a) % P if op == "+" else (a - x) % P
                elif op == "*" and a:
                    b = x * pow(a, -1, P) % P
                elif op == "*" and x == 0:
                    b = rnd.randrange(P)
                elif op == "/" and a and x:
                    b = a * pow(x, -1, P) % P
                elif op == "/" and not a and not x:
                    b = rnd.randrange(P)
                    if b == 0:
                        continue
                else:
                    continue
                break
            left = expr[i - 1] if i > 0 else None
            right = expr[i + 1] if i + 1 < len(expr) else None
            inner = [str(a), op, str(b)]
            if left == "/" or (op in "+-" and (left in ("*", "-") or right in ("*", "/"))):
                inner = ["(", *inner, ")"]
            history.append(expr[:i] + inner + expr[i + 1 :])
        words = " = ".join(" ".join(step) for step in reversed(history)).split()
        return words, len(history[-1]) + 1

    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        words = self.decode(split_tokens(tokens))
        steps: list[list[str]] = []
        current: list[str] = []
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
        if values[-1][1] != 0 or not 1 <= values[0][1] <= self.size:
            raise TaskError(f"the chain must go from 1..{self.size} operators down to a single number")
        for k, (value, ops) in enumerate(values):
            if value != truth:
                raise TaskError(f"step {k} evaluates to {value}, the expression to {truth}")
            if ops != values[0][1] - k:
                raise TaskError(f"step {k} must collapse exactly one operation")
        for k in range(len(steps) - 1):
            if not collapses(steps[k], parsers[k].spans, steps[k + 1]):
                raise TaskError(f"step {k + 1} is not step {k} with one innermost operation replaced by its value")
        if words[-1] != str(truth):
            raise TaskError(f"answer must be {truth}")
        check_answer(self, words, answer)
