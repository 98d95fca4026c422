"""standard: causal softmax attention (the DP paper's baseline Transformer)."""

from models.attention import Pattern, attention_model
from models.registry import register


class Causal(Pattern):
    """Position i attends every j <= i: L(L+1)/2 pairs."""

    def pairs(self, length: int) -> int:
        return length * (length + 1) // 2

    def attended(self, length: int) -> int:
        return length


@register("standard")
def build(**shape):
    """Causal softmax attention, scale 1/sqrt(D/H), sinusoidal positions."""
    return attention_model("standard", Causal(), **shape)
