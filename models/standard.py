"""standard: causal softmax attention (the DP paper's baseline Transformer)."""

from models.attention import Pattern, SoftmaxAttention
from models.registry import register
from models.transformer import LanguageModel


class Causal(Pattern):
    """Position i attends every j <= i: L(L+1)/2 pairs."""

    def pairs(self, length: int) -> int:
        return length * (length + 1) // 2

    def attended(self, length: int) -> int:
        return length


@register("standard")
def build(*, vocab_size, width, depth, heads, max_len, dropout):
    """Causal softmax attention, scale 1/sqrt(D/H)."""
    return LanguageModel(vocab_size, width, depth, heads, max_len, dropout,
                         lambda: SoftmaxAttention(width, heads, dropout, Causal()), "standard")
