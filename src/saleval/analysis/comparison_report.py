"""The comparison as people read it: the side-by-side Markdown table with the
correlations, and the plot of each metric's method ranking against the human one
(docs/metrics.md#comparison).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import saleval.metrics.faithfulness
import saleval.metrics.plausibility  # noqa: F401  (registers the plausibility metrics)
from saleval.analysis.metric_columns import (
    higher_is_better,
)


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
