"""Per-item random generators for the crowd side (design and simulated crowd)."""

from __future__ import annotations

import zlib

import numpy as np


def seeded_rng(seed: int, *keys: object) -> np.random.Generator:
    """A generator determined by the seed and the keys (stable across processes,
    unlike ``hash``), so each task's randomness does not depend on iteration order.

    >>> float(seeded_rng(1, "a").random()) == float(seeded_rng(1, "a").random())
    True
    """
    words = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(str(k).encode()) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(words))
