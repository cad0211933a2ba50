"""What ``saleval-plan`` tells a reader (docs/planning.md): ``plan.md`` (the recommended
design, every design's figures, the check against the published study, the assumptions)
and ``power.png`` (how the chance of finding the best method grows with the study's size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from saleval.analysis.reports import (
    SIMULATED,
    display_name,
    md_table,
    save_figure,
    title,
)
from saleval.analysis.scoring import order_methods


def plot_power_curves(
    plan: pd.DataFrame,
    per_method: pd.DataFrame,
    path: str | Path,
    caption: str,
    simulated: bool = False,
) -> Path:
    """saleval-plan's figures against n (docs/planning.md): P(best method found) and the
    expected Spearman with the reference ranking; the mean interval width; each method's
    power against the baseline. One line per design family (R, methods, ks)."""
    fig = Figure(figsize=(12, 4))
    axes = fig.subplots(1, 3)
    family = ["repeats", "methods", "ks"]
    for i, (_, fam) in enumerate(plan.groupby(family, sort=False)):
        fam = fam.sort_values("n")
        tag = f"R={fam['repeats'].iloc[0]}" + (f", set {i + 1}" if i else "")
        (line,) = axes[0].plot(fam["n"], fam["p_best"], marker="o", label=f"P(best), {tag}")
        axes[0].plot(
            fam["n"],
            fam["spearman_mean"],
            "--",
            marker="s",
            color=line.get_color(),
            label=f"E[Spearman], {tag}",
        )
        axes[1].plot(fam["n"], fam["ci_width_mean"], marker="o", label=tag)
        if i == 0:
            pm = per_method.merge(fam[["design", "n"]], on="design")
            for m in order_methods(pm["method"]):
                d = pm[pm["method"] == m].sort_values("n")
                if d["power"].notna().any():
                    axes[2].plot(d["n"], d["power"], marker=".", label=display_name(m))
    axes[0].set_ylabel("probability / correlation")
    axes[0].set_ylim(0, 1.02)
    axes[1].set_ylabel("mean width of the 95 % interval of s_j (points)")
    axes[2].set_ylabel("power of the paired test vs the baseline")
    axes[2].set_ylim(0, 1.02)
    for ax in axes:
        ax.set_xlabel("samples n")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title(caption, simulated))
    return save_figure(fig, path, simulated)


def plan_markdown(
    plan: pd.DataFrame,
    per_method: pd.DataFrame,
    recommended: pd.Series | None,
    info: dict[str, Any],
    check: pd.DataFrame | None = None,
) -> str:
    """``plan.md`` of saleval-plan (docs/planning.md): where the figures come from, the
    recommendation, the designs, and the assumptions they rest on."""
    simulated = info["source"] == "simulated"
    cur = str(info["currency"])
    lines = [f"# {title('Study plan', simulated)}", ""]
    if simulated:
        lines += [
            f"> **{SIMULATED}**: every figure below rests on a simulated crowd "
            "(docs/simulated-crowd.md), not on people. Check it against a pilot with real "
            "workers before paying for the full study.",
            "",
            f"* Discrepancy: {info.get('discrepancy') or 'none'}",
        ]
    else:
        lines += [
            "Every figure below rests on the answers of real people: the published crowd.",
            "",
        ]
    lines += [
        f"* Source: {info['origin']}",
        f"* Pool: {info['n_pool']} samples; methods {', '.join(map(str, info['methods']))}; "
        f"k {', '.join(map(str, info['ks']))}; {info['pool_repeats']} answers per task.",
        f"* Target: P(best method found) ≥ {info['target_p_best']} and expected Spearman "
        f"≥ {info['target_spearman']}.",
        f"* Seconds per task: {float(str(info['seconds'])):.1f} ({info['seconds_source']}); "
        f"pay {info['hourly_rate']} {cur} per worker-hour, platform fee {info['fee']}.",
        "",
        "## Recommendation",
        "",
    ]
    lines += _plan_recommendation(plan, recommended, cur)
    lines += _plan_designs(plan, per_method, recommended, cur)
    if check is not None:
        lines += _plan_check(check)
    lines += _plan_assumptions(info)
    return "\n".join(lines)


def _plan_recommendation(plan: pd.DataFrame, recommended: pd.Series | None, cur: str) -> list[str]:
    """plan.md: the cheapest design meeting the target, or the closest one."""
    lines: list[str] = []
    if recommended is None:
        closest = plan.sort_values(["p_best", "spearman_mean"], ascending=False).iloc[0]
        lines += [
            "No design of the grid meets the target. The closest is design "
            f"{int(closest['design'])} (n = {int(closest['n'])}, R = {int(closest['repeats'])}): "
            f"P(best) {closest['p_best']:.2f}, E[Spearman] {closest['spearman_mean']:.2f}. "
            "Add larger n to `plan.n`, or fewer methods of similar quality.",
        ]
    else:
        r = recommended
        lines += [
            f"**Design {int(r['design'])}**: n = {int(r['n'])} samples × {int(r['n_methods'])} "
            f"methods × {int(r['n_ks'])} k, R = {int(r['repeats'])} answers per task: "
            f"{int(r['tasks']):,} tasks, {int(r['answers']):,} answers, {int(r['bundles']):,} "
            f"bundles, {r['worker_minutes'] / 60:.1f} worker-hours, **{r['cost']:,.2f} {cur}**. "
            f"P(best) {r['p_best']:.2f}, E[Spearman] {r['spearman_mean']:.2f} (5th "
            f"percentile {r['spearman_p05']:.2f}), mean 95 % interval of s_j "
            f"±{r['ci_width_mean'] / 2:.1f} points.",
        ]
    return lines


def _plan_designs(
    plan: pd.DataFrame, per_method: pd.DataFrame, recommended: pd.Series | None, cur: str
) -> list[str]:
    """plan.md: every design, then the recommended (or largest) one per method."""
    lines: list[str] = []
    header = [
        "design",
        "n",
        "R",
        "J",
        "K",
        "tasks",
        "worker-h",
        f"cost ({cur})",
        "P(best)",
        "E[ρ]",
        "ρ 5 %",
        "CI width",
        "min P(order)",
        "min power",
        "meets",
    ]
    rows = [
        [
            str(int(r.design)),
            str(int(r.n)),
            str(int(r.repeats)),
            str(int(r.n_methods)),
            str(int(r.n_ks)),
            f"{int(r.tasks):,}",
            f"{r.worker_minutes / 60:.1f}",
            f"{r.cost:,.2f}",
            f"{r.p_best:.2f}",
            f"{r.spearman_mean:.2f}",
            f"{r.spearman_p05:.2f}",
            f"{r.ci_width_mean:.1f}",
            f"{r.p_order_min:.2f}",
            "—" if pd.isna(r.power_min) else f"{r.power_min:.2f}",
            "yes" if r.meets_target else "",
        ]
        for r in plan.itertuples()
    ]
    lines += ["", "## Designs", "", md_table(header, rows), ""]
    first = per_method[
        per_method["design"]
        == (int(recommended["design"]) if recommended is not None else int(plan["design"].iloc[-1]))
    ]
    lines += [
        f"Per method, design {int(first['design'].iloc[0])}:",
        "",
        md_table(
            ["method", "reference score", "rank", "CI width", "P(above next)", "power"],
            [
                [
                    display_name(str(m.method)),
                    f"{m.reference_score:.1f}",
                    str(int(m.reference_rank)),
                    f"{m.ci_width:.1f}",
                    "—" if pd.isna(m.p_order_next) else f"{m.p_order_next:.2f}",
                    "—" if pd.isna(m.power) else f"{m.power:.2f}",
                ]
                for m in first.sort_values("reference_rank").itertuples()
            ],
        ),
        "",
    ]
    return lines


def _plan_check(check: pd.DataFrame) -> list[str]:
    """plan.md: predictions beside half-samples of the published study."""
    lines: list[str] = []
    lines += [
        "## Check against half-samples of the published study",
        "",
        md_table(
            ["", "n", "P(best)", "E[ρ]", "CI width"],
            [
                [
                    str(c.row),
                    str(int(c.n)),
                    f"{c.p_best:.3f}",
                    f"{c.spearman_mean:.3f}",
                    f"{c.ci_width_mean:.1f}",
                ]
                for c in check.itertuples()
            ],
        ),
        "",
        "Half-samples share half their samples with the reference ranking, so they should "
        "match the prediction for n = N, not for n = N/2 (finite-population correction); "
        "a new, independent study of N/2 samples is what the n = N/2 row predicts.",
        "",
    ]
    return lines


def _plan_assumptions(info: dict[str, Any]) -> list[str]:
    """plan.md: what every figure rests on."""
    lines: list[str] = []
    lines += [
        "## Assumptions",
        "",
        "* The pool stands for the population: studies are drawn from its samples with "
        "replacement, so a design can only be as representative as the pool.",
        "* The reference ranking is the pool's own: for the published crowd, the ranking of "
        "all its samples; a study cannot be checked against a truth the pool does not hold.",
        "* R answers per task are drawn from the pool's answers and aggregated by the "
        "study's strict majority (docs/aggregation.md); the published crowd gives only "
        "majority verdicts, so its R is fixed.",
        *(
            [
                f"* The simulated crowd's discrepancy: {info['discrepancy']}. Power is tested "
                "on the simulated answers themselves, without it."
            ]
            if info.get("discrepancy")
            else []
        ),
        f"* Power: the paired sign-flip test against `{info['baseline']}` at α = "
        f"{info['alpha']} per method, without correction over methods, on "
        f"{info['power_replicates']} drawn studies ({info['test_resamples']} resamples each).",
        f"* {info['replicates']} drawn studies per design; figures move by about "
        f"±{1 / max(int(str(info['replicates'])), 1) ** 0.5:.2f} between seeds.",
        "* Cost counts answers to study tasks only: gold questions, rejected work and "
        "pilot runs come on top.",
        "",
    ]
    return lines
