"""sparse: Child et al.'s fixed block pattern, as used by the DP paper.

Position i attends j iff  j <= i  and  (i - j < k B  or  j mod B = B - 1):  a local window of k B tokens plus
the last token of every block as a global summary (c = 1). B = 2^floor(log2(sqrt(L))) with L the dataset's
maximum length, so B = 8 for L up to 223 and 16 for 342..506.
"""

import math

import torch

from models.attention import Pattern, attention_model
from models.registry import Option, register


def block_size(length: int) -> int:
    """B = 2^floor(log2(sqrt(L)))."""
    return 2 ** int(math.floor(math.log2(math.sqrt(length))))


class BlockSparse(Pattern):
    causal_only = False

    def __init__(self, block: int, k: int):
        self.block, self.k = block, k
        self.reach = k * block

    def allowed(self, i, j):
        return (j <= i) & ((i - j < self.k * self.block) | (j % self.block == self.block - 1))

    def global_keys(self, length: int) -> torch.Tensor:
        return torch.arange(self.block - 1, length, self.block)  # the last token of every block


@register("sparse", block=Option(None, int, 1, null="B from the sequence length"), k=Option(1, int, 1))
def build(*, block, k, **shape):
    """Block-sparse causal attention: local window k*B plus one summary token per block (B from L if unset)."""
    return attention_model("sparse", BlockSparse(block or block_size(shape["max_len"]), k), **shape)
