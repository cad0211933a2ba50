"""What a worker sees of a sample (docs/study-design.md): the shown words in order, each hidden word
as one ".".

>>> render(["the", "match", "was", "won"], [1, 3])
'.match .won '
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from saleval.config.crowd import DesignError


def render(words: Sequence[str], shown: Sequence[int] | set[int] | np.ndarray) -> str:
    """The rendering rule (docs/study-design.md#display): a hidden word becomes ".", a shown word
    becomes the word followed by one space (``..jason .....creative writing just .....crush ``).

    ``words`` are a sample's kept words in text order (punctuation-only words and
    special tokens were dropped upstream and are never shown); ``shown`` holds
    positions into ``words``.
    """
    keep = set(int(i) for i in shown)
    bad = [i for i in keep if not 0 <= i < len(words)]
    if bad:
        raise DesignError(f"shown word positions {sorted(bad)[:5]} outside 0..{len(words) - 1}")
    return "".join(f"{w} " if i in keep else "." for i, w in enumerate(words))
