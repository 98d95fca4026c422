"""numba helpers shared by the task kernels. Kernels take a ``np.random.Generator`` and draw from it directly, so a
batch is a pure function of the generator's state: the same seed gives the same tokens on every run."""

from __future__ import annotations

import numba
import numpy as np

# cache=True: compiled once per machine (in __pycache__), then loaded in milliseconds by every process
kernel = numba.njit(cache=True, nogil=True)


@kernel
def choose(rng: np.random.Generator, pool: np.ndarray, k: int) -> np.ndarray:
    """A uniform random ordered k-subset of ``pool``: its first k entries after a partial Fisher-Yates shuffle.

    ``pool`` stays a permutation of itself, so it can be reused without resetting it (any permutation works as a start).
    """
    for i in range(k):
        # floor(u * m) for a uniform double u: 3x cheaper than rng.integers in numba, bias below m / 2^53
        j = i + int(rng.random() * (len(pool) - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]
