"""The gathered rows as one report (``saleval-report``; docs/sweeps.md): each column ranked
within its dataset and model (:func:`report_table`), the Spearman/Kendall agreement of
each metric's method ranking with the human one (:func:`rank_correlations`), and the
Markdown page and heatmaps a reader opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from saleval.analysis import comparison, metric_columns
from saleval.analysis.gathering import (
    HUMAN,
    ROW,
)
from saleval.pipeline import tables


def report_table(long: pd.DataFrame, rank_within: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """One row per dataset × model × variant × method; ``<column>_rank`` within each group
    of ``rank_within`` (1 = best in the column's registered direction, ties share)."""
    wide = long.pivot_table(index=ROW, columns="column", values="value", aggfunc="first")
    metric_cols = [c for c in dict.fromkeys(long["column"]) if c != HUMAN]
    wide = wide.reindex(columns=[HUMAN, *metric_cols]).reset_index()
    extra = long.groupby(ROW).agg(
        simulated=("simulated", "any"), runs=("run", lambda r: ",".join(dict.fromkeys(r)))
    )
    wide = wide.merge(extra.reset_index(), on=ROW)
    out = wide[[*ROW, HUMAN]].copy()
    out["human_rank"] = pd.array([pd.NA] * len(out), dtype="Int64")
    for col in metric_cols:
        out[col] = wide[col]
        out[f"{col}_rank"] = pd.array([pd.NA] * len(out), dtype="Int64")
    for _, idx in out.groupby(list(rank_within)).groups.items():
        out.loc[idx, "human_rank"] = metric_columns.rank_methods(out.loc[idx, HUMAN], True)
        for col in metric_cols:
            higher = metric_columns.higher_is_better(col)
            out.loc[idx, f"{col}_rank"] = metric_columns.rank_methods(out.loc[idx, col], higher)
    out["simulated"], out["runs"] = wide["simulated"].to_numpy(), wide["runs"].to_numpy()
    out = out.sort_values([*rank_within, "human_rank", "method"], na_position="last")
    return out.reset_index(drop=True), metric_cols


def rank_correlations(
    table: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str]
) -> pd.DataFrame:
    """Spearman's ρ and Kendall's τ between the human and each metric's ranking, per group;
    a group without human scores (metrics-only runs) has nothing to correlate with."""
    rows = []
    for key, g in table.groupby(list(rank_within), sort=False):
        if not g[HUMAN].notna().any():
            continue
        group = dict(zip(rank_within, key if isinstance(key, tuple) else (key,)))
        for col in metric_cols:
            higher = metric_columns.higher_is_better(col)
            r = comparison.rank_agreement(g[HUMAN], g[col], higher)
            for stat in ("spearman", "kendall"):
                rows.append(
                    {**group, "metric": col, "statistic": stat, "value": r[stat],
                     "p_value": r[f"{stat}_p"], "n": r["n"], "higher_is_better": higher,
                     "simulated": bool(g["simulated"].any())}
                )  # fmt: skip
    out = pd.DataFrame(rows, columns=None if rows else list(tables.REPORT_CORRELATIONS.columns))
    for key in ("dataset", "model", "variant"):
        if key not in out.columns:
            out[key] = ""
    return out


def _cell(v: Any, r: Any) -> str:
    if pd.isna(v):
        return "–"
    shown = f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return shown + ("" if pd.isna(r) else f" ({int(r)})")


def markdown(
    table: pd.DataFrame, corr: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str]
) -> str:
    """Per group, the values with their ranks; then ρ per group and metric."""
    simulated = bool(table["simulated"].any())
    parts = ["# Human vs automated evaluation across runs", ""]
    if simulated:
        parts += ["Rows marked * come from a SIMULATED crowd, not from people.", ""]
    for key, g in table.groupby(list(rank_within), sort=False):
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        shown = pd.DataFrame({"method": g["method"] + np.where(g["simulated"], " *", "")})
        if g["variant"].astype(str).str.len().any():
            shown["variant"] = g["variant"].to_numpy()
        shown["human"] = [_cell(v, r) for v, r in zip(g[HUMAN], g["human_rank"])]
        for col in metric_cols:
            arrow = "↑" if metric_columns.higher_is_better(col) else "↓"
            shown[f"{col} {arrow}"] = [_cell(v, r) for v, r in zip(g[col], g[f"{col}_rank"])]
        parts += [f"## {name}", "", shown.to_markdown(index=False), ""]
    parts += ["Ranks in brackets, within each section (1 = best).", ""]
    rho = corr[corr["statistic"] == "spearman"]
    if len(rho):
        pivot = rho.pivot_table(
            index=list(rank_within), columns="metric", values="value", aggfunc="first"
        ).reindex(columns=list(metric_cols))
        parts += [
            "## Spearman ρ: each metric's ranking vs the human ranking",
            "",
            pivot.round(3).reset_index().to_markdown(index=False),
            "",
        ]
    else:
        parts += ["No human score in these runs (metrics only): no rank correlation.", ""]
    return "\n".join(parts).rstrip() + "\n"


def plot_rank_heatmap(
    table: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str], path: Path
) -> Path:
    """One panel per group: methods (rows) × human and metrics (columns), coloured by rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(table.groupby(list(rank_within), sort=False))
    cols = ["human_rank"] + [f"{c}_rank" for c in metric_cols]
    ncols = min(3, len(groups))
    nrows = int(np.ceil(len(groups) / ncols))
    width = 1.2 + 0.55 * len(cols)
    height = 1.4 + 0.3 * max(len(g) for _, g in groups)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax, (key, g) in zip(axes.flat, groups):
        ranks = g[cols].astype("float64").to_numpy()
        ax.imshow(np.ma.masked_invalid(ranks), cmap="viridis_r", aspect="auto")
        light = (np.nanmax(ranks) + 1) / 2 if np.isfinite(ranks).any() else 0.0
        for (i, j), v in np.ndenumerate(ranks):  # dark text on the light (good) ranks
            if not np.isnan(v):
                color = "k" if v <= light else "w"
                ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6, color=color)
        labels = [m + (f" [{v}]" if v else "") for m, v in zip(g["method"], g["variant"])]
        ax.set_yticks(range(len(g)), labels, fontsize=6)
        ax.set_xticks(
            range(len(cols)), ["human", *metric_cols], rotation=60, ha="right", fontsize=6
        )
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        ax.set_title(name + (" (SIMULATED crowd)" if g["simulated"].any() else ""), fontsize=8)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    fig.suptitle("Ranks within each group (1 = best)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_correlation_heatmap(
    corr: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str], path: Path
) -> Path:
    """Groups (rows) × metrics (columns): Spearman ρ with the human ranking."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = corr[corr["statistic"] == "spearman"]
    pivot = rho.pivot_table(
        index=list(rank_within), columns="metric", values="value", aggfunc="first", dropna=False
    ).reindex(columns=list(metric_cols))
    values = pivot.to_numpy(float)
    fig, ax = plt.subplots(figsize=(1.5 + 0.6 * len(metric_cols), 1.2 + 0.4 * len(pivot)))
    im = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    rows = [" / ".join(map(str, k if isinstance(k, tuple) else (k,))) for k in pivot.index]
    ax.set_yticks(range(len(rows)), rows, fontsize=6)
    ax.set_xticks(range(len(metric_cols)), list(metric_cols), rotation=60, ha="right", fontsize=6)
    fig.colorbar(im, ax=ax).set_label("Spearman ρ", fontsize=7)
    simulated = " (SIMULATED crowd)" if bool(rho["simulated"].any()) else ""
    ax.set_title(f"Metric ranking vs human ranking{simulated}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
