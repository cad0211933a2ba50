"""Human scores next to automated metrics (docs/metrics.md#comparison).

Method level: one row per method with the human score s_j and every automated
metric, each with its rank (1 = best, ties share the best rank, as in docs/scores.md#ranks),
and the Spearman and Kendall correlation of every metric's method ranking with the
human ranking, with bootstrap CIs over samples. Instance level: per explanation
(sample × method), the crowd accuracy (mean over k of A_ijk) against each metric —
a Spearman correlation and an OLS model of crowd accuracy on the metric, the
classifier's confidence and whether its prediction was right (Nguyen 2018,
"Comparing Automatic and Human Evaluation of Local Explanations for Text
Classification", NAACL, https://aclanthology.org/N18-1097).

Metric direction matters: for sufficiency, switching point and AOPC over the least
important words *lower* is better. Every direction comes from the metric's registration
(:mod:`saleval.metrics.registry`); a metric of the table that nobody registered is named
in the report's notes and a warning, not dropped silently. Method-level correlations compare *rankings*
(rank 1 = best on both sides), so a positive correlation always means agreement.
Instance-level statistics use the raw metric values; ``higher_is_better`` says how
to read their sign.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

import saleval.metrics.faithfulness
import saleval.metrics.plausibility  # noqa: F401  (registers the plausibility metrics)
from saleval.errors import UserError
from saleval.metrics import registry as metrics_registry

log = logging.getLogger(__name__)


def metric_directions() -> dict[str, bool]:
    """Direction (higher is better?) of every ranked metric name the registry knows.

    Read from :mod:`saleval.metrics.registry` at call time, so a metric registered with
    :func:`saleval.metrics.registry.register_metric` is compared like a built-in one;
    diagnostics registered without a direction (``no_switch``) are not ranked.
    """
    return {m: d for m, d in metrics_registry.outputs().items() if d is not None}


HumanScoreFn = Callable[[pd.DataFrame], pd.Series]


class ComparisonError(UserError, ValueError):
    """Human and automated results cannot be compared (no common methods, ...)."""


# ---------------------------------------------------------------------------------
# Columns: one (metric, k) of metrics.csv each
# ---------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------
# Method level
# ---------------------------------------------------------------------------------


def rank_methods(values: pd.Series, higher_better: bool = True) -> pd.Series:
    """Rank 1 = best; ties (at 9 decimals, as in saleval-score) share the best rank; NaN unranked."""
    r = values.astype(float).round(9).rank(ascending=not higher_better, method="min")
    return r.astype("Int64")


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
# Instance level
# ---------------------------------------------------------------------------------


def crowd_accuracy_per_explanation(aggregated: pd.DataFrame) -> pd.Series:
    r"""Per explanation (i, j): the share of k at which the crowd was right, :math:`\frac{1}{K}\sum_k A_{ijk}`."""
    return aggregated.groupby(["sample_id", "method"])["correct"].mean().rename("crowd_accuracy")


def instance_table(
    aggregated: pd.DataFrame,
    per_example: pd.DataFrame,
    predictions: pd.DataFrame,
    columns: Sequence[str],
) -> pd.DataFrame:
    """One row per explanation both sides have: crowd accuracy, metrics, confidence, outcome.

    ``predictions`` holds ``sample_id, confidence, correct`` (the classifier's
    probability of its prediction and whether the prediction was right).
    """
    crowd = crowd_accuracy_per_explanation(aggregated)
    metric = wide_metrics(per_example, columns, ["sample_id", "method"])
    df = crowd.to_frame().join(metric, how="inner").reset_index()
    df = df.merge(predictions[["sample_id", "confidence", "correct"]], on="sample_id", how="left")
    if df["confidence"].isna().any():
        missing = df.loc[df["confidence"].isna(), "sample_id"].unique()[:5]
        raise ComparisonError(f"no prediction for sample(s) {list(missing)} in predictions.parquet")
    return df


def instance_spearman(
    table: pd.DataFrame, column: str, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """Spearman ρ of crowd accuracy with one metric over explanations, cluster-bootstrap CI.

    Explanations of one sample share the text, so the CI resamples *samples*
    (all their explanations together). The p-value is scipy's, which treats
    explanations as independent and is therefore optimistic.
    """
    d = table[["sample_id", "crowd_accuracy", column]].dropna()
    nan = float("nan")
    if len(d) < 3 or d["crowd_accuracy"].nunique() < 2 or d[column].nunique() < 2:
        return {"value": nan, "p_value": nan, "ci_low": nan, "ci_high": nan, "n": len(d)}
    res = stats.spearmanr(d["crowd_accuracy"], d[column])
    rng = np.random.default_rng(seed)
    groups = list(d.groupby("sample_id").indices.values())
    x, y = d["crowd_accuracy"].to_numpy(), d[column].to_numpy()
    boots = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(groups), len(groups))
        idx = np.concatenate([groups[i] for i in pick])
        if np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
            boots.append(stats.spearmanr(x[idx], y[idx]).statistic)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha]) if boots else (nan, nan)
    return {
        "value": float(res.statistic),
        "p_value": float(res.pvalue),
        "ci_low": float(lo),
        "ci_high": float(hi),
        "n": len(d),
    }


def instance_ols(
    table: pd.DataFrame, column: str, level: float = 0.95
) -> tuple[list[dict[str, Any]], str]:
    r"""OLS of crowd accuracy on the metric, classifier confidence and prediction outcome.

    .. math:: \mathrm{acc}_{ij} = \beta_0 + \beta_1 z(m_{ij}) + \beta_2\,\mathrm{conf}_i
              + \beta_3\,\mathbb{1}[\hat y_i = y_i] + \varepsilon_{ij}

    The metric is standardized (z-score) so coefficients compare across metrics
    (change in crowd accuracy per standard deviation of the metric). Standard errors
    are clustered by sample (explanations of one text are not independent).
    Regressors that are constant in the data (the outcome when only correctly
    classified samples were studied) are dropped and say so. Nguyen (2018), NAACL,
    §5 (regression of human accuracy on explanation quality and model confidence);
    statsmodels OLS.

    Returns rows for the correlations table and the model's text summary.
    """
    import statsmodels.api as sm

    d = table[["sample_id", "crowd_accuracy", column, "confidence", "correct"]].dropna()
    rows: list[dict[str, Any]] = []
    nan = float("nan")
    if len(d) < 5 or d[column].std() == 0:
        return rows, f"{column}: too few explanations or a constant metric; no OLS\n"
    X = pd.DataFrame({"metric_z": (d[column] - d[column].mean()) / d[column].std()})
    dropped = []
    for reg in ("confidence", "correct"):
        if d[reg].nunique() > 1:
            X[reg] = d[reg].astype(float).to_numpy()
        else:
            dropped.append(reg)
    X = sm.add_constant(X, has_constant="add")
    groups = pd.factorize(d["sample_id"])[0]
    model = sm.OLS(d["crowd_accuracy"].astype(float), X)
    if len(np.unique(groups)) > 1:
        fit = model.fit(cov_type="cluster", cov_kwds={"groups": groups})
    else:
        fit = model.fit()
    ci = fit.conf_int(alpha=1 - level)
    for name, stat in (
        ("metric_z", "ols_coef"),
        ("confidence", "ols_coef_confidence"),
        ("correct", "ols_coef_correct"),
    ):
        if name in fit.params.index:
            rows.append(
                {
                    "statistic": stat,
                    "value": float(fit.params[name]),
                    "ci_low": float(ci.loc[name, 0]),
                    "ci_high": float(ci.loc[name, 1]),
                    "p_value": float(fit.pvalues[name]),
                    "n": int(fit.nobs),
                }
            )
    rows.append(
        {
            "statistic": "ols_r2",
            "value": float(fit.rsquared),
            "ci_low": nan,
            "ci_high": nan,
            "p_value": nan,
            "n": int(fit.nobs),
        }
    )
    note = f" (dropped constant regressors: {', '.join(dropped)})" if dropped else ""
    text = f"== crowd_accuracy ~ z({column}) + confidence + correct{note}\n{fit.summary()}\n"
    return rows, text


# ---------------------------------------------------------------------------------
# Presentation
# ---------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    if pd.isna(v):
        return "–"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"


def markdown_report(
    comparison: pd.DataFrame,
    correlations: pd.DataFrame,
    columns: Sequence[str],
    title: str,
    notes: Sequence[str] = (),
) -> str:
    """The side-by-side table (value with rank in brackets) and the correlations, as Markdown."""
    table = pd.DataFrame({"method": comparison["method"]})
    table["human s_j"] = [
        f"{_fmt(v)} ({int(r)})" for v, r in zip(comparison["human_score"], comparison["human_rank"])
    ]
    for col in columns:
        arrow = "↑" if higher_is_better(col) else "↓"
        table[f"{col} {arrow}"] = [
            f"{_fmt(v)} ({'–' if pd.isna(r) else int(r)})"
            for v, r in zip(comparison[col], comparison[f"{col}_rank"])
        ]
    parts = [f"# {title}", "", table.to_markdown(index=False), ""]
    parts.append("Ranks in brackets (1 = best; ↑ higher is better, ↓ lower is better).")
    parts.append("")

    def ci(row: Mapping[str, Any]) -> str:
        if pd.isna(row.get("ci_low")):
            return _fmt(row["value"])
        return f"{_fmt(row['value'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"

    meth = correlations[correlations["level"] == "method"]
    if len(meth):
        t = meth.pivot_table(index="metric", columns="statistic", values="value", aggfunc="first")
        out = pd.DataFrame({"metric": list(dict.fromkeys(meth["metric"]))})
        for stat in ("spearman", "kendall"):
            if stat in t.columns:
                out[stat] = [
                    ci(meth[(meth["metric"] == m) & (meth["statistic"] == stat)].iloc[0])
                    for m in out["metric"]
                ]
        parts += [
            "## Method level: metric ranking vs human ranking",
            "",
            out.to_markdown(index=False),
            "",
        ]
    inst = correlations[correlations["level"] == "instance"]
    if len(inst):
        out = pd.DataFrame({"metric": list(dict.fromkeys(inst["metric"]))})
        for stat, label in (
            ("spearman", "Spearman ρ"),
            ("ols_coef", "OLS β (per SD)"),
            ("ols_r2", "OLS R²"),
        ):
            vals = []
            for m in out["metric"]:
                r = inst[(inst["metric"] == m) & (inst["statistic"] == stat)]
                vals.append(ci(r.iloc[0]) if len(r) else "–")
            out[label] = vals
        n = int(inst["n"].max()) if "n" in inst and inst["n"].notna().any() else 0
        parts += [
            f"## Instance level: crowd accuracy per explanation vs metric (n = {n})",
            "",
            out.to_markdown(index=False),
            "",
        ]
    parts += [f"* {n}" for n in notes]
    return "\n".join(parts).rstrip() + "\n"


def plot_rank_vs_rank(
    comparison: pd.DataFrame,
    columns: Sequence[str],
    correlations: pd.DataFrame,
    path: str | Path,
    title: str,
) -> Path:
    """Small multiples: human rank (x) against each metric's rank (y), one dot per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(columns))
    ncols = min(4, n)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.4 * nrows), squeeze=False)
    m = len(comparison)
    for ax, col in zip(axes.flat, columns):
        x = comparison["human_rank"].astype(float)
        y = comparison[f"{col}_rank"].astype(float)
        ax.plot([1, m], [1, m], color="0.8", lw=1, zorder=0)
        ax.scatter(x, y, s=25)
        for xi, yi, name in zip(x, y, comparison["method"]):
            ax.annotate(name, (xi, yi), fontsize=6, xytext=(3, 2), textcoords="offset points")
        rho = correlations[
            (correlations["level"] == "method")
            & (correlations["metric"] == col)
            & (correlations["statistic"] == "spearman")
        ]
        sub = (
            f"ρ = {rho['value'].iloc[0]:.2f}" if len(rho) and pd.notna(rho["value"].iloc[0]) else ""
        )
        ax.set_title(f"{col}\n{sub}", fontsize=8)
        ax.set_xlim(0.5, m + 0.5)
        ax.set_ylim(m + 0.5, 0.5)
        ax.set_xlabel("human rank", fontsize=7)
        ax.set_ylabel("metric rank", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


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


def instance_level(
    aggregated: pd.DataFrame,
    per_example: pd.DataFrame,
    predictions: pd.DataFrame,
    cols: Sequence[str],
    n_boot: int,
    level: float,
    seed: int,
) -> tuple[pd.DataFrame | None, pd.DataFrame | None, str, str]:
    """The instance-level analysis where the crowd and the metrics share samples: the
    instance table, its correlation rows (Spearman with cluster-bootstrap CIs, OLS), the
    OLS text, and the note that says what was done or why it was skipped."""
    shared = set(aggregated["sample_id"].astype(str)) & set(per_example["sample_id"].astype(str))
    if not shared:
        return (
            None,
            None,
            "",
            (
                "Instance level skipped: the crowd and the metrics share no sample "
                "(e.g. published crowd results on other samples)."
            ),
        )
    instance = instance_table(aggregated, per_example, predictions, cols)
    inst_rows, ols_text = [], ""
    for col in cols:
        r = instance_spearman(instance, col, n_boot=n_boot, level=level, seed=seed)
        inst_rows.append({"metric": col, "level": "instance", "statistic": "spearman", **r})
        ols_rows, text = instance_ols(instance, col, level=level)
        inst_rows += [{"metric": col, "level": "instance", **o} for o in ols_rows]
        ols_text += text + "\n"
    inst = pd.DataFrame(inst_rows)
    inst["higher_is_better"] = [higher_is_better(c) for c in inst["metric"]]
    return (
        instance,
        inst,
        ols_text,
        (
            "Instance level: crowd accuracy per explanation = mean over k of A_ijk; Spearman "
            "CIs resample samples (cluster bootstrap); OLS on the z-scored metric with "
            "sample-clustered standard errors (see ols.txt). Signs are of the raw metric: "
            "read them with ↑/↓."
        ),
    )


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
