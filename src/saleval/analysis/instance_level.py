"""Human against automated, per explanation (docs/metrics.md#comparison, *instance level*).

Per explanation (sample × method), the crowd accuracy (mean over k of A_ijk) against each
metric: a Spearman correlation with a cluster-bootstrap interval, and an OLS model of
crowd accuracy on the metric, the classifier's confidence and whether its prediction
was right (Nguyen 2018, "Comparing Automatic and Human Evaluation of Local Explanations
for Text Classification", NAACL, https://aclanthology.org/N18-1097). Statistics use the
raw metric values; ``higher_is_better`` says how to read their sign.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

import saleval.metrics.faithfulness
import saleval.metrics.plausibility  # noqa: F401  (registers the plausibility metrics)
from saleval.analysis.metric_columns import (
    ComparisonError,
    higher_is_better,
    wide_metrics,
)


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
