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

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from saleval.analysis.scoring import order_methods
from saleval.attribution import known_methods

SIMULATED = "SIMULATED"


def display_name(method: str) -> str:
    """How tables and plots name ``method``: the ``display`` its registration declares
    (:func:`saleval.attribution.base.register`), else its own name (a method configured
    under another name, or one from outside the package).

    >>> display_name("integrated_gradients"), display_name("lime_20")
    ('Integrated Gradients', 'lime_20')
    """
    known = known_methods().get(method)
    return known.display if known else method


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


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, numbers right-aligned (every column after the first)."""
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
        md_table(header, rows),
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
            md_table(["Method", "Score", "95% CI", "p vs random", "p (Holm)"], drows),
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
        out += ["## Flips", "", md_table(fh, frows), ""]
    for name, df in (sections or {}).items():
        out += [
            f"## {name}",
            "",
            md_table(list(map(str, df.columns)), df.astype(str).values.tolist()),
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
    return save_figure(fig, path, simulated)


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
    return save_figure(fig, path, simulated)


def watermark(fig: Figure) -> None:
    """SIMULATED across a figure made from a simulated crowd, so no copy of it passes for people."""
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


def save_figure(fig: Figure, path: str | Path, simulated: bool) -> Path:
    """Lay out and write a figure (120 dpi), SIMULATED across it when a simulated crowd
    made it (:func:`watermark`)."""
    if simulated:
        watermark(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)
