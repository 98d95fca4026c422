"""The papers' own text, for the tests that check quotes against it (tests/test_papers.py, tests/test_claims_papers.py):
where it lies and which file holds each paper, as the report reads them (``pipeline.reporting.findings``), and the text
normalised as the PDF's extraction writes it."""

from __future__ import annotations

from pipeline.reporting.findings import TEXTS, normalized, papers_dir

PAPERS = papers_dir()  # beside the checkout, as for CI

__all__ = ["PAPERS", "TEXTS", "normalized"]
