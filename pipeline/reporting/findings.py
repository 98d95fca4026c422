"""What the two papers report, recorded once with where they say it: the figures a reproduction is read against.

The DP paper's Table 2 gives minimum GFLOPs to pass 90% on arithmetic, not widths; with its own count for a 3-layer
model on a chain of thought of length L, 2 (L + 2) (36 D^2 + 53 D) / 1e9 GFLOPs, every entry back-solves to a power
of two within 0.3% (``table2_width``): the widths are the paper's, read off its numbers. Figures are not numbers in
the papers' text: the outcomes of the DP paper's Figures 1-3 and of the separations paper's Figures 2-4 (§6,
Appendix H), and the models and sizes behind them, are kept as the paper words them (``FINDINGS``), quoted
verbatim, so that ``tests/test_papers.py`` checks every quote against the papers' text. The claims
(``pipeline.reporting.claims``) cite them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.config import PROJECT
from tasks import TASKS

DP = "Yang et al., Do Efficient Transformers Really Save Computation? (ICML 2024)"
SEPARATIONS = "Bhattamishra et al., Separations in the Representational Capabilities of Transformers and RNNs (2024)"

# the papers' text (not in this repository): beside the checkout, as for CI, or where $CAPACITY_ATLAS_PAPERS says
PAPERS_ENV = "CAPACITY_ATLAS_PAPERS"
TEXTS = {DP: "dp-efficient-transformers.txt", SEPARATIONS: "separations.txt"}

TABLE2_LAYERS = 3  # §6.1: "3 layers and 4 attention heads"
# arithmetic operators -> the maximum CoT length L the paper states for them (§6.1), as the task declares them
TABLE2_LENGTHS = dict(TASKS["arithmetic"].paper_lengths)
# architecture -> L -> the paper's minimum GFLOPs (Table 2, §6.2)
TABLE2_GFLOPS = {
    "standard": {87: 0.027, 221: 0.266, 355: 0.426, 505: 0.605},
    "linear": {87: 0.422, 221: 4.220, 355: 6.756, 505: 9.584},
    "sparse": {87: 0.106, 221: 1.055, 355: 1.690, 505: 2.399},
}


def table2_gflops(width: int, length: int) -> float:
    """The DP paper's count for a 3-layer model of width D over a chain of thought of L tokens:
    2 (L + 2) (36 D^2 + 53 D) / 1e9 (matrix products only: 12 D^2 per layer, and the 53 D of its embeddings)."""
    return 2 * (length + 2) * (36 * width**2 + 53 * width) / 1e9


def table2_width(gflops: float, length: int) -> float:
    """The width whose ``table2_gflops`` at ``length`` is ``gflops``: the root of 36 D^2 + 53 D = c."""
    c = gflops * 1e9 / (2 * (length + 2))
    return (-53 + math.sqrt(53**2 + 4 * 36 * c)) / 72


def table2_widths() -> dict[str, dict[int, int]]:
    """architecture -> L -> the minimum width Table 2's GFLOPs stand for (the nearest power of two)."""
    return {
        arch: {L: 2 ** round(math.log2(table2_width(g, L))) for L, g in by_length.items()}
        for arch, by_length in TABLE2_GFLOPS.items()
    }


def table2_at(operators: int) -> dict[str, int]:
    """architecture -> Table 2's minimum width at ``operators`` (empty where Table 2 has no such column)."""
    length = TABLE2_LENGTHS.get(operators)
    return {} if length is None else {arch: by_length[length] for arch, by_length in table2_widths().items()}


def table2_in_words() -> str:
    """Table 2's outcome: its order, and the widths its GFLOPs stand for at each number of operators."""
    widths = table2_widths()
    by_arch = ", ".join(f"{a} {'/'.join(map(str, widths[a].values()))}" for a in ("standard", "sparse", "linear"))
    return (
        "Table 2 (3 layers): standard needs the fewest GFLOPs at every length; its GFLOPs stand for widths "
        f"{by_arch} at {'/'.join(map(str, TABLE2_LENGTHS))} operators"
    )


@dataclass(frozen=True)
class Finding:
    """One passage of a paper, in its words: ``quote`` (verbatim from ``paper``'s text) at ``where``; ``setup``: it
    states how the paper ran an experiment, not what it measured (every measured one is checked by a claim, or
    said not checked, and why: ``pipeline.reporting.claims``)."""

    id: str
    paper: str
    where: str
    quote: str
    setup: bool = False


