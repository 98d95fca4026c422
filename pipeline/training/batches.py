"""Batches for training and validation: samples of similar length together, split among data-parallel workers and
into micro-batches.

A batch is ``Batch(inputs, targets, share, lengths, at)``: inputs = seq[:-1], targets = seq[1:] with the prompt and
padding ignored (``IGNORE``), padded to the batch's longest sequence, not the dataset's (but for a graphed step's
one shape, ``pad_to``). ``share`` weighs one piece's
mean loss so that DDP's average over workers, and Lightning's over accumulated micro-batches, is the global batch's
mean loss (``Collate``). ``lengths`` (host memory) are the sequences' real lengths, for the FLOP count: read on the
host, they cost the GPU no synchronisation. ``at`` (B, R): the positions of the predicted tokens where every row
predicts the same few (R at most half the positions: a classification's answer and <eos>), so that the forward need
compute only those logits (``models.backbone``); else None.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from pipeline.data.datasets import Dataset
from tasks import PAD_ID

IGNORE = -100  # the target of positions that are not predicted (cross-entropy's ignore_index)


class Batch(NamedTuple):
    inputs: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T)
    share: torch.Tensor  # ()
    lengths: np.ndarray  # (B,) real tokens of each input
    at: torch.Tensor | None = None  # (B, R) where the predicted tokens are, when every row has R <= T / 2 of them


class Piece(list):
    """The rows one loader step reads (a micro-batch), and the rows of the whole batch it is part of."""

    def __init__(self, rows: np.ndarray, batch: np.ndarray):
        super().__init__(rows.tolist())
        self.batch = batch


class Rows(torch.utils.data.Dataset):
    """The dataset a loader sees: its indices are the samples, and a batch of them is handed to ``Collate`` whole
    (``__getitems__``), so that a ``Piece`` arrives with its batch."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitems__(self, piece: list) -> list:
        return piece


