"""sliding_window: causal softmax attention over the last w tokens (the "two heads" paper's local attention)."""

from models.attention import Pattern, attention_model
from models.registry import Option, register


class Window(Pattern):
    causal_only = False

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = self.reach = window

    def allowed(self, i, j):
        return (j <= i) & (i - j < self.window)

    def pairs(self, length: int) -> int:
        # row i attends min(i + 1, w) keys
        w = min(self.window, length)
        return w * (w + 1) // 2 + (length - w) * self.window


@register("sliding_window", window=Option(64, int, 1))
def build(*, window, **shape):
    """Each token attends itself and the previous window - 1 tokens; the cache keeps window - 1 positions."""
    return attention_model("sliding_window", Window(window), **shape)
