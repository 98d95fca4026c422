"""Scoring a trained model as the papers do: final-answer accuracy from greedy decoding with the model's cache
(``cot``, ``classify``), or every prefix right at once (``ncp``). Validation and the test set are scored alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

import models
from pipeline.data.datasets import Dataset
from pipeline.training.batches import IGNORE, loader
from tasks import EOS_ID

if TYPE_CHECKING:  # train.py imports this module: the type alone, never at run time
    from pipeline.training.train import SequenceModel


@torch.no_grad()
def greedy_accuracy(
    model: models.LanguageModel, data: Dataset, batch_size: int, device: torch.device | str = "cpu"
) -> float:
    """Final-answer accuracy: decode greedily from each prompt with the cache until <eos> or max_len, and
    compare the token before the first <eos> with the answer. Prompts of equal length decode together."""
    model.eval()
    correct = 0
    prompt_lens = data.prompt_len
    for p in np.unique(prompt_lens):
        rows = np.flatnonzero(prompt_lens == p)
        for b in range(0, len(rows), batch_size):
            idx = rows[b : b + batch_size]
            prompts = torch.from_numpy(np.stack([data.sequence(i)[:p] for i in idx]).astype(np.int64)).to(device)
            out = decode(model, prompts)  # (B, <= max_len + 1)
            correct += int((final_answers(out, p) == torch.from_numpy(data.answer[idx]).to(device)).sum())
    return correct / len(data)


def decode(model: models.LanguageModel, prompts: torch.Tensor) -> torch.Tensor:
    """Greedy continuation with the model's cache; stops when every row has produced <eos>."""
    B, P = prompts.shape
    cache = model.new_cache(B)
    logits = model(prompts, cache)[:, -1]  # (B, V)
    out, done = [prompts], torch.zeros(B, dtype=torch.bool, device=prompts.device)
    while True:
        nxt = logits.argmax(-1)  # (B,)
        out.append(nxt[:, None])
        done |= nxt == EOS_ID
        if done.all() or cache.pos >= model.max_len:
            break
        logits = model(nxt[:, None], cache)[:, -1]
    return torch.cat(out, 1)


def final_answers(out: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Token just before the first <eos> after the prompt; -1 where no <eos> was produced."""
    gen = out[:, prompt_len:]
    is_eos = gen == EOS_ID
    has = is_eos.any(1)
    first = is_eos.float().argmax(1)  # first <eos> position (0 if none)
    prev = out.gather(1, (prompt_len + first - 1)[:, None])[:, 0]
    return torch.where(has, prev, torch.full_like(prev, -1))


def final_accuracy(module: SequenceModel, data: Dataset, batch_size: int, device) -> float:
    """The family's final score: greedy final answers (cot, classify) or every prefix right (ncp)."""
    if module.spec.family == "ncp":
        return all_prefixes_accuracy(module, data, batch_size, device)
    return greedy_accuracy(module.model, data, batch_size, device)


@torch.no_grad()
def all_prefixes_accuracy(module: SequenceModel, data: Dataset, batch_size: int, device) -> float:
    """ncp: fraction of sequences whose prediction is right at every prefix (teacher-forced, one pass)."""
    module.eval()
    correct = 0
    for batch in loader(data, batch_size, 0, False):
        inputs, targets = batch.inputs.to(device), batch.targets.to(device)
        ok = module.correct(module.model(inputs), inputs, targets) | (targets == IGNORE)  # (B, T)
        correct += int(ok.all(1).sum())
    return correct / len(data)
