"""Final-answer accuracy as the papers score it: greedy decoding with the model's cache (``LanguageModel.greedy``),
the answer the token before the first <eos>. The ``ncp`` family's every-prefix score needs the Lightning module's
targets: ``SequenceModel.final_accuracies`` chooses between the two. ``greedy_accuracies`` scores one model or K fused
ones (``Fused.greedy``) in one pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import models
from pipeline.data.datasets import Dataset
from tasks import EOS_ID


@torch.no_grad()
def greedy_accuracy(
    model: models.LanguageModel, data: Dataset, batch_size: int, device: torch.device | str = "cpu"
) -> float:
    """Final-answer accuracy: decode greedily from each prompt with the cache until <eos> or max_len, and
    compare the token before the first <eos> with the answer. Prompts of equal length decode together."""
    model.eval()
    return float(greedy_accuracies(model.greedy, data, batch_size, device)[0])


def greedy_accuracies(
    decode: Callable[[torch.Tensor, int], torch.Tensor], data: Dataset, batch_size: int, device: torch.device | str
) -> torch.Tensor:
    """(M,) final-answer accuracies of ``decode``, which maps (B, P) prompts and the stop token to (B, L) greedy
    sequences (one model: M = 1) or (M, B, L) (M models at once: ``Fused.greedy``)."""
    correct = torch.zeros((), dtype=torch.long, device=device)
    prompt_lens = data.prompt_len
    for p in np.unique(prompt_lens):
        rows = np.flatnonzero(prompt_lens == p)
        for b in range(0, len(rows), batch_size):
            idx = rows[b : b + batch_size]
            prompts = torch.from_numpy(np.stack([data.sequence(i)[:p] for i in idx]).astype(np.int64)).to(device)
            out = decode(prompts, EOS_ID)  # (B, L) or (M, B, L)
            out = out.reshape(-1, len(idx), out.shape[-1])  # (M, B, L)
            answers = final_answers(out.flatten(0, 1), p).view(out.shape[:2])  # (M, B)
            correct = correct + (answers == torch.from_numpy(data.answer[idx]).to(device)).sum(-1)
    return correct.reshape(-1).double() / len(data)  # one read back, after every batch


def final_answers(out: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Token just before the first <eos> after the prompt; -1 where no <eos> was produced."""
    gen = out[:, prompt_len:]
    is_eos = gen == EOS_ID
    has = is_eos.any(1)
    first = is_eos.float().argmax(1)  # first <eos> position (0 if none)
    prev = out.gather(1, (prompt_len + first - 1)[:, None])[:, 0]
    return torch.where(has, prev, torch.full_like(prev, -1))
