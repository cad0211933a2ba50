"""Methods that would give the crowd the same tasks (docs/study-design.md#identical-methods).

Two methods whose top-k words agree on every study sample at every k of the k-grid make
tasks that differ in their method name only: the crowd would be paid to answer the same
question twice. This happens on decoders, where Captum's DeepLIFT has no rule for any
of the model's non-linearities and computes input×gradient (docs/methods.md#deeplift).
The top-k words are the tasks' own (:func:`saleval.crowd.design.tasks.word_table`, one
ranking by :func:`saleval.words.rank_words` nested across k), so what is compared here
is what a worker would see.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from saleval.crowd.design.tasks import word_table


def identical_methods(
    attributions: pd.DataFrame,
    methods: Sequence[str],
    ks: Sequence[int],
    sample_ids: Sequence[str] | None = None,
    where: str = "attributions",
) -> list[tuple[str, str]]:
    """Every pair ``(a, b)`` of ``methods`` (``a`` listed first) whose top-k words are the
    same set on every sample and at every k of ``ks``.

    ``sample_ids``: the samples compared (the study's); by default every sample that all
    of ``methods`` explained. With no sample to compare, nothing is identical. A k at or
    above a text's length shows that whole text under every method, so on such texts only
    the smaller ks can tell methods apart.

    >>> rows = [("s1", m, j, f"w{j}", s) for m, scores in
    ...         [("ixg", [0.9, 0.1, 0.5, 0.3]), ("deeplift", [1.8, 0.2, 1.0, 0.6]),
    ...          ("lime", [0.9, 0.5, 0.1, 0.3])] for j, s in enumerate(scores)]
    >>> attrs = pd.DataFrame(rows, columns=["sample_id", "method", "word_index", "word", "score"])
    >>> identical_methods(attrs, ["ixg", "deeplift", "lime"], [1, 3])
    [('ixg', 'deeplift')]
    >>> identical_methods(attrs, ["ixg", "deeplift", "lime"], [1])  # lime agrees at k=1 only
    [('ixg', 'deeplift'), ('ixg', 'lime'), ('deeplift', 'lime')]
    """
    methods = list(methods)
    ks = sorted({int(k) for k in ks})
    if sample_ids is None:
        wanted = attributions[attributions["method"].isin(set(methods))]
        cover = wanted.groupby("sample_id")["method"].nunique()
        sample_ids = sorted(str(s) for s in cover.index[cover == len(methods)])
    ids = [str(s) for s in sample_ids]
    if len(methods) < 2 or not ids or not ks:
        return []
    table = word_table(attributions, ids, methods, where)
    same = set(combinations(methods, 2))
    for sid in ids:
        ranks = table[sid]["ranks"]
        for a, b in list(same):
            ra, rb = ranks[a], ranks[b]
            if any(not np.array_equal(np.sort(ra[:k]), np.sort(rb[:k])) for k in ks):
                same.discard((a, b))
        if not same:
            break
    return [p for p in combinations(methods, 2) if p in same]


def methods_to_drop(
    pairs: Sequence[tuple[str, str]], methods: Sequence[str], keep: Collection[str] = ()
) -> list[str]:
    """The methods that make no task of their own: of each group of identical methods
    (``pairs``, from :func:`identical_methods` over ``methods``), every one but the first
    in ``methods``' order, or but the one in ``keep`` (the study's baseline) if the group
    has it. In ``methods``' order.

    >>> methods_to_drop([("ixg", "deeplift")], ["random", "ixg", "deeplift"])
    ['deeplift']
    >>> methods_to_drop([("ixg", "random")], ["ixg", "random"], keep={"random"})
    ['ixg']
    """
    group = {m: m for m in methods}

    def root(m: str) -> str:
        while group[m] != m:
            m = group[m]
        return m

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            group[rb] = ra
    members: dict[str, list[str]] = {}
    for m in methods:
        members.setdefault(root(m), []).append(m)
    dropped: set[str] = set()
    for names in members.values():
        kept = next((m for m in names if m in keep), names[0])
        dropped.update(m for m in names if m != kept)
    return [m for m in methods if m in dropped]
