"""A claim (a worked example, not in the product's CLAIMS): a two-layer Transformer solves index lookup at every
length. It reuses a rule of pipeline.reporting.claims, so it is data only; in the product it is one more entry of
the ``CLAIMS`` tuple there."""

from __future__ import annotations

from pipeline.reporting.claims import Claim, transformer_solves

INDEX_LOOKUP_TWO_LAYERS = Claim(
    "sep_index_lookup_two_layers",  # the key of report.json's claims.<id> and of the MLflow tag claim.<id>
    "separations",
    "A two-layer Transformer solves index lookup at every length.",
    "2-layer transformer (or standard) minimum width at every index_lookup size",
    ("index_lookup",),  # failed trials of these tasks are named beside the verdict
    transformer_solves("index_lookup", (2,)),
)
