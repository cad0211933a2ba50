"""Human-readable views of an attribution run: highlighted words and method overlap.

* :func:`highlight_html` — for chosen samples, every method's top-k words highlighted
  in the original text (like a figure in a paper), darker = higher rank. All text is
  HTML-escaped.
* :func:`overlap_matrix` — the method-overlap table of docs/scores.md#overlap, with
  :func:`overlap_heatmap` drawing it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from saleval.words import rank_words


def _ranked(attributions: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(sample_id, method) → word indices, most salient first (:func:`saleval.words.rank_words`)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    df = attributions.sort_values(["sample_id", "word_index"], kind="stable")
    for (sid, method), g in df.groupby(["sample_id", "method"], sort=False):
        idx = g["word_index"].to_numpy()
        out[(str(sid), str(method))] = idx[rank_words(g["score"].to_numpy())]
    return out


def overlap_matrix(attributions: pd.DataFrame, k: int = 40) -> pd.DataFrame:
    r"""Overlap of methods (docs/scores.md#overlap): for methods j, j',

    .. math:: O_{jj'} = \frac{100}{N} \sum_i \frac{|\mathrm{top}_K(j, i) \cap \mathrm{top}_K(j', i)|}{K}

    the mean over the N samples both methods explain of the share of their top-K words
    in common, in percent (K = 40 by default). As in the formula, the denominator is K
    even when a text has fewer than K words (such texts cannot reach 100).
    """
    if k < 1:
        raise ValueError(f"overlap K must be >= 1, got {k}")
    ranked = _ranked(attributions)
    methods = list(dict.fromkeys(m for _, m in ranked))
    samples = sorted({s for s, _ in ranked})
    top = {key: set(order[:k].tolist()) for key, order in ranked.items()}
    mat = pd.DataFrame(np.nan, index=methods, columns=methods)
    for a in methods:
        for b in methods:
            vals = [
                len(top[(s, a)] & top[(s, b)]) / k
                for s in samples
                if (s, a) in top and (s, b) in top
            ]
            if vals:
                mat.loc[a, b] = 100.0 * float(np.mean(vals))
    mat.index.name = "method"
    return mat


def overlap_heatmap(matrix: pd.DataFrame, path: str | Path, k: int = 40) -> Path:
    """The overlap table as an annotated heatmap PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(matrix)
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * n, 0.8 + 0.6 * n))
    im = ax.imshow(matrix.to_numpy(dtype=float), vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(n), matrix.columns, rotation=45, ha="right")
    ax.set_yticks(range(n), matrix.index)
    for i in range(n):
        for j in range(n):
            v = matrix.iat[i, j]
            if np.isfinite(v):
                color = "black" if v > 60 else "white"
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8, color=color)
    fig.colorbar(im, ax=ax, label=f"top-{k} overlap (%)")
    ax.set_title(f"Overlap of methods' top-{k} words")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


_STYLE = """
body { font-family: Georgia, serif; max-width: 60rem; margin: 2rem auto; color: #222; }
table { border-collapse: collapse; width: 100%; margin-bottom: 2.5rem; }
td { vertical-align: top; padding: .45rem .6rem; border-top: 1px solid #ddd; line-height: 1.6; }
td.m { font-family: monospace; white-space: nowrap; width: 12rem; }
mark { border-radius: 3px; padding: 0 2px; }
.meta { color: #555; font-size: .9rem; }
"""


def _highlight(text: str, spans: pd.DataFrame, order: np.ndarray, k: int) -> str:
    """``text`` with the top-k words marked, opacity falling with rank; all text escaped."""
    rank = {int(w): r for r, w in enumerate(order[:k])}
    pieces, pos = [], 0
    for w, s, e in spans[["word_index", "char_start", "char_end"]].itertuples(index=False):
        if int(w) not in rank:
            continue
        alpha = 0.95 - 0.7 * rank[int(w)] / max(k - 1, 1)
        pieces.append(html.escape(text[pos:s]))
        pieces.append(
            f'<mark style="background: rgba(230, 80, 30, {alpha:.2f})" '
            f'title="rank {rank[int(w)] + 1}">{html.escape(text[s:e])}</mark>'
        )
        pos = e
    pieces.append(html.escape(text[pos:]))
    return "".join(pieces).replace("\n", "<br>")


def highlight_html(
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    samples: int | Sequence[str] = 3,
    k: int = 10,
    label_names: Sequence[str] | None = None,
    title: str = "Saliency highlights",
) -> str:
    """A standalone HTML page: per sample, one row per method with its top-k words marked."""
    if isinstance(samples, int):
        chosen = predictions["sample_id"].astype(str).tolist()[:samples]
    else:
        chosen = [str(s) for s in samples]
    ranked = _ranked(attributions)
    methods = list(dict.fromkeys(attributions["method"].astype(str)))
    by_id = predictions.assign(sample_id=predictions["sample_id"].astype(str)).set_index(
        "sample_id"
    )
    spans = attributions.assign(sample_id=attributions["sample_id"].astype(str))
    body = [f"<h1>{html.escape(title)}</h1>"]
    for sid in chosen:
        if sid not in by_id.index:
            raise KeyError(f"sample {sid!r} is not in the predictions table")
        row = by_id.loc[sid]

        def name(c: int) -> str:
            return str(label_names[c]) if label_names is not None else str(c)

        # texts explained without a gold label (target=prediction) show only the prediction
        gold = row.get("label")
        known = "" if gold is None or pd.isna(gold) else f"gold: {html.escape(name(int(gold)))} · "
        body.append(
            f"<h2>{html.escape(sid)}</h2><p class='meta'>{known}"
            f"predicted: {html.escape(name(int(row['pred'])))} · top {k} words per method</p>"
        )
        body.append("<table>")
        words = spans[spans["sample_id"] == sid]
        for m in methods:
            if (sid, m) not in ranked:
                continue
            cell = _highlight(
                str(row["text"]),
                words[words["method"] == m].sort_values("word_index"),
                ranked[(sid, m)],
                k,
            )
            body.append(f"<tr><td class='m'>{html.escape(m)}</td><td>{cell}</td></tr>")
        body.append("</table>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>"
    )


def write_views(
    run_dir: str | Path,
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    samples: int | Sequence[str] = 3,
    k: int = 10,
    overlap_k: int = 40,
    label_names: Sequence[str] | None = None,
) -> list[Path]:
    """Write ``highlights.html`` (each method's top ``k`` words marked), ``overlap.csv`` and
    ``overlap.png`` into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    page = run_dir / "highlights.html"
    page.write_text(
        highlight_html(predictions, attributions, samples, k, label_names),
        encoding="utf-8",
    )
    matrix = overlap_matrix(attributions, overlap_k)
    csv = run_dir / "overlap.csv"
    matrix.to_csv(csv, float_format="%.2f")
    png = overlap_heatmap(matrix, run_dir / "overlap.png", overlap_k)
    return [page, csv, png]
