"""eq_random: is ``w2`` equal to ``w1``? Binary alphabet; negatives are uniform strings (see tasks.equality).

Shortcut (the report should note it): comparing a prefix, or counting symbols, already separates most negatives.
"""

from __future__ import annotations

from tasks.equality import RANDOM, Equality
from tasks.registry import register


@register
class EqRandom(Equality):
    name = "eq_random"
    paper = "separations"
    test_sizes = (2, 10, 20)
    paper_sizes = (20, 50, 100, 200, 400)  # App. H.2: up to 400
    family = "classify"
    mode = RANDOM
    default_alphabet = 2