FINDINGS = (
    Finding(
        "dp_figure1",
        DP,
        "§6.2, Figure 1 (caption)",
        "The figure demonstrates that efficient Transformers need larger hidden dimensions and that this requirement "
        "increases with problem size.",
    ),
    Finding(
        "dp_efficient_wider",
        DP,
        "§6.2, Figure 1",
        "efficient Transformers generally need larger hidden dimensions than standard Transformers",
    ),
    Finding(
        "dp_standard_fixed",
        DP,
        "§6.2, Figure 1",
        "standard Transformers, with fixed embedding dimensions of 128 or 256, can handle tasks across all difficulty "
        "levels",
    ),
    Finding(
        "dp_efficient_grow",
        DP,
        "§6.2, Figure 1",
        "within each subplot of efficient Transformers, the required embedding dimension increases as the problem "
        "grows",
    ),
    Finding(
        "dp_lis_sparse",
        DP,
        "§6.2, Figure 1",
        "models with sufficiently large embedding dimensions can achieve nearly 100% accuracy, except for the LIS "
        "task with the Sparse Transformer",
    ),
    Finding(
        "dp_lis_sparse_grows",
        DP,
        "§6.2, Figure 1",
        "Nevertheless, for this task, the accuracy still increases as the embedding dimension increases.",
    ),
    Finding(
        "dp_less_locality",
        DP,
        "§6.2, Figure 1",
        "Comparing the subplots row-wise, the growth in required embedding dimension with the model size becomes more "
        "pronounced as the locality decreases.",
    ),
    Finding(
        "dp_table2_threshold",
        DP,
        "§6.2, Table 2 (caption)",
        "Minimum GFLOPs of different model types to achieve an accuracy above 90% on Arithmetic Task.",
        setup=True,
    ),
    Finding(
        "dp_table2",
        DP,
        "§6.2, Table 2",
        "The standard Transformer requires the lowest number of flops across all lengths.",
    ),
    Finding(
        "dp_lis_general",
        DP,
        "§6.1",
        "The LIS task is the most general DP problem without locality property, while ED and Arithmetic exhibit "
        "higher locality.",
        setup=True,
    ),
    Finding(
        "dp_locality",
        DP,
        "§6.2, Figure 2",
        "the increased locality led to a reduction in necessary embedding size",
    ),
    Finding(
        "dp_figure2",
        DP,
        "§6.2, Figure 2 (caption)",
        "We can observe that both models benefit from locality.",
    ),
    Finding(
        "dp_five_layers_setup",
        DP,
        "Appendix D, Figure 3",
        "The accuracies of standard and efficient Transformers with 5 layers on the ED task are shown in Figure 3.",
        setup=True,
    ),
    Finding(
        "dp_five_layers",
        DP,
        "Appendix D, Figure 3",
        "The results are similar to the results we obtained when using 3 layers.",
    ),
    Finding(
        "sep_index_lookup_models",
        SEPARATIONS,
        "§6, Figure 2 (left, middle)",
        "We evaluate relatively small-sized Transformers with widths 64 against recurrent models with up to 6 layers "
        "and widths or hidden state size of 256.",
        setup=True,
    ),
    Finding(
        "sep_index_lookup",
        SEPARATIONS,
        "§6, Figure 2 (left, middle)",
        "while one-layer Transformers with width 64 achieve near-perfect accuracy within a few thousand steps, the "
        "performance of relatively larger recurrent or state-space models degrades on lengths over 100",
    ),
    Finding(
        "sep_dyck_models",
        SEPARATIONS,
        "§6, Figure 2 (right)",
        "We consider LSTMs and Mamba with hidden state sizes of 64 and similarly, two-layer Transformers with width "
        "64.",
        setup=True,
    ),
    Finding(
        "sep_dyck_one_layer_width",
        SEPARATIONS,
        "§6, Figure 2 (right)",
        "We evaluate a one-layer Transformer with a width of 256 across lengths",
        setup=True,
    ),
    Finding(
        "sep_dyck",
        SEPARATIONS,
        "§6, Figure 2 (right)",
        "In contrast, small-sized recurrent models as well as two-layer Transformers can achieve near-perfect "
        "accuracy for lengths up to 400",
    ),
    Finding(
        "sep_dyck_one_layer",
        SEPARATIONS,
        "§6, Figure 2 (right)",
        "We observe that one-layer Transformers achieve near-perfect accuracy up to lengths 100 but struggle on "
        "higher lengths.",
    ),
    Finding(
        "sep_mamba_width",
        SEPARATIONS,
        "Appendix H.1, Figure 3",
        "We find a clear trend where the performance of Mamba models increases monotonically with the increase in "
        "the width of the model",
    ),
    Finding(
        "sep_mamba_below_transformer",
        SEPARATIONS,
        "Appendix H.1, Figure 3",
        "even with a width of 1024, the performance of Mamba is still much worse than a one-layer Transformer with a "
        "width of 64.",
    ),
    Finding(
        "sep_lstm_width",
        SEPARATIONS,
        "Appendix H.1",
        "We did a similar experiment with LSTM but did not observe such a trend and for lengths above 100 the "
        "performance remained at chance level even when the width was increased.",
    ),
    Finding(
        "sep_eq_transformers",
        SEPARATIONS,
        "Appendix H.2, Figure 4 (left)",
        "On both the Eq-random task and Eq-one task we find that Transformers achieve near-perfect accuracy on lengths "
        "up to 400.",
    ),
    Finding(
        "sep_eq_random",
        SEPARATIONS,
        "Appendix H.2, Figure 4 (left)",
        "Recurrent models like LSTMs and linear Transformers struggle at lengths beyond 100 on the Eq-random task.",
    ),
    Finding(
        "sep_eq_random_ssm",
        SEPARATIONS,
        "Appendix H.2, Figure 4 (left)",
        "state-space models like DSS and Mamba are able to match Transformers' performance on both tasks",
    ),
    Finding(
        "sep_eq_one",
        SEPARATIONS,
        "Appendix H.2, Figure 4",
        "On the Eq-one task, we find that for lengths up to 400, all models are able to achieve near-perfect accuracy.",
    ),
    Finding(
        "sep_eq_ncp",
        SEPARATIONS,
        "Appendix H.2, Figure 4",
        "when the model sizes are restricted, i.e., the width of the models is 64, state-space models such as DSS and "
        "Mamba struggle to perform better than chance-level accuracy for lengths over 400",
    ),
    Finding(
        "sep_eq_ncp_transformers",
        SEPARATIONS,
        "Appendix H.2, Figure 4",
        "In contrast, Transformers are able to achieve near-perfect accuracy (See Figure 4).",
    ),
    Finding(
        "sep_eq_ncp_dss_wide",
        SEPARATIONS,
        "Appendix H.2, Figure 4",
        "we find that the DSS architecture in particular is able to solve the task for lengths up to 800 with larger "
        "widths in the NCP setting",
    ),
    Finding(
        "sep_protocol",
        SEPARATIONS,
        "Appendix H",
        "We train the models for up to 250k steps unless they achieve (almost) perfect validation accuracy earlier.",
        setup=True,
    ),
    Finding(
        "dp_most_scenarios",
        DP,
        "§1 (Introduction)",
        "for both efficient Transformers, the required hidden dimension increases as the problem size grows in most "
        "scenarios, while this is not the case for the standard Transformer",
    ),
    Finding(
        "dp_lis_steeper",
        DP,
        "§1 (Introduction)",
        "Moreover, the dependency between hidden dimension and problem scale is more pronounced in LIS than in ED.",
    ),
    Finding(
        "sep_learning_rates",
        SEPARATIONS,
        "§7 (Discussion)",
        "For tasks like Index lookup, we observe that Transformers achieve near-perfect accuracy across several "
        "learning rates whereas recurrent architectures fail on all the learning rates we tried.",
    ),
    Finding(
        "sep_dyck_slower",
        SEPARATIONS,
        "§7 (Discussion)",
        "A similar thing is true for other tasks such as Dyck-(2, 2) where one-layer Transformers seem to learn at a "
        "much slower rate compared to LSTMs and two-layer Transformers even for the lengths where they do achieve "
        "near-perfect accuracy.",
    ),
    Finding(
        "sep_eq_ncp_wide",
        SEPARATIONS,
        "Appendix H.2",
        "For models with larger widths, we find that DSS and Transformers succeed at performing the tasks for the "
        "lengths considered in our experiments.",
    ),
)


def papers_dir() -> Path:
    return Path(os.environ.get(PAPERS_ENV) or PROJECT.parent / "shared" / "papers")


def normalized(text: str) -> str:
    """The text as extracted from the PDF: curly quotes straight, math repeated four times once ("64646464" is
    how the extraction writes $64$), whitespace single."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    text = re.sub(r"(\d+?)\1{3}", r"\1", text)
    return re.sub(r"\s+", " ", text)


def unquoted(findings: tuple[Finding, ...] = FINDINGS, where: Path | None = None) -> list[Finding] | None:
    """The findings whose quote is not verbatim in their paper's text at ``where`` (``papers_dir``); None where
    that text is not there to read."""
    where = where or papers_dir()
    if not all((where / TEXTS[f.paper]).is_file() for f in findings):
        return None
    texts = {paper: normalized((where / name).read_text()) for paper, name in TEXTS.items()}
    return [f for f in findings if normalized(f.quote) not in texts[f.paper]]
