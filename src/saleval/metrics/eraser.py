"""ERASER's own convention for plausibility (docs/metrics.md#eraser): numbers that can be
set beside a published ERASER table.

saleval's own convention (:mod:`saleval.metrics.plausibility`) scores words inside the
model's window and averages every metric over texts. ERASER's scorer (DeYoung et al. 2020,
§4 and the benchmark's ``metrics.py``) differs in five places, and this module follows it
in each:

* **Tokens.** A document is ERASER's whitespace tokens, punctuation included. A token's
  score is the score of the word inside it (:func:`token_scores`); a token without a
  scored word — punctuation, or a word past the model's window — ranks below every scored
  token of its text.
* **The whole document.** Gold tokens past the window count; the run says how many
  texts were cut (:class:`Coverage`).
* **AUPRC** is the trapezoid rule over scikit-learn's precision–recall curve
  (``precision_recall_curve`` then ``auc``), per document, averaged over documents — not
  the step-wise average precision.
* **Token F1** is per document, averaged over every document with a gold or a predicted
  token (one without predictions scores 0).
* **IOU F1** keeps each annotated evidence span as it is (no merging), matches each
  predicted span to its best gold span (IOU ≥ the threshold), and takes the F1 of the
  macro-averaged precision (over documents with a prediction) and recall (over documents
  with gold spans); a recall's true positives are the matched *predicted* spans, as in
  the scorer.

A method's discrete rationale is its top-k tokens (ties in text order), cut into maximal
runs; k is the number of gold tokens of the document, or ``metrics.plausibility.top_k``.

:func:`results_line` writes a document in the format ERASER's scorer reads, so the same
predictions can be scored by both (docs/metrics.md#eraser says how).

>>> doc = Document.build("d", [(0, 2), (4, 5)], np.array([3., 2., 0., 0., 1.]), 3)
>>> doc.predicted, round(auprc(doc), 4), token_f1(doc), iou_counts(doc, 0.5)
(((0, 2), (4, 5)), 1.0, 1.0, (2, 2, 2))
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from sklearn.metrics import auc, precision_recall_curve

from saleval.metrics.plausibility import (
    ERASER_AUPRC,
    ERASER_IOU_F1,
    ERASER_IOU_PRECISION,
    ERASER_IOU_RECALL,
    ERASER_TOKEN_F1,
    contiguous_spans,
    rationale_k,
    span_iou,
    top_k_mask,
)

if TYPE_CHECKING:
    from saleval.metrics.faithfulness import Explanation

__all__ = [
    "PER_DOCUMENT",
    "Coverage",
    "Document",
    "Scored",
    "auprc",
    "corpus_rows",
    "document_tokens",
    "gold_token_spans",
    "iou_counts",
    "per_document",
    "results_line",
    "score_explanations",
    "summary",
    "token_f1",
    "token_scores",
]

PER_DOCUMENT = (ERASER_AUPRC, ERASER_TOKEN_F1, ERASER_IOU_PRECISION, ERASER_IOU_RECALL)
"""The per-document values; ``eraser_iou_f1`` exists only over a corpus (:func:`summary`)."""

_TOKEN = re.compile(r"\S+")


def document_tokens(text: str) -> list[tuple[int, int]]:
    """Character spans of ERASER's tokens of ``text``: the document's space-separated
    tokens, which the reader joined with single spaces and newlines.

    >>> document_tokens("a fine film .\\nit is")
    [(0, 1), (2, 6), (7, 11), (12, 13), (14, 16), (17, 19)]
    """
    return [(m.start(), m.end()) for m in _TOKEN.finditer(text)]


def gold_token_spans(
    evidence: Iterable[Sequence[int]],
    tokens: Sequence[tuple[int, int]],
    rationale_spans: Sequence[Sequence[int]],
    where: str,
) -> frozenset[tuple[int, int]]:
    """The evidence spans ``[start_token, end_token)`` as annotated (a set: a span given
    twice counts once), checked against the text's tokens and the character spans the
    reader made of them, so a text whose tokens moved fails here, naming ``where``."""
    out = []
    for s, e in evidence:
        s, e = int(s), int(e)
        if not 0 <= s < e <= len(tokens):
            raise ValueError(
                f"{where}: evidence token span {s}:{e} outside a text of {len(tokens)} tokens"
            )
        out.append((s, e))
    chars = sorted((tokens[s][0], tokens[e - 1][1]) for s, e in out)
    if chars != sorted((int(a), int(b)) for a, b in rationale_spans):
        raise ValueError(
            f"{where}: the evidence token spans do not cover the rationale's characters; "
            "the text is not ERASER's tokens joined by whitespace"
        )
    return frozenset(out)


def token_scores(
    tokens: Sequence[tuple[int, int]],
    word_spans: Sequence[tuple[int, int]],
    word_scores: Sequence[float] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Scores on ERASER's tokens from a method's word scores, and which tokens hold a
    scored word.

    A word lies inside one token (both are whitespace-delimited; a word is a token with
    its edge punctuation stripped); a token holding several words (an HTML line break
    inside it) gets their sum, as a word gets the sum of its pieces. Tokens without a
    scored word get one value below every scored token's, so they rank last, tied, in
    text order.

    >>> s, scored = token_scores([(0, 5), (6, 7), (8, 11)], [(0, 4), (8, 11)], [0.5, 2.0])
    >>> s.tolist(), scored.tolist()
    ([0.5, -0.5, 2.0], [True, False, True])
    """
    starts = np.array([a for a, _ in tokens], dtype=np.int64)
    ends = np.array([b for _, b in tokens], dtype=np.int64)
    values = np.asarray(word_scores, dtype=np.float64)
    out = np.zeros(len(tokens))
    scored = np.zeros(len(tokens), dtype=bool)
    for (ws, we), v in zip(word_spans, values):
        t = int(np.searchsorted(starts, ws, side="right")) - 1
        if t < 0 or we > ends[t]:
            raise ValueError(f"word at characters {ws}:{we} lies in no single token")
        out[t] += v
        scored[t] = True
    if scored.any():
        low = float(out[scored].min())
        out[~scored] = low - max(1.0, abs(low))  # strictly below, whatever the scale
    return out, scored


