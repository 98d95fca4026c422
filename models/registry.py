"""Architectures by name: the one place an architecture is registered (``@register`` in its own module).

Every architecture has the same constructor shape,
``build(vocab_size, width, depth, heads, max_len, dropout, **options)``, where ``max_len`` is the longest sequence
the model will see (positions, caches, and patterns sized from the dataset's L), and returns a ``LanguageModel``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

ARCHITECTURES: dict[str, Architecture] = {}


class ArchitectureError(ValueError):
    """Unknown architecture, an option it does not take, or a value outside the option's declared type and range."""


class Option(NamedTuple):
    """One extra keyword argument of a builder: its default, its type and its least value; ``null`` says what
    None means where None is allowed (the builder then derives the value, e.g. from the sequence length)."""

    default: Any
    type: type[int] | type[float]
    minimum: int | float
    null: str | None = None

    def allowed(self) -> str:
        return f"{self.type.__name__} >= {self.minimum}" + (f", or null ({self.null})" if self.null else "")

    def admits(self, value: Any) -> bool:
        if value is None:
            return self.null is not None
        # bool is an int to Python, but `block: true` is a typo, not a block of 1
        return isinstance(value, self.type) and not isinstance(value, bool) and value >= self.minimum


class Architecture:
    def __init__(self, name: str, build: Callable, options: dict[str, Option], doc: str):
        self.name, self.build, self.options, self.doc = name, build, options, doc

    def defaults(self) -> dict[str, Any]:
        return {name: option.default for name, option in self.options.items()}

    def check_options(self, options: dict, key: str = "options") -> None:
        unknown = set(options) - set(self.options)
        if unknown:
            raise ArchitectureError(
                f"{key}: unknown option(s) {sorted(unknown)} for {self.name!r}; "
                f"allowed: {sorted(self.options) or 'none'}"
            )
        for name, value in options.items():
            if not self.options[name].admits(value):
                raise ArchitectureError(
                    f"{key}.{name}: {value!r} is not allowed for {self.name!r}; allowed: {self.options[name].allowed()}"
                )


def register(name: str, **options: Option):
    """Decorator for a builder function; ``options`` declare its extra keyword arguments (default, type, least
    value): the one place they are declared, checked by ``check_options`` in the config and in ``build_model``."""

    def wrap(build: Callable) -> Callable:
        ARCHITECTURES[name] = Architecture(name, build, options, (build.__doc__ or "").strip())
        return build

    return wrap


def build_model(
    name: str, *, vocab_size: int, width: int, depth: int, heads: int, max_len: int, dropout: float = 0.1, **options
):
    if name not in ARCHITECTURES:
        raise ArchitectureError(f"unknown architecture {name!r}; registered: {', '.join(sorted(ARCHITECTURES))}")
    if width % heads:
        raise ArchitectureError(f"width {width} is not divisible by heads {heads}")
    arch = ARCHITECTURES[name]
    arch.check_options(options)
    return arch.build(
        vocab_size=vocab_size,
        width=width,
        depth=depth,
        heads=heads,
        max_len=max_len,
        dropout=dropout,
        **{**arch.defaults(), **options},
    )


@functools.cache
def bf16_on_cpu(name: str) -> str:
    """'' where this machine's CPU trains architecture ``name`` under bf16 autocast (a small model's forward and
    backward), else why not, naming the CPU's instruction set. It is the machine's answer, not the architecture's:
    oneDNN's bf16 LSTM, for one, needs AVX-512 and fails on AVX2-only CPUs ("could not create a primitive descriptor
    for the LSTM forward propagation primitive")."""
    import torch

    model = build_model(name, vocab_size=8, width=8, depth=1, heads=2, max_len=8, dropout=0.0)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(torch.zeros(2, 8, dtype=torch.long))  # (B, T, V)
        logits.float().sum().backward()
    except RuntimeError as err:
        first = str(err).strip().split(". ")[0] if str(err).strip() else type(err).__name__
        return (
            f"{name} cannot train in bf16 on this CPU (torch's CPU capability: "
            f"{torch.backends.cpu.get_cpu_capability()}): {first}"
        )
    return ""
