"""eq_ncp: next-character prediction on ``w1 [sep] w1`` (alphabet 1024; see tasks.equality).

``ncp`` family: ``prompt_len = 1`` and no label; the trainer derives the target of every prefix from the sequence
(any symbol or ``[sep]`` before the separator, exactly the copied symbol after it). Shortcut-free, unlike
eq_random and eq_one.
"""

from __future__ import annotations

from tasks.equality import NCP, Equality
from tasks.registry import register


@register
class EqNCP(Equality):
    name = "eq_ncp"
    paper = "separations"
    test_sizes = (2, 10, 20)
    paper_sizes = (20, 50, 100, 200, 400, 800)  # App. H.2: up to 800
    family = "ncp"
    mode = NCP
    default_alphabet = 1024
