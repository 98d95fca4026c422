"""Architectures by name: the one place an architecture is registered (``@register`` in its own module).

Every architecture has the same constructor shape,
``build(vocab_size, width, depth, heads, max_len, dropout, **options)``, where ``max_len`` is the longest sequence
the model will see (positions, caches, and patterns sized from the dataset's L), and returns a ``LanguageModel``.
"""

from __future__ import annotations

from typing import Any, Callable

ARCHITECTURES: dict[str, "Architecture"] = {}


class ArchitectureError(ValueError):
    """Unknown architecture, or options it does not take."""


class Architecture:
    def __init__(self, name: str, build: Callable, options: dict[str, Any], doc: str):
        self.name, self.build, self.options, self.doc = name, build, options, doc

    def check_options(self, options: dict, key: str = "options") -> None:
        unknown = set(options) - set(self.options)
        if unknown:
            raise ArchitectureError(f"{key}: unknown option(s) {sorted(unknown)} for {self.name!r}; "
                                    f"allowed: {sorted(self.options) or 'none'}")


def register(name: str, **options):
    """Decorator for a builder function; ``options`` are its extra keyword arguments with their defaults."""

    def wrap(build: Callable) -> Callable:
        ARCHITECTURES[name] = Architecture(name, build, options, (build.__doc__ or "").strip())
        return build

    return wrap


def build_model(name: str, *, vocab_size: int, width: int, depth: int, heads: int, max_len: int,
                dropout: float = 0.1, **options):
    if name not in ARCHITECTURES:
        raise ArchitectureError(f"unknown architecture {name!r}; registered: {', '.join(sorted(ARCHITECTURES))}")
    if width % heads:
        raise ArchitectureError(f"width {width} is not divisible by heads {heads}")
    arch = ARCHITECTURES[name]
    arch.check_options(options)
    return arch.build(vocab_size=vocab_size, width=width, depth=depth, heads=heads, max_len=max_len,
                      dropout=dropout, **{**arch.options, **options})
