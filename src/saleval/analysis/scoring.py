r"""Scores and analyses of crowd results (docs/scores.md), from A[i, j, k] alone.

Every formula lives in one function here, whatever produced A (our importer,
another aggregator, or the published lu2024 file):

* :func:`accuracy` — p_jk = (1/N) Σ_i A_ijk;
* :func:`k_weights` — w_k = (Σ_j Σ_k p_jk) / (K² Σ_j p_jk);
* :func:`method_scores` — s_j = Σ_k w_k p_jk;
* :func:`rank_desc` — ranks per column, ties share the best rank;
* :func:`bootstrap_ci` — percentile CIs over resampled samples;
* :func:`paired_test` — sign-flip permutation test of each method against a baseline;
* :func:`flip_analysis` — flips, aids and the per-sample flip histogram;
* :func:`recognised_counts` — misclassified-study count tables;
* :func:`outcome_breakdown` — forward-prediction accuracy per TP/TN/FP/FN.

A is held as an (N, J, K) float array with NaN where a cell is missing (a task
rejected at import); means are over the samples present, and flips use the
samples complete at every k.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from saleval.attribution import paper_methods
from saleval.pipeline import tables

log = logging.getLogger(__name__)

BASELINE = "random"


def order_methods(methods: Iterable[str]) -> list[str]:
    """Methods in the paper's row order (each method's ``paper_order``, declared where it
    registers: :func:`saleval.attribution.base.register`), the others alphabetically after
    them, the baseline last.

    >>> order_methods(["random", "zeta", "lime", "all_attention", "alpha"])
    ['all_attention', 'lime', 'alpha', 'zeta', 'random']
    """
    paper = [m for m in paper_methods() if m != BASELINE]
    ms = sorted(set(methods))
    known = [m for m in paper if m in ms]
    rest = [m for m in ms if m not in paper and m != BASELINE]
    return known + rest + ([BASELINE] if BASELINE in ms else [])


# ---------------------------------------------------------------------------------
# A as an array
# ---------------------------------------------------------------------------------


@dataclass
class Cube:
    """A[i, j, k] as an (N, J, K) array with its axis labels (k ascending)."""

    A: np.ndarray
    samples: list[str]
    methods: list[str]
    ks: list[int]

    @classmethod
    def from_aggregated(cls, aggregated: pd.DataFrame) -> Cube:
        df = tables.AGGREGATED.validate(aggregated, where="scoring")
        if df.empty:
            raise ValueError("aggregated table is empty: nothing to score")
        samples = sorted(df["sample_id"].unique())
        methods = order_methods(df["method"].unique())
        ks = sorted(int(k) for k in df["k"].unique())
        idx = pd.MultiIndex.from_product([samples, methods, ks], names=["sample_id", "method", "k"])
        a = df.set_index(["sample_id", "method", "k"])["correct"].astype("float64").reindex(idx)
        return cls(a.to_numpy().reshape(len(samples), len(methods), len(ks)), samples, methods, ks)

    @property
    def n_missing(self) -> int:
        return int(np.isnan(self.A).sum())


# ---------------------------------------------------------------------------------
# The formulas of docs/scores.md (each in exactly one function; batch dimensions lead)
# ---------------------------------------------------------------------------------


def accuracy(A: np.ndarray) -> np.ndarray:
    r"""Accuracy :math:`p_{jk} = \frac{1}{N}\sum_i A_{ijk}` (docs/scores.md), as a fraction.

    ``A`` is (..., N, J, K); missing cells (NaN) are left out of N. Returns (..., J, K).

    >>> accuracy(np.array([[[1.0, 0.0]], [[1.0, 1.0]]])).tolist()
    [[1.0, 0.5]]
    """
    with np.errstate(invalid="ignore"), _quiet():
        return np.nanmean(A, axis=-3)


def k_weights(p: np.ndarray) -> np.ndarray:
    r"""Difficulty weights :math:`w_k = \frac{\sum_j\sum_k p_{jk}}{K^2 \sum_j p_{jk}}`
    (docs/scores.md#method-score).

    A k whose mean accuracy over methods is low (small k: few words shown) weighs
    more. With equal column sums every w_k = 1/K, so s_j is the plain mean over k.
    A column where every method scored 0 carries no information and gets w_k = 0.
    ``p`` is (..., J, K); returns (..., K).

    >>> k_weights(np.array([[0.2, 0.6], [0.2, 0.6]])).round(4).tolist()
    [1.0, 0.3333]
    """
    K = p.shape[-1]
    col = p.sum(axis=-2)
    total = p.sum(axis=(-2, -1))[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = total / (K**2 * col)
    return np.where(col > 0, w, 0.0)


def method_scores(p: np.ndarray) -> np.ndarray:
    r"""Method score :math:`s_j = \sum_k w_k p_{jk}` (docs/scores.md#method-score), a fraction;
    (..., J, K) → (..., J)."""
    return (k_weights(p)[..., None, :] * p).sum(axis=-1)


def rank_desc(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Ranks, highest first, along ``axis``; ties share the best rank (1, 1, 3).

    Values are compared at 9 decimals so that equal accuracies reached by different
    float paths tie. NaN ranks last.

    >>> rank_desc(np.array([0.5, 0.7, 0.5, 0.1])).tolist()
    [2, 1, 2, 4]
    """
    v = np.round(np.asarray(values, dtype="float64"), 9)
    v = np.where(np.isnan(v), -np.inf, v)
    return stats.rankdata(-v, method="min", axis=axis).astype("int64")


def bootstrap_ci(
    A: np.ndarray, n: int = 1000, level: float = 0.95, seed: int = 0, chunk: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap over samples of p_jk and s_j (weights recomputed each time).

    Returns (p_ci, s_ci) of shapes (2, J, K) and (2, J): lower and upper bounds.
    """
    rng = np.random.default_rng(seed)
    N = A.shape[0]
    ps, ss = [], []
    for start in range(0, n, chunk):
        idx = rng.integers(0, N, size=(min(chunk, n - start), N))
        p = accuracy(A[idx])
        ps.append(p)
        ss.append(method_scores(np.nan_to_num(p)))
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    with _quiet():
        return np.nanpercentile(np.concatenate(ps), q, axis=0), np.percentile(
            np.concatenate(ss), q, axis=0
        )


def sample_contributions(A: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x_ij = Σ_k w_k A_ijk: sample i's share of s_j (mean over i of x_ij is s_j)."""
    return (A * w[None, None, :]).sum(axis=-1) + np.where(np.isnan(A).any(-1), np.nan, 0.0)


def paired_test(A: np.ndarray, baseline: int, n_resamples: int = 9999, seed: int = 0) -> np.ndarray:
    """Two-sided paired permutation test of each method's score against the baseline's.

    Per sample, x_ij = Σ_k w_k A_ijk (w from the full data), so mean_i x_ij = s_j.
    Under H0 (method and baseline interchangeable on each sample) the sign of each
    paired difference is random; scipy's ``permutation_test`` with
    ``permutation_type='samples'`` flips them. Returns p-values (J,); NaN for the
    baseline itself. Robust to the many ties of 0/1 data, unlike a t-test.
    """
    w = k_weights(np.nan_to_num(accuracy(A)))
    x = sample_contributions(A, w)
    out = np.full(A.shape[1], np.nan)
    for j in range(A.shape[1]):
        if j == baseline:
            continue
        ok = ~np.isnan(x[:, j]) & ~np.isnan(x[:, baseline])
        a, b = x[ok, j], x[ok, baseline]
        if ok.sum() < 2:
            continue
        if np.allclose(a, b):
            out[j] = 1.0
            continue
        res = stats.permutation_test(
            (a, b),
            lambda u, v, axis: np.mean(u - v, axis=axis),
            permutation_type="samples",
            vectorized=True,
            n_resamples=n_resamples,
            alternative="two-sided",
            random_state=seed,
        )
        out[j] = float(res.pvalue)
    return out


def flip_analysis(A: np.ndarray) -> dict[str, np.ndarray]:
    """Flips and aids (docs/scores.md#flips) per sample and method; k ascending along the last axis.

    Sample i *flips* under method j when some k1 < k2 has A_ij,k1 = 1 and A_ij,k2 = 0
    (more words shown, but no longer recognised). Per method: ``flips`` = number of
    flipped samples, ``always`` = recognised at every k, ``aids`` = N − flips − always
    (the formula of docs/scores.md: non-flipped samples not recognised at every k — this includes
    ``never``, the samples recognised at no k, reported separately). Samples with a
    missing k for a method are left out of that method's N.
    """
    complete = ~np.isnan(A).any(axis=-1)
    a = np.nan_to_num(A).astype(bool)
    seen_before = np.maximum.accumulate(a, axis=-1)[..., :-1]
    flipped = (seen_before & ~a[..., 1:]).any(axis=-1) & complete
    always = a.all(axis=-1) & complete
    never = ~a.any(axis=-1) & complete
    n = complete.sum(axis=0)
    n_flips = flipped.sum(axis=0)
    n_always = always.sum(axis=0)
    return {
        "flipped": flipped,
        "n": n,
        "flips": n_flips,
        "always": n_always,
        "never": never.sum(axis=0),
        "aids": n - n_flips - n_always,
    }


def flip_histogram(flipped: np.ndarray, n_methods: int | None = None) -> pd.DataFrame:
    """Over samples: how many methods flip each sample (0..J), as ``n_methods, n_samples``."""
    J = flipped.shape[1] if n_methods is None else n_methods
    counts = np.bincount(flipped.sum(axis=1), minlength=J + 1)
    return pd.DataFrame({"n_methods": np.arange(J + 1), "n_samples": counts[: J + 1]})


def recognised_counts(cube: Cube) -> pd.DataFrame:
    """Counts of samples recognised per method and k (misclassified-study tables)."""
    rec = np.nansum(cube.A, axis=0).astype("int64")
    n = (~np.isnan(cube.A)).sum(axis=0)
    return pd.DataFrame(
        [
            {"method": m, "k": k, "recognised": int(rec[j, c]), "n": int(n[j, c])}
            for j, m in enumerate(cube.methods)
            for c, k in enumerate(cube.ks)
        ]
    )


def prediction_outcome(gold: pd.Series, pred: pd.Series, positive: int, n_labels: int) -> pd.Series:
    """TP/TN/FP/FN of the model's prediction (binary, ``positive`` = the positive class).

    With more than two labels there is no single negative class, so the outcome
    is ``correct`` or ``wrong``.
    """
    if n_labels > 2:
        return pd.Series(np.where(gold == pred, "correct", "wrong"), index=gold.index)
    pos_p, pos_g = pred == positive, gold == positive
    return pd.Series(
        np.select(
            [pos_p & pos_g, ~pos_p & ~pos_g, pos_p & ~pos_g], ["TP", "TN", "FP"], default="FN"
        ),
        index=gold.index,
    )


def outcome_breakdown(
    aggregated: pd.DataFrame, positive: int = 1, n_labels: int = 2
) -> pd.DataFrame:
    """Forward prediction (docs/scores.md): accuracy (percent) per method, k and model outcome.

    Needs ``gold_label`` and ``pred`` in the aggregated table; rows with
    ``k = "all"`` pool the k-grid.
    """
    for c in ("gold_label", "pred"):
        if c not in aggregated:
            raise ValueError(f"forward-prediction breakdown needs column {c!r} in aggregated")
    df = aggregated.copy()
    df["outcome"] = prediction_outcome(df["gold_label"], df["pred"], positive, n_labels)
    per_k = df.groupby(["method", "k", "outcome"])["correct"].agg(["size", "mean"]).reset_index()
    pooled = df.groupby(["method", "outcome"])["correct"].agg(["size", "mean"]).reset_index()
    pooled["k"] = "all"
    per_k["k"] = per_k["k"].astype(str)
    out = pd.concat([per_k, pooled], ignore_index=True).rename(
        columns={"size": "n", "mean": "accuracy"}
    )
    out["accuracy"] *= 100
    order = {m: i for i, m in enumerate(order_methods(out["method"]))}
    return out.sort_values(
        ["method", "k", "outcome"], key=lambda s: s.map(order) if s.name == "method" else s
    )[["method", "k", "outcome", "n", "accuracy"]].reset_index(drop=True)


# ---------------------------------------------------------------------------------
# Everything at once
# ---------------------------------------------------------------------------------


@dataclass
class ScoreResult:
    """The score stage's tables: ACCURACY, SCORES, FLIPS (+ histogram, weights)."""

    accuracy: pd.DataFrame
    scores: pd.DataFrame
    flips: pd.DataFrame
    histogram: pd.DataFrame
    weights: dict[int, float]
    cube: Cube
    extra: dict[str, pd.DataFrame] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def score(
    aggregated: pd.DataFrame,
    baseline: str = BASELINE,
    n_bootstrap: int = 1000,
    level: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    histogram_exclude: Sequence[str] = (),
) -> ScoreResult:
    """p_jk, s_j, ranks, CIs, the paired test and flips from an AGGREGATED table."""
    from statsmodels.stats.multitest import multipletests

    cube = Cube.from_aggregated(aggregated)
    A = cube.A
    p = accuracy(A)
    w = k_weights(np.nan_to_num(p))
    s = method_scores(np.nan_to_num(p))
    p_rank = rank_desc(p, axis=0)
    s_rank = rank_desc(s)
    p_ci, s_ci = bootstrap_ci(A, n=n_bootstrap, level=level, seed=seed)
    n_cell = (~np.isnan(A)).sum(axis=0)
    acc = pd.DataFrame(
        [
            {
                "method": m,
                "k": k,
                "accuracy": 100 * p[j, c],
                "ci_low": 100 * p_ci[0, j, c],
                "ci_high": 100 * p_ci[1, j, c],
                "rank": int(p_rank[j, c]),
                "n": int(n_cell[j, c]),
            }
            for j, m in enumerate(cube.methods)
            for c, k in enumerate(cube.ks)
        ]
    )
    scores = pd.DataFrame(
        {
            "method": cube.methods,
            "score": 100 * s,
            "rank": s_rank,
            "ci_low": 100 * s_ci[0],
            "ci_high": 100 * s_ci[1],
        }
    )
    if baseline in cube.methods:
        pv = paired_test(A, cube.methods.index(baseline), n_resamples=n_resamples, seed=seed)
        scores["p_vs_random"] = pv
        ok = ~np.isnan(pv)
        holm = np.full_like(pv, np.nan)
        if ok.any():
            holm[ok] = multipletests(pv[ok], method="holm")[1]
        scores["p_vs_random_holm"] = holm
    else:
        log.warning("no %r method in the results: no paired test", baseline)
    fl = flip_analysis(A)
    flips = pd.DataFrame(
        {
            "method": cube.methods,
            "flips": fl["flips"],
            "aids": fl["aids"],
            "always": fl["always"],
            "never": fl["never"],
        }
    )
    keep = [j for j, m in enumerate(cube.methods) if m not in set(histogram_exclude)]
    hist = flip_histogram(fl["flipped"][:, keep])
    return ScoreResult(
        accuracy=tables.ACCURACY.validate(acc, where="score"),
        scores=tables.SCORES.validate(scores, where="score"),
        flips=tables.FLIPS.validate(flips, where="score"),
        histogram=hist,
        weights={k: float(w[c]) for c, k in enumerate(cube.ks)},
        cube=cube,
        info={
            "n_samples": len(cube.samples),
            "methods": cube.methods,
            "ks": cube.ks,
            "missing_cells": cube.n_missing,
            "bootstrap": {"n": n_bootstrap, "level": level},
            "paired_test": {"baseline": baseline, "n_resamples": n_resamples},
            "histogram_methods": [cube.methods[j] for j in keep],
        },
    )


class _quiet:
    """Silence numpy's 'mean of empty slice' warnings where NaN is the intended answer."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._w.__exit__(exc_type, exc, tb)