@dataclass(frozen=True)
class Document:
    """One explanation in ERASER's terms: the gold spans, the token scores and the method's
    hard rationale (maximal runs of its top-k tokens)."""

    doc_id: str
    gold: frozenset[tuple[int, int]]
    scores: np.ndarray
    predicted: tuple[tuple[int, int], ...]

    @classmethod
    def build(
        cls,
        doc_id: str,
        gold: Iterable[tuple[int, int]],
        scores: np.ndarray,
        top_k: int | None = None,
    ) -> Document:
        """``top_k`` None: as many tokens as the gold spans cover."""
        gold = frozenset((int(s), int(e)) for s, e in gold)
        n = len(scores)
        k = rationale_k(top_k, gold_mask(gold, n))
        predicted = tuple(contiguous_spans(top_k_mask(scores, k)))
        return cls(doc_id, gold, np.asarray(scores, dtype=np.float64), predicted)

    @property
    def n_tokens(self) -> int:
        return len(self.scores)


def gold_mask(spans: Iterable[tuple[int, int]], n: int) -> np.ndarray:
    """True for every token inside a span."""
    mask = np.zeros(n, dtype=bool)
    for s, e in spans:
        mask[s:e] = True
    return mask


def auprc(doc: Document) -> float:
    """Area under the precision–recall curve by the trapezoid rule: scikit-learn's curve
    over the token scores (a threshold per distinct score, so ties move together) and
    ``auc`` of precision over recall. A document without gold tokens gets what
    scikit-learn gives for it (recall is undefined there), as in ERASER's scorer.

    >>> d = Document.build("d", [(0, 1), (2, 3)], np.array([0.9, 0.5, 0.1]))
    >>> round(auprc(d), 6)  # average precision would be (1 + 2/3) / 2 = 0.8333
    0.791667
    """
    import warnings

    truth = gold_mask(doc.gold, doc.n_tokens).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no positive class: see the docstring
        precision, recall, _ = precision_recall_curve(truth, doc.scores)
    return float(auc(recall, precision))


def _f1(p: float, r: float) -> float:
    """F1 as ERASER computes it: 0 when either side is 0."""
    return 0.0 if p == 0 or r == 0 else 2 * p * r / (p + r)


