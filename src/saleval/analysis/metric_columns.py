"""The columns a comparison ranks: one (metric, k) of ``metrics.csv`` each, read in its
registered direction (docs/metrics.md#comparison).

Every direction comes from the metric's registration (:mod:`saleval.metrics.registry`,
read at call time, so a metric registered by a plugin is ranked like a built-in one); a
metric of the table that nobody registered is named, not dropped silently. Rank 1 is
best on every column, so a positive correlation of two rankings always means agreement.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

import saleval.metrics.faithfulness
import saleval.metrics.plausibility  # noqa: F401  (registers the plausibility metrics)
from saleval.errors import UserError
from saleval.metrics import registry as metrics_registry


def metric_directions() -> dict[str, bool]:
    """Direction (higher is better?) of every ranked metric name the registry knows.

    Read from :mod:`saleval.metrics.registry` at call time, so a metric registered with
    :func:`saleval.metrics.registry.register_metric` is compared like a built-in one;
    diagnostics registered without a direction (``no_switch``) are not ranked.
    """
    return {m: d for m, d in metrics_registry.outputs().items() if d is not None}


class ComparisonError(UserError, ValueError):
    """Human and automated results cannot be compared (no common methods, ...)."""


def column_name(metric: str, k: str) -> str:
    """``comprehensiveness`` for a grid average, ``log_odds_drop@0.2`` for one k."""
    return metric if k in ("", None) or pd.isna(k) else f"{metric}@{k}"


def split_column(column: str) -> tuple[str, str]:
    metric, _, k = column.partition("@")
    return metric, k


def higher_is_better(column: str) -> bool:
    """The registered direction of a column's metric; unknown metrics fail naming it."""
    metric = split_column(column)[0]
    directions = metric_directions()
    if metric not in directions:
        raise ComparisonError(
            f"metric {metric!r} has no registered direction (saleval.metrics.registry); "
            f"known: {sorted(directions)}"
        )
    return directions[metric]


def unplaced_metrics(metrics: pd.DataFrame) -> list[str]:
    """Metrics of a table the comparison cannot rank: not registered, or without a direction."""
    directions = metric_directions()
    return [m for m in dict.fromkeys(metrics["metric"].astype(str)) if m not in directions]


def select_columns(metrics: pd.DataFrame, which: str | Sequence[str] = "summary") -> list[str]:
    """Which (metric, k) of a metrics table to compare.

    ``summary``: every known metric's grid average (k empty), or its only k
    (``log_odds_drop@0.2``); ``all``: every known (metric, k); or a list of names.
    """
    k = metrics["k"].fillna("").astype(str)
    pairs = list(dict.fromkeys(zip(metrics["metric"].astype(str), k)))
    directions = metric_directions()
    known = [(m, kk) for m, kk in pairs if m in directions]
    available = [column_name(m, kk) for m, kk in known]
    if isinstance(which, str) and which == "all":
        return available
    if isinstance(which, str) and which == "summary":
        out = []
        for m in dict.fromkeys(m for m, _ in known):
            ks = [kk for mm, kk in known if mm == m]
            if "" in ks:
                out.append(m)
            elif len(ks) == 1:
                out.append(column_name(m, ks[0]))
        return out
    if isinstance(which, str):
        raise ComparisonError(f"compare.columns must be 'summary', 'all' or a list; got {which!r}")
    missing = [c for c in which if c not in available]
    if missing:
        raise ComparisonError(
            f"compare.columns {missing} not in the metrics table; has {available}"
        )
    return list(which)


def wide_metrics(long: pd.DataFrame, columns: Sequence[str], index: Sequence[str]) -> pd.DataFrame:
    """Long ``metric, k, value`` rows → one column per (metric, k) name."""
    df = long.assign(
        column=[column_name(m, k) for m, k in zip(long["metric"], long["k"].fillna(""))]
    )
    df = df[df["column"].isin(list(columns))]
    out = df.pivot_table(index=list(index), columns="column", values="value", aggfunc="first")
    return out.reindex(columns=list(columns))


def rank_methods(values: pd.Series, higher_better: bool = True) -> pd.Series:
    """Rank 1 = best; ties (at 9 decimals, as in saleval-score) share the best rank; NaN unranked."""
    r = values.astype(float).round(9).rank(ascending=not higher_better, method="min")
    return r.astype("Int64")
