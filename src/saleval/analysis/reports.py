"""Tables and plots of crowd scores in the paper's layout (docs/scores.md#outputs).

The main table has one row per method, one column per k holding "accuracy (rank)"
and a final "score (rank)" column; in every column the best value is bold and the
next two of the top three are underlined. Everything built from a simulated crowd
says SIMULATED in its title. Plots use matplotlib's object API (no pyplot state,
no display needed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from saleval.analysis.scoring import order_methods

DISPLAY_NAMES = {
    "all_attention": "All Attention",
    "last_attention": "Last Attention",
    "vanilla_gradient": "Vanilla Gradient",
    "input_x_gradient": "InputXGrad",
    "integrated_gradients": "Integrated Gradients",
    "deeplift": "DeepLIFT",
    "lime": "LIME",
    "occlusion": "Occlusion",
    "random": "Random",
}

SIMULATED = "SIMULATED"


def display_name(method: str) -> str:
    return DISPLAY_NAMES.get(method, method)


def title(text: str, simulated: bool) -> str:
    """Prefix a title with SIMULATED when the answers came from the simulated crowd."""
    return f"{SIMULATED} crowd: {text}" if simulated else text


def _mark(cell: str, rank: int, bold: Callable[[str], str], under: Callable[[str], str]) -> str:
    if rank == 1:
        return bold(cell)
    if rank <= 3:
        return under(cell)
    return cell


def _paper_rows(
    accuracy: pd.DataFrame,
    scores: pd.DataFrame,
    bold: Callable[[str], str],
    under: Callable[[str], str],
    name: Callable[[str], str],
) -> tuple[list[str], list[list[str]]]:
    ks = sorted(int(k) for k in accuracy["k"].unique())
    acc = accuracy.set_index(["method", "k"])
    sc = scores.set_index("method")
    rows = []
    for m in order_methods(scores["method"]):
        row = [name(display_name(m))]
        for k in ks:
            v, r = acc.loc[(m, k), "accuracy"], int(acc.loc[(m, k), "rank"])
            row.append(_mark(f"{v:.1f} ({r})", r, bold, under))
        v, r = sc.loc[m, "score"], int(sc.loc[m, "rank"])
        row.append(_mark(f"{v:.2f} ({r})", r, bold, under))
        rows.append(row)
    return ["Method", *[f"k={k}" for k in ks], "Score"], rows


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def scores_markdown(
    accuracy: pd.DataFrame,
    scores: pd.DataFrame,
    caption: str,
    simulated: bool = False,
    flips: pd.DataFrame | None = None,
    weights: dict[int, float] | None = None,
    sections: dict[str, pd.DataFrame] | None = None,
) -> str:
    """The Markdown report: the paper table, then CIs and tests, flips and extras."""
    header, rows = _paper_rows(
        accuracy, scores, bold=lambda s: f"**{s}**", under=lambda s: f"<u>{s}</u>", name=str
    )
    out = [f"# {title(caption, simulated)}", ""]
    if simulated:
        out += [
            f"> **{SIMULATED}**: these answers come from the simulated crowd, not from people.",
            "",
        ]
    out += [
        "Crowd accuracy p_jk in % (rank) per number of shown words k, and the "
        "difficulty-weighted score s_j (rank). Best in bold, 2nd and 3rd underlined.",
        "",
        _md_table(header, rows),
        "",
    ]
    if weights:
        out += ["Weights w_k: " + ", ".join(f"k={k}: {w:.3f}" for k, w in weights.items()), ""]
    detail = scores.set_index("method")
    cols = [c for c in ("ci_low", "ci_high", "p_vs_random", "p_vs_random_holm") if c in detail]
    if cols:
        drows = []
        for m in order_methods(scores["method"]):
            r = detail.loc[m]
            ci = f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if "ci_low" in r else ""
            pv = "" if pd.isna(r.get("p_vs_random", np.nan)) else f"{r['p_vs_random']:.4f}"
            ph = (
                "" if pd.isna(r.get("p_vs_random_holm", np.nan)) else f"{r['p_vs_random_holm']:.4f}"
            )
            drows.append([display_name(m), f"{r['score']:.2f}", ci, pv, ph])
        out += [
            "## Score with bootstrap CI and paired test against random",
            "",
            _md_table(["Method", "Score", "95% CI", "p vs random", "p (Holm)"], drows),
            "",
        ]
    if flips is not None:
        f = flips.set_index("method")
        frows = [
            [
                display_name(m),
                *(str(int(f.loc[m, c])) for c in ("flips", "aids", "always", "never") if c in f),
            ]
            for m in order_methods(flips["method"])
        ]
        fh = ["Method", *(c.capitalize() for c in ("flips", "aids", "always", "never") if c in f)]
        out += ["## Flips", "", _md_table(fh, frows), ""]
    for name, df in (sections or {}).items():
        out += [
            f"## {name}",
            "",
            _md_table(list(map(str, df.columns)), df.astype(str).values.tolist()),
            "",
        ]
    return "\n".join(out)


def tex_escape(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
    ):
        s = s.replace(a, b)
    return s


def scores_latex(
    accuracy: pd.DataFrame,
    scores: pd.DataFrame,
    caption: str,
    simulated: bool = False,
    label: str = "tab:scores",
) -> str:
    """The paper table as a LaTeX ``table`` (booktabs)."""
    header, rows = _paper_rows(
        accuracy,
        scores,
        bold=lambda s: rf"\textbf{{{s}}}",
        under=lambda s: rf"\underline{{{s}}}",
        name=tex_escape,
    )
    header = [h.replace("k=", "$k$=") for h in header]
    spec = "l" + "r" * (len(header) - 1)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{tex_escape(title(caption, simulated))}. Accuracy (\%) with rank per $k$ "
        r"and weighted score; best in bold, 2nd and 3rd underlined.}",
        rf"\label{{{label}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *[" & ".join(r) + r" \\" for r in rows],
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
        "",
    ]
    return "\n".join(lines)


def plot_accuracy_vs_k(
    accuracy: pd.DataFrame, path: str | Path, caption: str, simulated: bool = False
) -> Path:
    """Accuracy vs k per method with bootstrap CIs as shaded bands."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for m in order_methods(accuracy["method"]):
        d = accuracy[accuracy["method"] == m].sort_values("k")
        style = "--" if m == "random" else "-"
        (line,) = ax.plot(d["k"], d["accuracy"], style, marker="o", label=display_name(m))
        if {"ci_low", "ci_high"} <= set(d.columns):
            ax.fill_between(d["k"], d["ci_low"], d["ci_high"], color=line.get_color(), alpha=0.12)
    ax.set_xlabel("k (words shown)")
    ax.set_ylabel("crowd accuracy (%)")
    ax.set_xticks(sorted(accuracy["k"].unique()))
    ax.set_title(title(caption, simulated))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    if simulated:
        _watermark(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def plot_flip_histogram(
    hist: pd.DataFrame, path: str | Path, caption: str, simulated: bool = False
) -> Path:
    """Number of samples by how many methods flip them."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.bar(hist["n_methods"], hist["n_samples"], color="#4c72b0")
    for x, y in zip(hist["n_methods"], hist["n_samples"]):
        ax.annotate(str(int(y)), (x, y), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("number of methods under which the sample flips")
    ax.set_ylabel("samples")
    ax.set_xticks(hist["n_methods"])
    ax.set_title(title(caption, simulated))
    if simulated:
        _watermark(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


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
    if simulated:
        _watermark(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


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
    lines += ["", "## Designs", "", _md_table(header, rows), ""]
    first = per_method[
        per_method["design"]
        == (int(recommended["design"]) if recommended is not None else int(plan["design"].iloc[-1]))
    ]
    lines += [
        f"Per method, design {int(first['design'].iloc[0])}:",
        "",
        _md_table(
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
        _md_table(
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


def _watermark(fig: Figure) -> None:
    fig.text(
        0.5,
        0.5,
        SIMULATED,
        fontsize=48,
        color="grey",
        alpha=0.15,
        ha="center",
        va="center",
        rotation=25,
    )
