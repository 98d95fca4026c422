"""The papers' own figures as the project records them (pipeline.reporting.findings): Table 2's GFLOPs stand for
the widths its count gives, every finding is quoted verbatim from the papers' text, and docs/fidelity.md gives the
claims and Table 2 as the code has them."""

from __future__ import annotations

import re

import pytest

from pipeline.reporting.findings import (
    FINDINGS,
    TABLE2_GFLOPS,
    TABLE2_LENGTHS,
    table2_gflops,
    table2_width,
    table2_widths,
)
from tests.helpers import ROOT
from tests.helpers.papers import PAPERS, TEXTS, normalized


def test_table2_back_solves_to_powers_of_two_within_its_rounding():
    assert TABLE2_LENGTHS == {6: 87, 10: 221, 13: 355, 16: 505}
    assert table2_widths() == {"standard": {87: 64, 221: 128, 355: 128, 505: 128},
                               "linear": {87: 256, 221: 512, 355: 512, 505: 512},
                               "sparse": {87: 128, 221: 256, 355: 256, 505: 256}}
    for arch, by_length in TABLE2_GFLOPS.items():
        for length, gflops in by_length.items():
            width = table2_widths()[arch][length]
            assert abs(table2_width(gflops, length) / width - 1) < 0.003
            # within the paper's three decimals (0.027 stands for 0.02685) and its count's small differences
            assert table2_gflops(width, length) == pytest.approx(gflops, rel=0.006)


@pytest.mark.skipif(not PAPERS.is_dir(), reason=f"the papers' text is not at {PAPERS}")
def test_every_finding_is_quoted_verbatim_from_its_paper():
    texts = {paper: normalized((PAPERS / TEXTS.get(paper, "separations.txt")).read_text()) for paper in
             {f.paper for f in FINDINGS}}
    missing = [f.id for f in FINDINGS if normalized(f.quote) not in texts[f.paper]]
    assert not missing, f"not found verbatim in the paper's text: {missing}"
    assert len({f.id for f in FINDINGS}) == len(FINDINGS)


def test_table2_against_a_run_says_how_each_cell_compares_or_why_it_cannot():
    import pandas as pd

    from pipeline.reporting.tables import against_table2

    best = pd.DataFrame([
        {"task": "arithmetic", "size": 6, "arch": "standard", "depth": 3, "width": 64, "undecided": "",
         "paper_gflops_at_paper_L": 0.027},
        {"task": "arithmetic", "size": 6, "arch": "linear", "depth": 3, "width": 128, "undecided": "seed 0 D=64",
         "paper_gflops_at_paper_L": 0.1},
        {"task": "arithmetic", "size": 6, "arch": "sparse", "depth": 3, "width": None, "undecided": "",
         "paper_gflops_at_paper_L": None},
        {"task": "arithmetic", "size": 10, "arch": "standard", "depth": 3, "width": None, "undecided": "seed 1 D=512",
         "paper_gflops_at_paper_L": None},
        {"task": "arithmetic", "size": 13, "arch": "standard", "depth": 2, "width": 32, "undecided": "",
         "paper_gflops_at_paper_L": 0.01},
    ])
    verdicts = {(r.arch, r.operators): r.verdict for r in against_table2(best).itertuples()}
    assert len(verdicts) == 12
    assert verdicts["standard", 6] == "same width"
    assert verdicts["linear", 6] == "0.5x the paper's width, an upper bound (seed 0 D=64)"
    assert verdicts["sparse", 6] == "no width tried solves"
    assert verdicts["standard", 10] == "undecided (seed 1 D=512)"
    assert verdicts["standard", 13] == "not run (arithmetic 13 at depth 3)"  # depth 2 is not the paper's


def test_docs_fidelity_gives_every_claim_and_table2_as_the_code_has_them():
    """docs/fidelity.md cannot drift from the code: a section per claim, in CLAIMS' order, with its threshold and
    where that comes from, the paper's words and place, its outcome, our test and what it needs; Table 2's GFLOPs
    and the widths they stand for."""
    from pipeline.reporting.claims import CLAIMS

    page = (ROOT / "docs" / "fidelity.md").read_text()
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^#|\Z)", page, flags=re.M | re.S))
    assert list(sections) == [c.id for c in CLAIMS]
    for claim in CLAIMS:
        shown = " ".join(sections[claim.id].split())
        for field in (f"{claim.threshold:.0%} ({claim.source})", claim.finding.where, claim.finding.quote,
                      claim.paper_outcome, claim.test, claim.needs):
            assert " ".join(field.split()) in shown, (claim.id, field)
    widths = table2_widths()
    for arch, by_length in TABLE2_GFLOPS.items():
        cells = " | ".join(f"{gflops} (D = {widths[arch][length]})" for length, gflops in by_length.items())
        assert f"| {arch} | {cells} |" in page
