"""A claim (a worked example, not in the product's CLAIMS): the separations paper's two-layer Transformer of width 64
near-perfect on bounded Dyck up to length 400 (§6, Figure 2). Its words and place are a finding of
pipeline.reporting.findings and its rule one of pipeline.reporting.rules, so it is data only; in the product it is one
more entry of the ``CLAIMS`` tuple in pipeline.reporting.claims."""

from __future__ import annotations

from pipeline.reporting.claims import SEPARATIONS_SCALE, scope, sep
from pipeline.reporting.evidence import Models
from pipeline.reporting.rules import near_perfect

TWO_LAYERS = Models("transformer", (2,), 64)  # a 2-layer transformer of width 64 exactly

DYCK_TWO_LAYERS = sep(
    "sep_dyck_two_layers",  # the key of report.json's claims.<id> and of the MLflow tag claim.<id>
    "sep_dyck",  # the finding: "small-sized recurrent models as well as two-layer Transformers can achieve ..."
    ("dyck",),  # failed trials of these tasks are named beside the verdict
    "a 2-layer transformer of width 64 near-perfect at every dyck length up to 400",
    near_perfect("dyck", [TWO_LAYERS], upto=400),
    scope(["dyck"], [TWO_LAYERS], upto=400),  # what the paper decides it at: its dyck lengths up to 400, this model
    # the paper's own outcome, naming its figure; what deciding the claim takes, at the paper's scale
    paper_outcome="Figure 2 (right): a 2-layer Transformer of width 64 near-perfect at every N up to 400",
    needs="dyck with a 2-layer transformer of width 64; the paper: N = 20-400: " + SEPARATIONS_SCALE,
)
