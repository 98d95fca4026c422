"""What every task is: a vocabulary, a generator of token sequences, and an independent checker.

A chain-of-thought (``cot``) sample is stored as one token sequence ``prompt + chain of thought + answer + <eos>``
with the prompt length and the answer token beside it. Training predicts every token after the prompt;
evaluation decodes greedily from the prompt and scores only the token just before ``<eos>``
(the DP paper's final-answer accuracy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

PAD, EOS = "<pad>", "<eos>"
PAD_ID, EOS_ID = 0, 1


class TaskError(ValueError):
    """Impossible task parameters, or a sample that fails its checker."""


@dataclass(frozen=True)
class Sample:
    """One chain-of-thought sample: ``tokens`` ends with ``<eos>``; ``length`` counts tokens without it."""

    tokens: np.ndarray  # (length + 1,) int
    prompt_len: int
    answer: int  # token id of the final answer

    @property
    def length(self) -> int:
        return len(self.tokens) - 1


class Task(ABC):
    """A task at one size. Subclasses set ``name`` and implement the four abstract methods."""

    name: str
    family: str = "cot"
    version: str = "1"  # bump when the generator's output for a given seed changes

    def __init__(self, size: int, **params):
        self.size = size
        self.params = self.validate(size, **params)
        self.tokens = [PAD, EOS, *self.symbols()]
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    @abstractmethod
    def validate(cls, size: int, **params) -> dict:
        """Check the size and generator parameters; return the full parameter dict (defaults filled in)."""

    @abstractmethod
    def symbols(self) -> list[str]:
        """The task's own tokens (``<pad>`` and ``<eos>`` come first and are added by the base class)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, split: str) -> Sample:
        """Draw one sample. ``split`` is 'train' or 'test' (some tasks mix sizes in train only)."""

    @abstractmethod
    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        """Re-derive the answer and every chain-of-thought value from the prompt alone; raise TaskError if wrong."""

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def max_length(self) -> int | None:
        """Longest possible sequence (without <eos>) when it is known in closed form, else None."""
        return None

    def encode(self, words: list[str]) -> np.ndarray:
        return np.array([self.index[w] for w in words] + [EOS_ID], dtype=np.int32)

    def decode(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]

    def metadata(self) -> dict:
        return {"task": self.name, "family": self.family, "size": self.size,
                "generator_version": self.version, "params": self.params, "vocab": self.tokens}


def split_tokens(tokens: np.ndarray) -> np.ndarray:
    """The sequence without its trailing <eos>, checked to have exactly one, at the end."""
    tokens = np.asarray(tokens)
    if tokens.size == 0 or tokens[-1] != EOS_ID or (tokens[:-1] == EOS_ID).any():
        raise TaskError("sequence must end with exactly one <eos>")
    return tokens[:-1]
