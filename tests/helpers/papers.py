"""The papers' own text, for the tests that check quotes against it (tests/test_papers.py, tests/test_claims_papers.py):
where it lies, which file holds each paper, and the text normalised as the PDF's extraction writes it."""

from __future__ import annotations

import re

from pipeline.reporting.papers import DP
from tests.helpers import ROOT

PAPERS = ROOT.parent / "shared" / "papers"  # beside the checkout, as for CI
TEXTS = {DP: "dp-efficient-transformers.txt"}


def normalized(text: str) -> str:
    """The text as extracted from the PDF: curly quotes straight, math repeated four times once ("64646464" is
    how the extraction writes $64$), whitespace single."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    text = re.sub(r"(\d+?)\1{3}", r"\1", text)
    return re.sub(r"\s+", " ", text)
