"""What every task is: a vocabulary, a compiled batch generator, and an independent per-sample checker.

A sample is stored as one token sequence ending in ``<eos>``, with the prompt length and the answer token beside it:
- ``cot`` (DP paper): ``prompt + chain of thought + answer + <eos>``. Training predicts every token after the prompt;
  evaluation decodes greedily from the prompt and scores only the token just before ``<eos>``.
- ``classify`` (separations paper): ``input + label + <eos>``; the prompt is the input, the answer the label.
- ``ncp`` (next-character prediction): ``w1 [sep] w2 + <eos>`` with ``prompt_len = 1``; the trainer derives the
  per-prefix targets from the sequence itself.

Generators run as numba kernels over a whole batch (``Task.generate``); checkers are plain Python, written from the
spec without the generator's code, so a bug in one is caught by the other. Beside each kernel, its plain reference
(``Task.reference``): the spec read a second time, one sample at a time, as the papers' own scripts generate.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

PAD, EOS = "<pad>", "<eos>"
PAD_ID, EOS_ID = 0, 1
# A dataset's files. A split's position here is part of its RNG seed (pipeline.generate.rng_for): append, never
# reorder, or every file changes.
SPLITS = ("test", "train", "val")
# The distribution each split is drawn from, which is all a task's generator and space see. Validation is drawn as
# test is (e.g. length exactly N), so the verdicts are reached at the distribution the papers score.
DRAWN_AS = {"test": "test", "train": "train", "val": "test"}
DISTRIBUTIONS = ("test", "train")


class TaskError(ValueError):
    """Impossible task parameters, or a sample that fails its checker."""


@dataclass(frozen=True)
class Sample:
    """One sample: ``tokens`` ends with ``<eos>``; ``length`` counts tokens without it."""

    tokens: np.ndarray  # (length + 1,) int
    prompt_len: int
    answer: int  # token id of the final answer

    @property
    def length(self) -> int:
        return len(self.tokens) - 1


@dataclass
class Packed:
    """Samples packed without padding: sample i is ``values[offsets[i]:offsets[i + 1]]`` (``<eos>`` included)."""

    values: np.ndarray  # (total tokens,) uint16
    offsets: np.ndarray  # (N + 1,) int64
    prompt_len: np.ndarray  # (N,) int32
    answer: np.ndarray  # (N,) int32
    features: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N,) int64, reduced to a max in stats

    @classmethod
    def empty(cls, count: int, max_tokens: int, features: tuple[str, ...] = ()) -> Packed:
        """Buffers for a kernel to fill: room for ``count`` sequences of up to ``max_tokens`` tokens each."""
        return cls(
            np.empty(count * max_tokens, np.uint16),
            np.zeros(count + 1, np.int64),
            np.empty(count, np.int32),
            np.empty(count, np.int32),
            {name: np.empty(count, np.int64) for name in features},
        )

    def __len__(self) -> int:
        return len(self.prompt_len)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets) - 1  # without <eos>

    def sequence(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def sample(self, i: int) -> Sample:
        return Sample(self.sequence(i).astype(np.int32), int(self.prompt_len[i]), int(self.answer[i]))

    def trimmed(self) -> Packed:
        """The filled part of the buffers only (a copy, so the oversized buffer can be freed)."""
        return Packed(self.values[: self.offsets[-1]].copy(), self.offsets, self.prompt_len, self.answer, self.features)

    def select(self, keep: np.ndarray) -> Packed:
        """The samples where the (N,) bool mask ``keep`` is set, in order."""
        if keep.all():
            return self
        sizes = np.diff(self.offsets)
        return Packed(
            self.values[np.repeat(keep, sizes)],
            np.concatenate([[0], np.cumsum(sizes[keep])]),
            self.prompt_len[keep],
            self.answer[keep],
            {k: v[keep] for k, v in self.features.items()},
        )


class Task(ABC):
    """A task at one size. Subclasses set ``name``, ``paper`` and ``test_sizes`` (and ``family``, ``paper_lengths``,
    ``paper_sizes`` where they differ from the defaults) and implement the abstract methods; ``@register`` checks the
    class attributes, so what the report and the tests need to know of a task lives in its own module.
    """

    name: str
    paper: str  # which paper's task it is: one of ``tasks.papers.PAPERS`` (the report groups its figures by it)
    test_sizes: tuple[int, ...]  # a few small sizes the tests generate and check every sample of (quick to run)
    paper_lengths: Mapping[int, int] = {}  # size -> the sequence length L the paper states for it (the report
    # gives the paper-convention cost at that L too); empty where the paper states none
    paper_sizes: tuple[int, ...] = ()  # the sizes the paper's experiments ran (what a claim's coverage counts); empty
    # for a task of neither paper's figures
    family: str = "cot"  # cot | classify | ncp (see the module docstring)
    version: str = "2"  # bump when the generator's output for a given seed changes
    features: tuple[str, ...] = ()  # per-sample statistics the kernel reports (their maximum goes in the stats)

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
    def max_length(self) -> int:
        """Longest possible sequence (without ``<eos>``): exact, or for arithmetic a bound (it sizes buffers)."""

    @abstractmethod
    def space(self, split: str) -> int:
        """How many distinct sequences the distribution ``split`` ('test' or 'train') can hold (an upper bound), so
        impossible counts fail up front.

        For the balanced-label tasks it is twice the smaller class: beyond that, distinct samples would break the
        50/50 balance. Every task's test space lies inside its train space.
        """

    @abstractmethod
    def generate(self, rng: np.random.Generator, split: str, fill: bool, out: Packed) -> None:
        """Fill ``out`` (from ``Packed.empty``) with ``len(out)`` samples of the distribution ``split`` ('test' or
        'train'), one compiled kernel call."""

    @abstractmethod
    def reference(self, rnd: random.Random, split: str) -> tuple[list[str], int]:
        """One sample of the distribution ``split`` ('test' or 'train') from a plain generator written from the spec
        like the papers' own scripts (Python lists and ``random.Random``, one sample at a time): the sequence without
        ``<eos>`` as token strings, and its prompt length. The baseline benchmarks.bench_generators measures
        ``generate`` against and, in the tests, an independent second reading of the spec: its samples must pass the
        checker and follow ``generate``'s distribution."""

    @abstractmethod
    def check(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        """Re-derive the answer and every chain-of-thought value from the prompt alone; raise TaskError if wrong."""

    def check_space(self, test_samples: int, train_samples: int, val_samples: int) -> None:
        """Fail before anything is written when that many distinct samples cannot exist: test and validation share
        the test distribution's space, and train (whose space holds it) must avoid every one of them."""
        for split, count, what in (
            ("test", test_samples + val_samples, "test + val"),
            ("train", test_samples + val_samples + train_samples, "test + val + train"),
        ):
            if count > self.space(split):
                lower = "test_samples or generate.val_samples" if split == "test" else "train_samples"
                raise TaskError(
                    f"{self.name} size {self.size}: {count} distinct {what} samples asked, but the space "
                    f"of distinct samples is too small (at most {self.space(split)} {split} sequences "
                    f"exist): lower generate.{lower}, or set generate.unique: false"
                )

    def sample_batch(self, rng: np.random.Generator, split: str, count: int, fill: bool = False) -> Packed:
        """``count`` samples of ``split`` (one of SPLITS), drawn from its distribution (``DRAWN_AS``). ``fill``
        marks draws that replace duplicates beyond the planned count (only arithmetic's train mixture treats them
        differently, as the spec says)."""
        if split not in SPLITS:
            raise TaskError(f"split must be one of {SPLITS}, got {split!r}")
        out = Packed.empty(count, self.max_length() + 1, self.features)
        self.generate(rng, DRAWN_AS[split], fill, out)
        if out.offsets[-1] > len(out.values):  # compiled kernels do not check bounds: max_length() was wrong
            raise AssertionError(
                f"{self.name} {self.size}: a sequence is longer than max_length() = {self.max_length()}"
            )
        return out.trimmed()

    def sample(self, rng: np.random.Generator, split: str) -> Sample:
        """One sample (a batch of one)."""
        return self.sample_batch(rng, split, 1).sample(0)

    def reference_sample(self, rnd: random.Random, split: str) -> Sample:
        """One sample of ``reference``, encoded with the task's vocabulary."""
        words, prompt_len = self.reference(rnd, split)
        tokens = self.encode(words)
        return Sample(tokens, prompt_len, int(tokens[-2]))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, words: list[str]) -> np.ndarray:
        return np.array([self.index[w] for w in words] + [EOS_ID], dtype=np.int32)

    def decode(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]

    def metadata(self) -> dict:
        return {
            "task": self.name,
            "family": self.family,
            "size": self.size,
            "generator_version": self.version,
            "params": self.params,
            "vocab": self.tokens,
        }


def split_tokens(tokens: np.ndarray) -> np.ndarray:
    """The sequence without its trailing <eos>, checked to have exactly one, at the end."""
    tokens = np.asarray(tokens)
    if tokens.size == 0 or tokens[-1] != EOS_ID or (tokens[:-1] == EOS_ID).any():
        raise TaskError("sequence must end with exactly one <eos>")
    return tokens[:-1]


def expect(words: list[str], expected: list[str], what: str) -> None:
    """Raise naming the first token of ``words`` that differs from the re-derived ``expected`` sequence."""
    for i, (got, want) in enumerate(zip(words, expected)):
        if got != want:
            raise TaskError(f"{what}: token {i} is {got!r}, expected {want!r}")
    if len(words) != len(expected):
        raise TaskError(f"{what}: {len(words)} tokens, expected {len(expected)}")


def check_answer(task: Task, words: list[str], answer: int) -> None:
    """The stored answer id must be the token just before ``<eos>``."""
    if not words or answer != task.index.get(words[-1]):
        raise TaskError(f"answer id {answer} is not the last token {words[-1] if words else None!r}")
