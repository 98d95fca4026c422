"""Claim checks on synthetic sweep tables: each claim holds, fails, or is not tested, with its reason."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.reporting.claims import CLAIMS, evaluate
from pipeline.reporting.tables import BELOW, BORDERLINE, BOUND, PAPER_LENGTHS, cheapest, convention_table, min_gflops
from tests.helpers.tables import rows


def check(table_rows: list[dict], claim_id: str) -> dict:
    return next(r for r in evaluate(pd.DataFrame(table_rows)) if r["id"] == claim_id)


def test_every_claim_is_data_with_a_unique_id_and_not_tested_on_an_unrelated_table():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)
    results = evaluate(pd.DataFrame(rows("lis", "lstm", 2, {4: 16})))
    assert [r["id"] for r in results] == [c.id for c in CLAIMS]
    for r in results:
        assert r["status"] == "not tested" and r["detail"].startswith("needs"), r


def test_width_grows_holds_fails_and_skips_uninformative_chains():
    growing = rows("lis", "sparse", 2, {4: 16, 6: 64}) + rows("lis", "linear", 2, {4: 32, 6: None})
    assert check(growing, "dp_width_grows")["status"] == "holds"
    shrinking = rows("lis", "sparse", 2, {4: 32, 6: 16})
    result = check(shrinking, "dp_width_grows")
    assert result["status"] == "fails" and "lis sparse d2: n=4 D=32, n=6 D=16" in result["detail"]
    flat = rows("lis", "sparse", 2, {4: 16, 6: 16})  # the narrowest width everywhere: the grid cannot tell
    assert check(flat, "dp_width_grows")["status"] == "not tested"
    deeper = check(growing, "dp_width_grows_deeper")
    assert deeper["status"] == "not tested" and "depth >= 5" in deeper["detail"]
    assert check(rows("lis", "sparse", 5, {4: 16, 6: 32}), "dp_width_grows_deeper")["status"] == "holds"


def test_no_savings_compares_paper_gflops_at_the_largest_size_standard_solved():
    base = rows("ed", "standard", 3, {6: 16, 12: 32})
    assert check(base + rows("ed", "sparse", 3, {6: 16, 12: 64}), "dp_no_savings_general")["status"] == "holds"
    assert check(base + rows("ed", "linear", 3, {6: 16, 12: None}), "dp_no_savings_general")["status"] == "holds"
    result = check(base + rows("ed", "linear", 3, {6: 16, 12: 16}), "dp_no_savings_general")
    assert result["status"] == "fails" and "ed n=12 d3: linear" in result["detail"]


def test_locality_and_arithmetic_ordering():
    ed = rows("ed", "sparse", 3, {6: 32}) + rows("ed_local", "sparse", 3, {6: 16})
    assert check(ed, "dp_locality")["status"] == "holds"
    ed_worse = rows("ed", "sparse", 3, {6: 16}) + rows("ed_local", "sparse", 3, {6: 64})
    assert check(ed_worse, "dp_locality")["status"] == "fails"
    # no one solves: the ordering falls back to the best accuracy
    order = (rows("arithmetic", "standard", 2, {2: None}, accuracy=0.8)
             + rows("arithmetic", "sparse", 2, {2: None}, accuracy=0.4)
             + rows("arithmetic", "linear", 2, {2: None}, accuracy=0.7))
    result = check(order, "dp_arithmetic_standard_first")
    assert result["status"] == "holds"
    assert "2 ops d2: standard D=none vs sparse D=none; at every width: best 80% vs 40%" in result["detail"]
    flipped = rows("arithmetic", "standard", 2, {2: 64}) + rows("arithmetic", "linear", 2, {2: 32})
    assert check(flipped, "dp_arithmetic_standard_first")["status"] == "fails"
    # solved at the same width: the narrower widths rank them; within TIE a tie, which holds
    for standard, linear, status in [(0.6, 0.2, "holds"), (0.2, 0.6, "fails"), (0.3, 0.32, "holds")]:
        same = (rows("arithmetic", "standard", 2, {2: 64}, accuracy=standard)
                + rows("arithmetic", "linear", 2, {2: 64}, accuracy=linear))
        result = check(same, "dp_arithmetic_standard_first")
        assert result["status"] == status
        assert f"standard D=64 vs linear D=64; below D=64: best {standard:.0%} vs {linear:.0%}" in result["detail"]
    narrowest = rows("arithmetic", "standard", 2, {2: 16}) + rows("arithmetic", "linear", 2, {2: 16})
    assert check(narrowest, "dp_arithmetic_standard_first")["status"] == "holds"  # no wider: nothing to rank below


def test_index_lookup_separation_and_the_length_it_needs():
    table = (rows("index_lookup", "transformer", 1, {20: 64, 50: 64}, widths=(64,))
             + rows("index_lookup", "lstm", 1, {20: None, 50: None}, widths=(64, 256), accuracy=0.04))
    assert check(table, "sep_index_lookup_one_layer")["status"] == "holds"
    result = check(table, "sep_index_lookup_separation")
    assert result["status"] == "holds" and "LSTM best 4.0%" in result["detail"]
    recurrent = check(table, "sep_index_lookup_recurrent_fail")
    assert recurrent["status"] == "not tested" and recurrent["detail"].startswith("needs index_lookup lengths > 100")
    learns = (rows("index_lookup", "transformer", 1, {20: 64}, widths=(64,))
              + rows("index_lookup", "lstm", 1, {20: None}, widths=(64,), accuracy=0.5))
    assert check(learns, "sep_index_lookup_separation")["status"] == "fails"
    long = table + rows("index_lookup", "mamba", 2, {200: 64}, widths=(64,))
    result = check(long, "sep_index_lookup_recurrent_fail")
    assert result["status"] == "fails" and "mamba N=200" in result["detail"]


def test_failed_trials_are_named_in_the_detail():
    table = (rows("index_lookup", "transformer", 1, {20: 64}, widths=(64,))
             + rows("index_lookup", "lstm", 1, {20: None}, widths=(64,), status_override="failed", accuracy=0.0))
    result = check(table, "sep_index_lookup_separation")
    assert result["status"] == "holds" and "1 failed trials in index_lookup" in result["detail"]


def test_table2_three_conventions_per_depth_cheapest_and_paper_length():
    table = pd.DataFrame(rows("arithmetic", "standard", 3, {6: 32}) + rows("arithmetic", "linear", 3, {6: 16})
                         + rows("arithmetic", "standard", 5, {6: 16}) + rows("arithmetic", "sparse", 3, {6: None}))
    best = min_gflops(table)
    d3 = best[best.depth == 3].set_index("arch")
    assert d3.loc["standard", "width"] == 32 and d3.loc["linear", "width"] == 16 and pd.isna(d3.loc["sparse", "width"])
    assert best[best.depth == 5].width.tolist() == [16]  # depths never share a minimum
    assert d3.loc["linear", "min_train_pflops"] == pytest.approx(16e-3)
    paper_l = PAPER_LENGTHS["arithmetic"][6]
    assert d3.loc["standard", "paper_L"] == paper_l and d3.loc["standard", "L"] == 65
    assert d3.loc["standard", "paper_gflops_at_paper_L"] == pytest.approx(
        d3.loc["standard", "min_paper_gflops"] * (paper_l + 2) / (65 + 2))
    marks = cheapest(best[best.depth == 3], "min_paper_gflops").iloc[0]
    assert marks.cheapest == "linear" and marks.ratio_to_standard == pytest.approx(0.25)
    tie = best.assign(min_paper_gflops=1.0)  # every architecture costs the same: standard keeps the mark
    assert set(cheapest(tie[tie.depth == 3], "min_paper_gflops").cheapest) == {"standard"}
    no_base = tie[(tie.depth == 3) & (tie.arch != "standard")]
    assert cheapest(no_base, "min_paper_gflops").iloc[0].cheapest == ", ".join(sorted(no_base.arch))
    shown = convention_table(best, 3, "min_paper_gflops").iloc[0]
    assert shown["linear"].startswith("**") and "0.25x standard" in shown["linear"]
    assert shown["sparse"].startswith("- (best 30%") and shown["paper L"] == str(paper_l)
    assert shown["standard @ paper L"] != ""
    alone = convention_table(best, 5, "min_train_pflops").iloc[0]["standard"]
    assert alone == "**0.016 (D=16, 95%)**, 1.00x standard"


def test_a_width_solved_on_validation_but_below_the_threshold_on_test_is_marked():
    table = pd.DataFrame(rows("lis", "standard", 2, {6: 32}) + rows("lis", "sparse", 2, {6: 64}))
    table.loc[(table.arch == "sparse") & (table.width == 64), "final_accuracy"] = 0.864
    best = min_gflops(table)
    shown = convention_table(best, 2, "min_exact_gflops", threshold=0.9).iloc[0]
    assert shown["sparse"].endswith(f"(D=64, 86%{BELOW})") and BELOW not in shown["standard"]
    assert BELOW not in convention_table(best, 2, "min_exact_gflops").iloc[0]["sparse"]  # no threshold: no mark


def test_a_claim_that_rests_on_an_undecided_cell_is_not_tested_and_names_it():
    growing = rows("lis", "sparse", 2, {4: 16, 6: 64}) + rows("lis", "linear", 2, {4: 32, 6: None})
    assert check(growing, "dp_width_grows")["status"] == "holds"
    # sparse n=6 D=16 still improving when its budget ran out: the minimum width 64 is an upper bound
    narrower = (rows("lis", "sparse", 2, {4: 16, 6: 64}, undecided={(6, 16)})
                + rows("lis", "linear", 2, {4: 32, 6: None}))
    result = check(narrower, "dp_width_grows")
    assert result["status"] == "not tested"
    assert result["detail"] == ("lis n=6 sparse d2: seed 0 D=16 undecided (budget: still improving at step 6400 "
                                "(8x the budget of 800))")
    # no width solved, but one is undecided: no evidence that the LSTM fails, nor that it stays near chance
    lstm = rows("index_lookup", "lstm", 1, {200: None}, widths=(64, 128, 256), accuracy=0.04,
                undecided={(200, 64), (200, 128), (200, 256)}, seeds=(0, 1))
    result = check(lstm, "sep_index_lookup_recurrent_fail")
    assert result["status"] == "not tested"
    assert result["detail"].startswith("index_lookup n=200 lstm d1: seed 0 D=64 undecided (budget: ")
    assert result["detail"].endswith("; and 3 more undecided cells")
    # an undecided cell wider than a solved width decides nothing: solved stays solved
    solved = rows("index_lookup", "transformer", 1, {20: 64}, widths=(64, 128), undecided={(20, 128)})
    assert check(solved, "sep_index_lookup_one_layer")["status"] == "holds"


def test_the_min_width_table_never_shows_an_undecided_row_as_unsolved_or_a_bound_as_the_minimum():
    table = pd.DataFrame(rows("lis", "standard", 2, {6: 32}, undecided={(6, 16)})
                         + rows("lis", "sparse", 2, {6: None}, undecided={(6, 64)}, accuracy=0.85)
                         + rows("lis", "linear", 2, {6: None}) + rows("lis", "standard", 3, {6: 32}))
    best = min_gflops(table).set_index(["arch", "depth"])
    assert best.loc[("standard", 2), "undecided"] == "seed 0 D=16" and best.loc[("standard", 2), "width"] == 32
    assert best.loc[("sparse", 2), "undecided"] == "seed 0 D=64" and pd.isna(best.loc[("sparse", 2), "width"])
    assert best.loc[("linear", 2), "undecided"] == "" and best.loc[("standard", 3), "undecided"] == ""
    shown = convention_table(min_gflops(table), 2, "min_exact_gflops", threshold=0.9).iloc[0]
    assert shown["standard"] == f"{BOUND} 0.0998 (D=32, 95%) undecided below"
    assert shown["sparse"] == "undecided (best 85%)" and shown["linear"] == "- (best 30%)"
    assert "**" not in "".join(shown[["standard", "sparse", "linear"]])  # which is cheapest is not decided yet
    assert convention_table(min_gflops(table), 3, "min_exact_gflops").iloc[0]["standard"].startswith("**")


def test_a_borderline_test_accuracy_is_marked_in_the_min_width_table():
    table = pd.DataFrame(rows("lis", "standard", 2, {6: 32}, borderline={(6, 32)}) + rows("lis", "sparse", 2, {6: 64}))
    best = min_gflops(table).set_index("arch")
    assert best.loc["standard", "borderline"] and not best.loc["sparse", "borderline"]
    shown = convention_table(min_gflops(table), 2, "min_exact_gflops", threshold=0.9).iloc[0]
    assert f"(D=32, {BORDERLINE}95%)" in shown["standard"] and BORDERLINE not in shown["sparse"]
