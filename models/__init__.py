"""Architectures, one module per architecture; importing this package registers them all."""

from models import dss, linear, linear_nofm, lstm, mamba, retnet, sinks, sliding_window, sparse, standard, transformer  # noqa: F401  (registration side effect)
from models.backbone import Cache, LanguageModel
from models.fused import Fused, FusionError
from models.registry import ARCHITECTURES, ArchitectureError, bf16_on_cpu, build_model

__all__ = [
    "ARCHITECTURES",
    "ArchitectureError",
    "Cache",
    "Fused",
    "FusionError",
    "LanguageModel",
    "bf16_on_cpu",
    "build_model",
]
