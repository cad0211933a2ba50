"""Human scores next to automated metrics, method by method (docs/metrics.md#comparison).

One row per method with the human score s_j and every automated metric, each with its
rank (1 = best, ties share the best rank, as in docs/scores.md#ranks), and the Spearman
and Kendall correlation of every metric's method ranking with the human ranking, with
bootstrap CIs over samples; :func:`compare` does all of it for one dataset, the
instance-level analysis (:mod:`saleval.analysis.instance_level`) included.

Metric direction matters: for sufficiency, switching point and AOPC over the least
important words *lower* is better. The columns and their directions are
:mod:`saleval.analysis.metric_columns`'s; a metric of the table that nobody registered is
named in the report's notes and a warning, not dropped silently. The Markdown report and
the plot are :mod:`saleval.analysis.comparison_report`'s.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from saleval.analysis.instance_level import instance_level
from saleval.analysis.metric_columns import (
    ComparisonError,
    higher_is_better,
    rank_methods,
    select_columns,
    unplaced_metrics,
    wide_metrics,
)
from saleval.metrics import registry as metrics_registry

log = logging.getLogger(__name__)


HumanScoreFn = Callable[[pd.DataFrame], pd.Series]


# ---------------------------------------------------------------------------------
# Method level
# ---------------------------------------------------------------------------------


def comparison_table(
    human: pd.Series, automated: pd.DataFrame, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """``method, human_score, human_rank, <metric>, <metric>_rank, ...`` for common methods.

    ``human`` is s_j indexed by method; ``automated`` one column per metric, indexed
    by method. Ranks are recomputed among the methods both sides have.
    """
    columns = list(columns if columns is not None else automated.columns)
    common = [m for m in human.index if m in automated.index]
    if len(common) < 2:
        raise ComparisonError(
            f"human methods {sorted(human.index)} and automated methods "
            f"{sorted(automated.index)} share {len(common)} method(s); nothing to compare"
        )
    out = pd.DataFrame({"method": common, "human_score": human.loc[common].to_numpy(float)})
    out["human_rank"] = rank_methods(out["human_score"], True).to_numpy()
    for col in columns:
        vals = automated.loc[common, col].to_numpy(float)
        out[col] = vals
        out[f"{col}_rank"] = rank_methods(pd.Series(vals), higher_is_better(col)).to_numpy()
    return out.sort_values(["human_rank", "method"]).reset_index(drop=True)


def rank_agreement(
    human: Sequence[float], metric: Sequence[float], higher_better: bool
) -> dict[str, float]:
    r"""Spearman's ρ and Kendall's τ_b between the human and a metric's method ranking.

    The metric is oriented so that larger = better before ranking, hence ρ = 1 when
    both rank the methods identically, whatever the metric's direction. τ_b handles
    tied ranks. Spearman (1904); Kendall (1945) via ``scipy.stats``.
    """
    h = np.asarray(human, dtype=float)
    m = np.asarray(metric, dtype=float) * (1.0 if higher_better else -1.0)
    ok = ~(np.isnan(h) | np.isnan(m))
    h, m = h[ok], m[ok]
    nan = float("nan")
    if len(h) < 3 or np.ptp(h) == 0 or np.ptp(m) == 0:
        return {"spearman": nan, "spearman_p": nan, "kendall": nan, "kendall_p": nan, "n": len(h)}
    rho = stats.spearmanr(h, m)
    tau = stats.kendalltau(h, m)
    return {
        "spearman": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "kendall": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
        "n": len(h),
    }


def metric_cube(
    per_example: pd.DataFrame, columns: Sequence[str], methods: Sequence[str]
) -> tuple[list[str], np.ndarray]:
    """Per-example values as (sample ids, array of shape (samples, methods, columns))."""
    w = wide_metrics(per_example, columns, ["sample_id", "method"])
    samples = sorted({str(s) for s in w.index.get_level_values(0)})
    full = pd.MultiIndex.from_product([samples, list(methods)], names=["sample_id", "method"])
    cube = w.reindex(full).to_numpy(float).reshape(len(samples), len(methods), len(columns))
    return samples, cube


def bootstrap_rank_agreement(
    human_A: np.ndarray,
    human_samples: Sequence[str],
    human_score_fn: HumanScoreFn,
    metric_values: np.ndarray,
    metric_samples: Sequence[str],
    columns: Sequence[str],
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Percentile bootstrap CIs of the method-level ρ and τ, resampling samples.

    ``human_A`` is A[i, j, k] (samples, methods, ks) and ``metric_values`` the
    per-example metrics (samples, methods, columns), both over the same methods in
    the same order. Each replicate draws samples with replacement, recomputes the
    human scores (``human_score_fn``: (..., N, J, K) → (..., J)) and the metric means,
    and correlates the two rankings. When both sides hold the same samples the draw
    is shared (paired); otherwise each side is drawn from its own samples. Efron &
    Tibshirani (1993), *An Introduction to the Bootstrap*, ch. 13.
    """
    rng = np.random.default_rng(seed)
    h_order = np.argsort(np.asarray(human_samples, dtype=str))
    m_order = np.argsort(np.asarray(metric_samples, dtype=str))
    paired = sorted(map(str, human_samples)) == sorted(map(str, metric_samples))
    HA, MV = human_A[h_order], metric_values[m_order]
    signs = np.array([1.0 if higher_is_better(c) else -1.0 for c in columns])
    rho = np.full((n_boot, len(columns)), np.nan)
    tau = np.full((n_boot, len(columns)), np.nan)
    for b in range(n_boot):
        h_idx = rng.integers(0, len(HA), len(HA))
        m_idx = h_idx if paired else rng.integers(0, len(MV), len(MV))
        human = np.asarray(human_score_fn(HA[h_idx]), dtype=float)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(MV[m_idx], axis=0) * signs  # methods × columns
        for c in range(len(columns)):
            m = means[:, c]
            ok = ~(np.isnan(human) | np.isnan(m))
            if ok.sum() >= 3 and np.ptp(human[ok]) > 0 and np.ptp(m[ok]) > 0:
                rho[b, c] = stats.spearmanr(human[ok], m[ok]).statistic
                tau[b, c] = stats.kendalltau(human[ok], m[ok]).statistic
    alpha = (1 - level) / 2
    rows = []
    for c, col in enumerate(columns):
        for name, arr in (("spearman", rho[:, c]), ("kendall", tau[:, c])):
            ok = arr[~np.isnan(arr)]
            lo, hi = np.quantile(ok, [alpha, 1 - alpha]) if len(ok) else (np.nan, np.nan)
            rows.append(
                {"metric": col, "statistic": name, "ci_low": lo, "ci_high": hi, "paired": paired}
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------
# Everything for one dataset
# ---------------------------------------------------------------------------------


@dataclass
class ComparisonResult:
    comparison: pd.DataFrame  # COMPARISON
    correlations: pd.DataFrame  # CORRELATIONS
    instance: pd.DataFrame | None  # one row per explanation (instance level), if any
    ols_text: str
    columns: list[str]
    notes: list[str] = field(default_factory=list)


def method_correlations(table: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    """Spearman and Kendall between the human score and each metric over methods, the
    metric read in its registered direction (docs/metrics.md#comparison)."""
    rows: list[dict[str, Any]] = []
    for col in cols:
        r = rank_agreement(table["human_score"], table[col], higher_is_better(col))
        for stat in ("spearman", "kendall"):
            rows.append(
                {
                    "metric": col,
                    "level": "method",
                    "statistic": stat,
                    "value": r[stat],
                    "p_value": r[f"{stat}_p"],
                    "n": r["n"],
                    "higher_is_better": higher_is_better(col),
                }
            )
    return pd.DataFrame(rows)


def compare(
    human: pd.Series,
    metrics: pd.DataFrame,
    per_example: pd.DataFrame,
    aggregated: pd.DataFrame | None = None,
    human_A: np.ndarray | None = None,
    human_samples: Sequence[str] | None = None,
    human_methods: Sequence[str] | None = None,
    human_score_fn: HumanScoreFn | None = None,
    predictions: pd.DataFrame | None = None,
    columns: str | Sequence[str] = "summary",
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> ComparisonResult:
    """The side-by-side table and every correlation of docs/metrics.md#comparison for one dataset.

    ``human`` is s_j by method (scores.csv). With A[i, j, k] (``human_A`` over
    ``human_samples`` × ``human_methods`` × k, and ``human_score_fn``) the
    method-level correlations get bootstrap CIs; with ``aggregated`` and
    ``predictions`` (sample_id, confidence, correct) and samples shared with the
    automated side, the instance-level analysis runs.
    """
    cols = select_columns(metrics, columns)
    if not cols:
        raise ComparisonError("the metrics table holds no metric the comparison knows")
    auto = wide_metrics(metrics, cols, ["method"])
    table = comparison_table(human, auto, cols)
    methods = list(table["method"])
    notes: list[str] = []
    outputs = metrics_registry.outputs()
    unknown = [m for m in unplaced_metrics(metrics) if m not in outputs]
    if unknown:
        msg = (
            f"Not compared: metric(s) {', '.join(unknown)} of the metrics table have no "
            "registered direction (register them with saleval.metrics.registry.register_metric)."
        )
        log.warning(msg)
        notes.append(msg)
    corr = method_correlations(table, cols)
    if human_A is not None and human_score_fn is not None and n_boot > 0:
        assert human_samples is not None and human_methods is not None
        pos = [list(human_methods).index(m) for m in methods]
        m_samples, m_values = metric_cube(per_example, cols, methods)
        ci = bootstrap_rank_agreement(
            human_A[:, pos],
            list(human_samples),
            human_score_fn,
            m_values,
            m_samples,
            cols,
            n_boot=n_boot,
            level=level,
            seed=seed,
        )
        paired = bool(ci["paired"].all()) if len(ci) else False
        corr = corr.merge(ci.drop(columns="paired"), on=["metric", "statistic"], how="left")
        notes.append(
            f"Method-level CIs: {level:.0%} percentile bootstrap over samples ({n_boot} "
            f"replicates, {'paired: human and metrics on the same samples' if paired else 'human and metric samples drawn independently'})."
        )
    else:
        notes.append("Method-level correlations without CIs (no per-sample crowd results).")
    instance, ols_text = None, ""
    if aggregated is not None and predictions is not None:
        instance, inst, ols_text, note = instance_level(
            aggregated, per_example, predictions, cols, n_boot, level, seed
        )
        if inst is not None:
            corr = pd.concat([corr, inst], ignore_index=True)
        notes.append(note)
    return ComparisonResult(table, corr, instance, ols_text, cols, notes)