def token_f1(doc: Document) -> float:
    """Token F1 of the predicted tokens against the gold tokens (each counted once); 0
    without predictions or gold, NaN with neither (the document is not counted).

    >>> token_f1(Document("d", frozenset({(0, 2)}), np.zeros(4), ((1, 3),)))
    0.5
    """
    gold = gold_mask(doc.gold, doc.n_tokens)
    pred = gold_mask(doc.predicted, doc.n_tokens)
    if not gold.any() and not pred.any():
        return math.nan
    hit = int((gold & pred).sum())
    p = hit / int(pred.sum()) if pred.any() else 0.0
    r = hit / int(gold.sum()) if gold.any() else 0.0
    return _f1(p, r)


def iou_counts(doc: Document, threshold: float) -> tuple[int, int, int]:
    """(matched predicted spans, predicted spans, gold spans): a predicted span matches
    when its best IOU with a gold span reaches ``threshold``.

    >>> iou_counts(Document("d", frozenset({(0, 4), (2, 6)}), np.zeros(6), ((0, 6),)), 0.5)
    (1, 1, 2)
    """
    hits = sum(
        max((span_iou(p, g) for g in doc.gold), default=0.0) >= threshold for p in doc.predicted
    )
    return int(hits), len(doc.predicted), len(doc.gold)


def per_document(doc: Document, threshold: float) -> dict[str, float]:
    """The per-document values (:data:`PER_DOCUMENT`); NaN where the scorer leaves the
    document out of an average (IOU precision without predicted spans, IOU recall
    without gold spans)."""
    hits, n_pred, n_gold = iou_counts(doc, threshold)
    return {
        ERASER_AUPRC: auprc(doc),
        ERASER_TOKEN_F1: token_f1(doc),
        ERASER_IOU_PRECISION: hits / n_pred if n_pred else math.nan,
        ERASER_IOU_RECALL: hits / n_gold if n_gold else math.nan,
    }


def summary(values: pd.DataFrame) -> dict[str, float]:
    """ERASER's corpus figures from :func:`per_document` values of one method (one row per
    document): the means, and IOU F1 = F1 of the macro precision and recall (an empty
    average counts 0, as in the scorer).

    >>> docs = [Document("a", frozenset({(0, 2)}), np.array([1., 1., 0.]), ((0, 2),)),
    ...         Document("b", frozenset({(0, 1), (2, 3)}), np.array([1., 0., 0.]), ((0, 1),))]
    >>> s = summary(pd.DataFrame([per_document(d, 0.5) for d in docs]))
    >>> s["eraser_iou_f1"], s["eraser_iou_recall"]  # P = 1, R = (1 + 1/2) / 2
    (0.8571428571428571, 0.75)
    """
    out = {}
    for name in PER_DOCUMENT:
        col = values[name].dropna() if name in values else pd.Series(dtype=float)
        out[name] = float(col.mean()) if len(col) else 0.0
    out[ERASER_IOU_F1] = _f1(out[ERASER_IOU_PRECISION], out[ERASER_IOU_RECALL])
    return out


def corpus_rows(per_example: pd.DataFrame) -> pd.DataFrame:
    """``metrics.csv`` rows of ``eraser_iou_f1`` (per method) from the per-example rows
    of its precision and recall: a corpus figure, so no per-text value and no std."""
    rows = []
    parts = per_example[per_example["metric"].isin([ERASER_IOU_PRECISION, ERASER_IOU_RECALL])]
    for method, g in parts.groupby("method", sort=False):
        wide = g.pivot_table(index="sample_id", columns="metric", values="value", aggfunc="first")
        figures = summary(wide)
        rows.append(
            {
                "method": method,
                "metric": ERASER_IOU_F1,
                "k": "",
                "value": figures[ERASER_IOU_F1],
                "n": int(g["sample_id"].nunique()),
                "std": math.nan,
            }
        )
    return pd.DataFrame(rows, columns=["method", "metric", "k", "value", "n", "std"])


