"""The two papers whose tasks these are, and the accuracy each calls solved: a task's ``paper`` is one of ``PAPERS``,
its claims are read at its paper's threshold, and its trials train on to it (``tasks.registry.training_targets``).
Here, beside the tasks, so that the sweep stage, which reads the targets, imports nothing of the report's claims (a
changed rule reruns the report only).

tests/test_claims.py checks that each task's target is the highest threshold a claim on it reads."""

from __future__ import annotations

TABLE2_THRESHOLD = 0.90  # "Minimum GFLOPs of different model types to achieve an accuracy above 90%"
NEAR_PERFECT = 0.99  # the separations paper's "near-perfect" (it gives no number; 99% of 5,000 test strings)
# the DP paper (Feng et al. 2023) and the separations paper, by a task's ``paper``
PAPER_THRESHOLD = {"dp": TABLE2_THRESHOLD, "separations": NEAR_PERFECT}
PAPERS = tuple(PAPER_THRESHOLD)
