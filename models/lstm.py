"""lstm: torch's nn.LSTM between a token embedding and a linear head (the separations paper's recurrent baseline)."""

import torch
import torch.nn as nn

from models.backbone import Cache, LanguageModel, gather_positions, init_weights
from models.registry import register


class LSTMModel(LanguageModel):
    unbatched = "nn.LSTM has no vmap batching rule (aten::lstm)"

    def __init__(self, vocab_size: int, width: int, depth: int, max_len: int, dropout: float):
        super().__init__()
        self.arch, self.vocab_size, self.width, self.depth, self.max_len = "lstm", vocab_size, width, depth, max_len
        self.embed = nn.Embedding(vocab_size, width)
        self.lstm = nn.LSTM(width, width, num_layers=depth, batch_first=True, dropout=dropout if depth > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, vocab_size)
        self.apply(init_weights)

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None, at: torch.Tensor | None = None) -> torch.Tensor:
        T = tokens.shape[1]
        self.check_length(cache, T)
        state = cache.layers[0].get("hc") if cache is not None else None  # ((depth, B, D), (depth, B, D))
        y, hc = self.lstm(self.drop(self.embed(tokens)), state)  # (B, T, D)
        if cache is not None:
            cache.layers[0]["hc"] = hc
            cache.pos += T
        if at is not None:  # the recurrence reads every position; only the head is spared
            y = gather_positions(y, at)  # (B, R, D)
        return self.head(self.drop(y))

    def state_size(self, length: int, bytes_per_value: int = 4) -> int:
        return 2 * self.depth * self.width * bytes_per_value  # h and c of every layer


@register("lstm")
def build(*, vocab_size, width, depth, heads, max_len, dropout):
    """nn.LSTM of hidden size = width and ``depth`` layers (heads unused)."""
    return LSTMModel(vocab_size, width, depth, max_len, dropout)
