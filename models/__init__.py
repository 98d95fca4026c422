"""Architectures, one module per architecture; importing this package registers them all."""

from models import linear, sparse, standard  # noqa: F401  (registration side effect)
from models.registry import ARCHITECTURES, ArchitectureError, build_model
from models.transformer import Cache, LanguageModel

__all__ = ["ARCHITECTURES", "ArchitectureError", "Cache", "LanguageModel", "build_model"]
