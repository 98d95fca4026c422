"""transformer: the separations paper's Transformer: learned absolute positions, pre-LN, FFN 4D, causal softmax
attention (1 or 2 layers, 4 or 8 heads in the paper's grid)."""

from models.attention import attention_model
from models.registry import register
from models.standard import Causal


@register("transformer")
def build(**shape):
    """Causal softmax attention with learned absolute positions."""
    return attention_model("transformer", Causal(), positions="learned", **shape)