def results_line(annotation_id: str, docid: str, doc: Document) -> dict[str, object]:
    """One line of ERASER's results file (the format its ``metrics.py`` reads): the hard
    rationale as token spans and the soft scores of every token.

    >>> d = Document.build("d", [(0, 1)], np.array([2.0, 0.5]))
    >>> results_line("x.txt", "x.txt", d)["rationales"][0]["hard_rationale_predictions"]
    [{'start_token': 0, 'end_token': 1}]
    """
    return {
        "annotation_id": annotation_id,
        "rationales": [
            {
                "docid": docid,
                "hard_rationale_predictions": [
                    {"start_token": s, "end_token": e} for s, e in doc.predicted
                ],
                "soft_rationale_predictions": [float(x) for x in doc.scores],
            }
        ],
    }


@dataclass(frozen=True)
class Coverage:
    """How much of the documents a run's explanations cover: ERASER scores whole
    documents, and a word past the model's window has no score (it ranks last)."""

    texts: int
    texts_cut: int
    gold_tokens: int
    gold_tokens_past_window: int

    @property
    def reading(self) -> str:
        """``whole``: every text fit the model's window; ``rank_last``: the words past it
        ranked last."""
        return "whole" if self.texts_cut == 0 else "rank_last"

    def describe(self) -> str:
        if self.texts_cut == 0:
            return f"every one of the {self.texts} texts fit the model's window: scored whole"
        share = self.gold_tokens_past_window / max(1, self.gold_tokens)
        return (
            f"{self.texts_cut} of {self.texts} texts run past the model's window; their "
            f"words past it have no score and rank last ({self.gold_tokens_past_window:,} "
            f"of {self.gold_tokens:,} gold tokens, {share:.1%}, lie there)"
        )


@dataclass
class Scored:
    """ERASER's convention over a run's explanations: per-document values (the layout of
    ``metrics_per_example.parquet``), the corpus rows of ``metrics.csv``, the scorer's
    results lines per method and what the explanations cover."""

    per_example: pd.DataFrame
    corpus: pd.DataFrame
    results: dict[str, list[dict[str, object]]]
    coverage: Coverage


def score_explanations(
    explanations: Sequence[Explanation],
    rows: pd.DataFrame,
    top_k: int | None,
    threshold: float,
    where: str,
) -> Scored:
    """Every explanation in ERASER's terms. ``rows``: the dataset's rows by sample id, with
    ``text``, ``rationale_spans``, ``evidence_tokens``, ``annotation_id`` and ``docid``
    (:func:`saleval.modeling.data.read_eraser_movies`)."""
    documents: dict[str, tuple[list[tuple[int, int]], frozenset[tuple[int, int]]]] = {}
    cut: dict[str, int] = {}
    values: list[tuple[str, str, str, str, float]] = []
    results: dict[str, list[tuple[bool, str, dict[str, object]]]] = {}
    for e in explanations:
        row = rows.loc[e.sample_id]
        if e.sample_id not in documents:
            tokens = document_tokens(str(row["text"]))
            gold = gold_token_spans(
                row["evidence_tokens"],
                tokens,
                row["rationale_spans"],
                f"{where}, sample {e.sample_id}",
            )
            documents[e.sample_id] = (tokens, gold)
            if e.seg.truncated:
                end = e.seg.spans[-1][1] if e.seg.spans else 0
                past = gold_mask(gold, len(tokens)) & (np.array([a for a, _ in tokens]) >= end)
                cut[e.sample_id] = int(past.sum())
        tokens, gold = documents[e.sample_id]
        scores, _ = token_scores(tokens, e.seg.spans, e.scores)
        doc = Document.build(e.sample_id, gold, scores, top_k)
        for name, v in per_document(doc, threshold).items():
            values.append((e.sample_id, e.method, name, "", v))
        line = results_line(str(row["annotation_id"]), str(row["docid"]), doc)
        results.setdefault(e.method, []).append(
            (not doc.predicted, str(row["annotation_id"]), line)
        )
    per_example = pd.DataFrame(values, columns=["sample_id", "method", "metric", "k", "value"])
    # the scorer looks for hard predictions in its first line only: lead with one that has them
    ordered = {
        m: [line for *_, line in sorted(lines, key=lambda x: x[:2])] for m, lines in results.items()
    }
    coverage = Coverage(
        texts=len(documents),
        texts_cut=len(cut),
        gold_tokens=int(sum(gold_mask(g, len(t)).sum() for t, g in documents.values())),
        gold_tokens_past_window=sum(cut.values()),
    )
    return Scored(per_example, corpus_rows(per_example), ordered, coverage)
