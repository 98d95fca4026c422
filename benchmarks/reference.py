"""Plain per-sample reference generators, written from the task specifications (each task module's docstring in
``tasks/``) like the papers' original scripts: Python lists and ``random.Random``, one sample at a time. They are
the baseline of benchmarks.bench_generators and, in the tests, an independent second reading of the spec: their
samples must pass the checkers and follow the same length distributions as the compiled generators.

Each returns ``(words, prompt_len)``: the sequence without ``<eos>``, as token strings. The chain-of-thought values
come from the checkers' plain derivations (tasks.ed.ED.chain, tasks.dyck.is_member), except lis, whose checker
derives them in O(n log n): here they come from the spec's O(n^2) DP, as in the paper's script (``lis_dp``).
"""

from __future__ import annotations

import random
import string

import tasks
from tasks.dyck import is_member


def arithmetic(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    n = task.size
    ops = n if split == "test" else rnd.choices(range(1, n + 1), weights=range(1, n + 1))[0]
    value = rnd.randrange(11)
    history = [[str(value)]]
    for _ in range(ops):
        expr = history[-1]
        i = rnd.choice([k for k, w in enumerate(expr) if w.isdigit()])
        x = int(expr[i])
        while True:  # a uniform operand a and operator among the pairs with a op b = x, b computed
            a, op = rnd.randrange(11), rnd.choice("+-*/")
            if op in "+-":
                b = (x - a) % 11 if op == "+" else (a - x) % 11
            elif op == "*" and a:
                b = x * pow(a, -1, 11) % 11
            elif op == "*" and x == 0:
                b = rnd.randrange(11)
            elif op == "/" and a and x:
                b = a * pow(x, -1, 11) % 11
            elif op == "/" and not a and not x:
                b = rnd.randrange(11)
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
        history.append(expr[:i] + inner + expr[i + 1:])
    words = " = ".join(" ".join(step) for step in reversed(history)).split()
    return words, len(history[-1]) + 1


def lis_dp(x: list[int]) -> list[int]:
    """The spec's chain of thought, literally: cot_j = 1 + max{cot_i : i < j, x_i < x_j} (0 if none), O(n^2)."""
    cot: list[int] = []
    for j in range(len(x)):
        cot.append(1 + max([cot[i] for i in range(j) if x[i] < x[j]], default=0))
    return cot


def lis(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    n, r = task.size, task.params["value_range"]
    runs, planted = rnd.randint(1, 3), rnd.randint(3, n)
    cuts = [0, *sorted(rnd.sample(range(1, planted), runs - 1)), planted]
    values = [v for lo, hi in zip(cuts, cuts[1:]) for v in sorted(rnd.sample(range(n + 1, r), hi - lo))]
    x = [rnd.randrange(n + 1, r) for _ in range(n)]
    for p, v in zip(sorted(rnd.sample(range(n), planted)), values):
        x[p] = v
    best = lis_dp(x)
    return [*map(str, x), "<sep>", *map(str, best), "<sep>", str(max(best))], n + 1


def ed(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    n = task.size
    diff = rnd.randint(1, n)
    while True:
        letters = rnd.sample(string.ascii_lowercase, rnd.randint(3, 10))
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
    prompt = [*first, "|", *second, "<sep>"]
    return prompt + task.chain(first, second), len(prompt)


def index_lookup(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    k = task.size if split == "test" else rnd.randint(task.params["min_length"], task.size)
    symbols = [str(rnd.randrange(task.params["symbols"])) for _ in range(k)]
    p = rnd.randint(1, k)
    return [*symbols, f"@{p}", symbols[p - 1]], k + 1


def dyck(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    n, positive = task.size, rnd.random() < 0.5
    while True:
        word, stack = [], []
        for _ in range(n - 2):
            choices = ["close"] if len(stack) == 2 else ["(", "["] if not stack else ["(", "[", "close"]
            move = rnd.choice(choices)
            word.append({"(": ")", "[": "]"}[stack.pop()] if move == "close" else move)
            if move != "close":
                stack.append(move)
        if stack:
            word += [{"(": ")", "[": "]"}[s] for s in reversed(stack)]
        else:
            word += rnd.choice([["(", ")"], ["[", "]"]])
        if positive:
            break
        for p in rnd.sample(range(n), rnd.randint(1, n // 10)):
            swap = "([)]" if rnd.random() < 0.5 else "()[]"  # switch the type, or turn it around
            word[p] = swap[swap.index(word[p]) ^ (2 if swap == "([)]" else 1)]
        if not is_member(word):
            break
    return [*word, "<yes>" if positive else "<no>"], n


def equality(task: tasks.Task, rnd: random.Random, split: str) -> tuple[list[str], int]:
    half = task.size // 2 if split == "test" else rnd.randrange(task.params["min_length"], task.size + 1, 2) // 2
    alphabet = task.params["alphabet"]
    w1 = [rnd.randrange(alphabet) for _ in range(half)]
    w2 = w1[:]
    if task.name == "eq_ncp":
        return [*map(str, w1), "[sep]", *map(str, w2)], 1
    if rnd.random() >= 0.5:
        if task.name == "eq_random":
            w2 = [rnd.randrange(alphabet) for _ in range(half)]
        else:
            i = rnd.randrange(half)
            w2[i] = rnd.choice([s for s in range(alphabet) if s != w1[i]])
    words = [*map(str, w1), "[sep]", *map(str, w2)]
    return words + ["<yes>" if w1 == w2 else "<no>"], len(words)


GENERATORS = {"arithmetic": arithmetic, "lis": lis, "ed": ed, "ed_local": ed, "index_lookup": index_lookup,
              "dyck": dyck, "eq_random": equality, "eq_one": equality, "eq_ncp": equality}


def reference_sample(task: tasks.Task, rnd: random.Random, split: str) -> tasks.Sample:
    """One sample of ``task`` from its reference generator, encoded with the task's vocabulary."""
    words, prompt_len = GENERATORS[task.name](task, rnd, split)
    tokens = task.encode(words)
    return tasks.Sample(tokens, prompt_len, int(tokens[-2]))


