"""sinks: StreamingLLM's attention sinks: the first s tokens plus a sliding window of the last w tokens."""

import torch

from models.attention import attention_model
from models.registry import Option, register
from models.sliding_window import Window


class Sinks(Window):
    def __init__(self, window: int, sinks: int):
        super().__init__(window)
        self.sinks = sinks

    def allowed(self, i, j):
        return (j <= i) & ((i - j < self.window) | (j < self.sinks))

    def global_keys(self, length: int) -> torch.Tensor:
        return torch.arange(min(self.sinks, length))


@register("sinks", window=Option(64, int, 1), sinks=Option(4, int, 0))  # sinks 0: a sliding window
def build(*, window, sinks, **shape):
    """Each token attends the first ``sinks`` tokens and its last ``window`` tokens."""
    return attention_model("sinks", Sinks(window, sinks), **shape)
