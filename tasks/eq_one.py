"""eq_one: is ``w2`` equal to ``w1``? Alphabet of 1024; negatives differ in exactly one position (tasks.equality).

Shortcut (the report should note it): the symbol counts of w1 and w2 differ exactly for the negatives.
"""

from __future__ import annotations

from tasks.equality import ONE, Equality
from tasks.registry import register


@register
class EqOne(Equality):
    name = "eq_one"
    paper = "separations"
    test_sizes = (2, 10, 20)
    paper_sizes = (20, 50, 100, 200, 400)  # App. H.2: up to 400
    family = "classify"
    mode = ONE
    default_alphabet = 1024
