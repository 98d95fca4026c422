"""Edit distance "modified to have a higher locality" (the DP paper's ED variant; the layout is our choice).

Everything as in ``ed`` (tasks.ed), except that each row of the chain starts with its letter A[i-1] and each
cell is written as the pair ``B[j-1] dp[i][j]``, so a cell's inputs sit within the last 2|B| + 4 tokens:
``A | B <sep> a_1 b_1 dp[1][1] .. b_|B| dp[1][|B|] , a_2 ... , <sep> answer``; length
|A| + |B| + 4 + |A| (2|B| + 2). The row letters still copy from the input, so the window over every generated value
stays close to the sequence length: both windows are in each file's stats.
"""

from __future__ import annotations

from tasks.ed import ED
from tasks.registry import register


@register
class EDLocal(ED):
    name = "ed_local"
    paper = "dp"
    test_sizes = (4, 5, 8)
    paper_sizes = (6, 12, 16, 20)  # Figure 2 states none: ed's (§6.1), which its locality study modifies
    local = True