class LengthBuckets(Sampler):
    """Batches of similar length (pad to the batch's longest, not the dataset's): shuffle, sort within chunks of
    50 batches, then shuffle the batch order; each batch in ``parts`` micro-batches (``Piece``) one after another."""

    def __init__(
        self, lengths: np.ndarray, batch_size: int, seed: int, shuffle: bool = True, min_batch: int = 1, parts: int = 1
    ):
        self.lengths, self.batch_size, self.seed, self.shuffle, self.epoch = lengths, batch_size, seed, shuffle, 0
        self.parts = parts
        # data-parallel workers x micro-batches: a last batch with fewer samples is dropped
        self.min_batch = min_batch * parts
        self.skip = 0  # pieces of the next epoch already trained on (a resumed trial)

    def resume(self, epoch: int, batches_done: int) -> None:
        """The next ``iter`` continues epoch ``epoch`` after its first ``batches_done`` pieces."""
        if batches_done >= len(self):  # that epoch was complete: the next one starts
            epoch, batches_done = epoch + 1, 0
        self.epoch, self.skip = epoch, batches_done

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        skip, self.skip = self.skip, 0
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        chunk = self.batch_size * 50
        batches = []
        for c in range(0, len(order), chunk):
            part = order[c : c + chunk]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            batches += [
                part[b : b + self.batch_size]
                for b in range(0, len(part), self.batch_size)
                if len(part) - b >= self.min_batch
            ]
        turns = rng.permutation(len(batches)) if self.shuffle else np.arange(len(batches))  # the batches' order
        pieces = (Piece(rows, batches[b]) for b in turns for rows in np.array_split(batches[b], self.parts))
        yield from itertools.islice(pieces, skip, None)

    def __len__(self) -> int:
        chunk = self.batch_size * 50
        sizes = [min(chunk, len(self.lengths) - c) for c in range(0, len(self.lengths), chunk)]
        return self.parts * sum(n // self.batch_size + (n % self.batch_size >= self.min_batch) for n in sizes)


class Collate:
    """A piece of a global batch -> ``Batch``: inputs = seq[:-1], targets = seq[1:], prompt targets and padding
    ignored. The batch is in ``parts`` micro-batches (``Piece``) and each is shared by ``world`` data-parallel workers:
    worker ``rank`` takes every world-th sample of a piece, and share = world x parts x its predicted tokens / the
    global batch's. Its mean loss times share, averaged over the workers by DDP and over the parts by Lightning's
    gradient accumulation, is the global batch's mean loss, as one worker computes it in one pass (share = 1)."""

    def __init__(self, data: Dataset, rank: int = 0, world: int = 1, parts: int = 1, pad_to: int | None = None):
        self.data, self.rank, self.world, self.parts, self.pad_to = data, rank, world, parts, pad_to
        self.lengths = data.lengths  # (N,) input tokens per sample: the sequence without <eos>
        self.predicted = self.lengths + 1 - data.prompt_len  # (N,) target tokens per sample, <eos> included

    def __call__(self, piece: list[int]) -> Batch:
        mine = np.asarray(piece[self.rank :: self.world])
        share = 1.0
        if self.world * self.parts > 1:
            assert isinstance(piece, Piece)  # the training loader's
            share = self.world * self.parts * self.predicted[mine].sum() / self.predicted[piece.batch].sum()
        inputs, targets = collate(self.data, mine, self.pad_to)
        at = predicted_positions(targets)
        return Batch(
            torch.from_numpy(inputs),
            torch.from_numpy(targets),
            torch.tensor(float(share)),
            self.lengths[mine],
            None if at is None else torch.from_numpy(at),
        )


def predicted_positions(targets: np.ndarray) -> np.ndarray | None:
    """(B, T) targets -> (B, R) the positions of each row's predicted tokens, where every row has the same number R
    of them and R is at most half of T (else None: the whole forward is needed anyway)."""
    predicted = targets != IGNORE  # (B, T)
    counts = predicted.sum(1)
    R = int(counts[0]) if len(counts) else 0
    if R == 0 or (counts != R).any() or 2 * R > targets.shape[1]:
        return None
    return np.nonzero(predicted)[1].reshape(len(targets), R)  # row-major: each row's positions in order


def collate(data: Dataset, rows: np.ndarray, pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of the samples ``rows``, each (B, T), T = the longest input (at least ``pad_to``): one
    gather from the flat token array, no loop over samples (``collate_reference`` is the loop it is tested
    against)."""
    starts = data.offsets[rows]  # (B,) where each sequence starts in data.values
    n = data.offsets[rows + 1] - starts - 1  # (B,) input tokens: the sequence, <eos> included, less its last
    pos = np.arange(max(int(n.max()), pad_to or 0))  # (T,)
    inside = pos < n[:, None]  # (B, T) a token of the sequence, else padding
    # (B, T) input t is values[start + t], its target the next; padding reads a token in range, masked below
    at = np.minimum(starts[:, None] + pos, len(data.values) - 2)
    # the gathered tokens as int64 (uint16 on disk, where -100 would wrap); never the whole array
    inputs = np.where(inside, data.values[at].astype(np.int64), PAD_ID)
    predicted = inside & (pos >= data.prompt_len[rows][:, None] - 1)  # (B, T) every token after the prompt
    targets = np.where(predicted, data.values[at + 1].astype(np.int64), IGNORE)
    return inputs, targets


def collate_reference(data: Dataset, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``collate``, a sample at a time."""
    seqs = [data.sequence(i) for i in rows]
    T = max(len(s) for s in seqs) - 1
    inputs = np.full((len(seqs), T), PAD_ID, dtype=np.int64)
    targets = np.full((len(seqs), T), IGNORE, dtype=np.int64)
    for r, (i, s) in enumerate(zip(rows, seqs)):
        n = len(s) - 1
        inputs[r, :n] = s[:-1]
        p = int(data.prompt_len[i])
        targets[r, p - 1 : n] = s[p:]  # predict every token after the prompt
    return inputs, targets


def loader(
    data: Dataset,
    batch_size: int,
    seed: int,
    *,
    shuffle: bool,
    rank: int = 0,
    world: int = 1,
    parts: int = 1,
    processes: int = 0,
    pad_to: int | None = None,
) -> DataLoader:
    """Batches of ``batch_size`` samples in all, each in ``parts`` micro-batches; worker ``rank`` of ``world`` gets its
    share of each, padded to its longest sequence, or to ``pad_to`` tokens (a graphed step's one shape). Pinned host
    memory where a GPU will read the batches (the copy then overlaps the step).
    ``processes`` > 0 builds them in that many loader processes, ahead of the steps: the sampler stays in this
    process (so a resumed trial's position is still its own), and each process reads the memory-mapped files."""
    sampler = LengthBuckets(data.lengths, batch_size, seed, shuffle, min_batch=world, parts=parts)
    return DataLoader(
        Rows(len(data)),
        batch_sampler=sampler,
        collate_fn=Collate(data, rank, world, parts, pad_to),
        num_workers=processes,
        persistent_workers=processes > 0,  # not restarted every epoch (and every validation)
        pin_memory=torch.cuda.is_available(),
    )
