"""Does a saliency method find the planted shortcut? (docs/shortcut.md; Bastings et al. 2022, §4).

A *ranking* is a sequence of word indices, most important first: here
:func:`saleval.words.rank_words` with ``ties="against", against=<ground truth>``, so a
tie earns a method no credit. Ground truth is the set of word indices where the
shortcut tokens were planted. Both metrics are averaged over examples; each is one
pure function over rankings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "Ranking",
    "mean_rank",
    "mean_rank_interval",
    "precision_at_k",
    "precision_interval",
]

#: word indices, most salient first: a list, or the array :func:`saleval.words.rank_words` gives
Ranking = Sequence[int] | np.ndarray


def _check(ranking: Ranking, truth: Sequence[int], i: int) -> tuple[list[int], set[int]]:
    r, gt = [int(x) for x in ranking], {int(x) for x in truth}
    if not gt:
        raise ValueError(f"example {i}: empty ground truth")
    if len(set(r)) != len(r):
        raise ValueError(f"example {i}: ranking repeats a word: {r}")
    missing = gt - set(r)
    if missing:
        raise ValueError(f"example {i}: ground-truth words {sorted(missing)} not in the ranking")
    return r, gt


def precision_at_k(
    rankings: Sequence[Ranking], ground_truth: Sequence[Sequence[int]], k: int | None = None
) -> float:
    r"""Mean precision@k of the shortcut (docs/shortcut.md; Bastings et al. 2022, eq. 1):

    .. math:: P@k = \frac{1}{N} \sum_{i=1}^{N} \frac{|\mathrm{top}_k(r_i) \cap G_i|}{k}

    with :math:`k = |G_i|` by default (1 for ``st``, 2 for ``tic``/``op``), so 1.0
    means the method put exactly the shortcut tokens on top of every example.

    >>> precision_at_k([[3, 1, 0, 2], [0, 2, 1]], [[3, 0], [1, 2]])
    0.5
    """
    if len(rankings) != len(ground_truth):
        raise ValueError(f"{len(rankings)} rankings for {len(ground_truth)} ground truths")
    if not rankings:
        raise ValueError("no examples")
    values = []
    for i, (ranking, truth) in enumerate(zip(rankings, ground_truth)):
        r, gt = _check(ranking, truth, i)
        kk = len(gt) if k is None else int(k)
        if kk < 1:
            raise ValueError(f"k must be ≥ 1, got {kk}")
        values.append(len(set(r[:kk]) & gt) / kk)
    return float(np.mean(values))


def mean_rank(rankings: Sequence[Ranking], ground_truth: Sequence[Sequence[int]]) -> float:
    r"""Mean rank of the shortcut (docs/shortcut.md; Bastings et al. 2022): per example the
    smallest :math:`r` such that the top-:math:`r` words contain every ground-truth word,

    .. math:: \mathrm{MR} = \frac{1}{N} \sum_{i=1}^{N} \min\{r : G_i \subseteq \mathrm{top}_r(r_i)\}
                         = \frac{1}{N} \sum_{i=1}^{N} \max_{g \in G_i} \mathrm{pos}_i(g)

    (1-based positions). The best possible value is :math:`|G_i|` (1 for ``st``, 2 for
    ``tic``/``op``); lower is better.

    >>> mean_rank([[3, 1, 0, 2], [0, 2, 1]], [[3, 0], [1, 2]])
    3.0
    """
    if len(rankings) != len(ground_truth):
        raise ValueError(f"{len(rankings)} rankings for {len(ground_truth)} ground truths")
    if not rankings:
        raise ValueError("no examples")
    values = []
    for i, (ranking, truth) in enumerate(zip(rankings, ground_truth)):
        r, gt = _check(ranking, truth, i)
        values.append(max(r.index(g) for g in gt) + 1)
    return float(np.mean(values))


def precision_interval(
    per_example: Sequence[float], k: int, level: float = 0.95
) -> tuple[float, float]:
    """Wilson score interval of precision@k (docs/shortcut.md#uncertainty).

    The mean of per-example precisions at a fixed k is hits / (n·k), a proportion of
    the n·k top slots, so the interval is Wilson's over n·k trials (exact in kind for
    ``st``, k = 1; for k = 2 the two slots of one example are not independent, so it
    is somewhat too narrow there). Wilson stays inside [0, 1] and is not degenerate at
    0 or 1, which matters at the small n of the CPU budget (4 of 10 → 0.17–0.69).

    >>> [round(x, 2) for x in precision_interval([1, 0, 1, 0, 0, 0, 1, 0, 0, 1], k=1)]
    [0.17, 0.69]
    """
    from scipy.stats import binomtest

    n = len(per_example)
    if n == 0:
        raise ValueError("no examples")
    trials = n * int(k)
    hits = round(float(np.sum(per_example)) * int(k))
    ci = binomtest(hits, trials).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def mean_rank_interval(
    ranks: Sequence[float], level: float = 0.95, best: int = 1
) -> tuple[float, float]:
    """Student-t interval of the mean rank (docs/shortcut.md#uncertainty): mean ± t·s/√n,
    cut at ``best`` (k, the best possible rank: a mean rank cannot go below it).

    Ranks are small positive integers with a long right tail; t is the plain choice
    that needs no resampling seed and, unlike a bootstrap over 10 examples, does not
    shrink to a point when most ranks coincide. All ranks equal → that rank, both ends;
    one example → NaN (no spread to estimate).

    >>> [round(x, 2) for x in mean_rank_interval([2, 2, 3, 5, 3], best=2)]
    [2.0, 4.52]
    """
    from scipy.stats import t

    r = np.asarray(ranks, dtype=np.float64)
    if r.size == 0:
        raise ValueError("no examples")
    mean = float(r.mean())
    if r.size == 1:
        return float("nan"), float("nan")
    sd = float(r.std(ddof=1))
    if sd == 0.0:
        return mean, mean
    half = float(t.ppf(0.5 + level / 2, r.size - 1)) * sd / np.sqrt(r.size)
    return max(mean - half, float(best)), float(mean + half)
