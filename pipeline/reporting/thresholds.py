"""The accuracy each paper calls solved, and what a task's trials train on to: kept apart from the claims' rules so
that the sweep stage, which reads the targets, does not depend on them (a changed rule reruns the report only).

tests/test_claims.py checks that each task's target is the highest threshold a claim on it reads."""

from __future__ import annotations

from collections.abc import Iterable

from tasks import TASKS

TABLE2_THRESHOLD = 0.90  # "Minimum GFLOPs of different model types to achieve an accuracy above 90%"
NEAR_PERFECT = 0.99  # the separations paper's "near-perfect" (it gives no number; 99% of 5,000 test strings)
PAPER_THRESHOLD = {"dp": TABLE2_THRESHOLD, "separations": NEAR_PERFECT}  # by a task's ``paper``


def training_targets(tasks: Iterable[str], threshold: float) -> dict[str, float]:
    """task -> the accuracy its trials train on to once solved at ``threshold``: its paper's threshold (the one its
    claims read), never below ``threshold``."""
    return {t: max(threshold, PAPER_THRESHOLD[TASKS[t].paper]) for t in tasks}
