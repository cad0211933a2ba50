"""Plausibility: agreement of word scores with human rationales (ERASER, DeYoung et al. 2020).

Human rationales come as character spans into the text (``rationale_spans`` of
:mod:`saleval.modeling.data`); a word is a rationale word when its characters overlap any
span. Soft scores are compared with AUPRC; hard metrics (token F1, IOU F1) need a
discrete rationale, taken as the method's top-k words with k = the number of
human rationale words of that text unless a fixed k is configured (ERASER's own
practice for soft-scoring models is a fixed top-k; per-text k removes the
length prior from the comparison).

Every metric is computed per text and averaged over texts (texts without any
human rationale word inside the model's window are skipped). This is saleval's own
convention; ERASER's scorer differs (its tokens with punctuation, whole documents, the
trapezoid AUPRC, F1 of macro-averaged IOU precision and recall, spans as annotated):
:mod:`saleval.metrics.eraser` follows it, under the ``eraser_*`` names registered here
(docs/metrics.md#eraser).

DeYoung et al. (2020), "ERASER: A Benchmark to Evaluate Rationalized NLP
Models", ACL, §4 (https://aclanthology.org/2020.acl-main.408).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np
from sklearn.metrics import average_precision_score

from saleval.metrics.registry import Metric, register_metric, registered
from saleval.words import rank_words

__all__ = [
    "AUPRC",
    "ERASER",
    "ERASER_AUPRC",
    "ERASER_IOU_F1",
    "ERASER_IOU_PRECISION",
    "ERASER_IOU_RECALL",
    "ERASER_TOKEN_F1",
    "IOU_F1",
    "TOKEN_F1",
    "Auprc",
    "EraserMetric",
    "IouF1",
    "RationaleMetric",
    "TokenF1",
    "auprc",
    "contiguous_spans",
    "iou_f1",
    "plausibility_scores",
    "rationale_k",
    "rationale_word_mask",
    "span_iou",
    "token_f1",
    "top_k_mask",
]

AUPRC = "auprc"
TOKEN_F1 = "token_f1"
IOU_F1 = "iou_f1"
# ERASER's own convention (saleval.metrics.eraser; docs/metrics.md#eraser)
ERASER_AUPRC = "eraser_auprc"
ERASER_TOKEN_F1 = "eraser_token_f1"
ERASER_IOU_F1 = "eraser_iou_f1"
ERASER_IOU_PRECISION = "eraser_iou_precision"
ERASER_IOU_RECALL = "eraser_iou_recall"
ERASER = (
    'DeYoung et al. (2020), "ERASER: A Benchmark to Evaluate Rationalized NLP Models", '
    "ACL, §4, https://aclanthology.org/2020.acl-main.408"
)


def rationale_word_mask(
    word_spans: Sequence[tuple[int, int]], rationale_spans: Sequence[Sequence[int]]
) -> np.ndarray:
    """True for every word whose [start, end) characters overlap a rationale span."""
    mask = np.zeros(len(word_spans), dtype=bool)
    for r in rationale_spans:
        rs, re_ = int(r[0]), int(r[1])
        for i, (s, e) in enumerate(word_spans):
            if s < re_ and rs < e:
                mask[i] = True
    return mask


def rationale_k(top_k: int | None, rationale: np.ndarray) -> int:
    """How many of a text's words (or ERASER's tokens) a method's discrete rationale takes:
    ``metrics.plausibility.top_k``, or as many as the human rationale ``rationale`` (a mask
    over them) has when it is None, clamped to the text's length. The same rule for
    saleval's plausibility and ERASER's convention, so both discretize a method alike.

    >>> mask = np.array([True, False, True])
    >>> rationale_k(None, mask), rationale_k(2, mask), rationale_k(10, mask)
    (2, 2, 3)
    """
    k = int(np.count_nonzero(rationale)) if top_k is None else int(top_k)
    return min(max(k, 0), len(rationale))


def top_k_mask(scores: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """The method's discrete rationale: its k highest-scoring words (ties in text order)."""
    order = rank_words(scores)
    mask = np.zeros(len(order), dtype=bool)
    mask[order[: max(0, int(k))]] = True
    return mask


def auprc(human: np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    r"""Area under the precision–recall curve of word scores against rationale words.

    Average precision :math:`\sum_n (R_n - R_{n-1}) P_n` over score thresholds
    (scikit-learn's ``average_precision_score``), per text. Threshold-free, so it
    judges the whole ranking. DeYoung et al. (2020), ERASER, §4 ("soft scoring").
    NaN when the text has no rationale word.

    >>> auprc(np.array([True, False, True]), [0.9, 0.5, 0.1])
    0.8333333333333333
    """
    human = np.asarray(human, dtype=bool)
    if not human.any():
        return float("nan")
    return float(average_precision_score(human.astype(int), np.asarray(scores, dtype=float)))


def token_f1(human: np.ndarray, predicted: np.ndarray) -> float:
    r"""Token-level F1 :math:`\frac{2PR}{P+R}` of predicted vs human rationale words.

    P = |pred ∩ human| / |pred|, R = |pred ∩ human| / |human|, per text.
    DeYoung et al. (2020), ERASER, §4 ("token-level F1"). NaN without rationale words.

    >>> token_f1(np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool))
    0.5
    """
    human = np.asarray(human, dtype=bool)
    predicted = np.asarray(predicted, dtype=bool)
    if not human.any():
        return float("nan")
    tp = int((human & predicted).sum())
    if tp == 0:
        return 0.0
    p, r = tp / int(predicted.sum()), tp / int(human.sum())
    return 2 * p * r / (p + r)


def contiguous_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True as [start, end) word-index spans."""
    m = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(m))
    return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2])]


def span_iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Intersection over union of two [start, end) index spans."""
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union else 0.0


def iou_f1(human: np.ndarray, predicted: np.ndarray, threshold: float = 0.5) -> float:
    r"""IOU F1: F1 of span matches, a predicted span matching a human one when IOU ≥ 0.5.

    Rationales are split into contiguous word spans. Precision = share of predicted
    spans whose best IOU with a human span reaches the threshold; recall = share of
    human spans matched by some predicted span; F1 = 2PR/(P+R). Per text.
    DeYoung et al. (2020), ERASER, §4 ("IOU F1", after the partial-match F1 of
    object detection). NaN without rationale words.

    >>> iou_f1(np.array([1, 1, 0, 0, 1], bool), np.array([1, 1, 1, 0, 0], bool))
    0.6666666666666666
    """
    gold = contiguous_spans(human)
    pred = contiguous_spans(predicted)
    if not gold:
        return float("nan")
    if not pred:
        return 0.0
    ious = np.array([[span_iou(p, g) for g in gold] for p in pred])
    hit = ious >= threshold
    precision = hit.any(axis=1).mean()
    recall = hit.any(axis=0).mean()
    if precision + recall == 0:
        return 0.0
    return float(2 * precision * recall / (precision + recall))


class RationaleMetric(Metric):
    """A plausibility metric: one value per text from the human rationale and the scores.

    ``predicted`` is the method's discrete rationale (:func:`top_k_mask`).
    """

    kind = "plausibility"

    @abc.abstractmethod
    def score(
        self, human: np.ndarray, scores: np.ndarray, predicted: np.ndarray, iou_threshold: float
    ) -> float:
        """The metric for one text."""


@register_metric(
    AUPRC,
    higher_is_better=True,
    citation=ERASER + ' ("soft scoring")',
    description="average precision of the word scores against the rationale words",
)
class Auprc(RationaleMetric):
    def score(
        self, human: np.ndarray, scores: np.ndarray, predicted: np.ndarray, iou_threshold: float
    ) -> float:
        return auprc(human, scores)


@register_metric(
    TOKEN_F1,
    higher_is_better=True,
    citation=ERASER + ' ("token-level F1")',
    description="F1 of the top-k words against the rationale words",
)
class TokenF1(RationaleMetric):
    def score(
        self, human: np.ndarray, scores: np.ndarray, predicted: np.ndarray, iou_threshold: float
    ) -> float:
        return token_f1(human, predicted)


@register_metric(
    IOU_F1,
    higher_is_better=True,
    citation=ERASER + ' ("IOU F1")',
    description="F1 of top-k word spans matching rationale spans at IOU ≥ the threshold",
)
class IouF1(RationaleMetric):
    def score(
        self, human: np.ndarray, scores: np.ndarray, predicted: np.ndarray, iou_threshold: float
    ) -> float:
        return iou_f1(human, predicted, iou_threshold)


class EraserMetric(Metric):
    """A plausibility metric of ERASER's own convention (docs/metrics.md#eraser), computed
    over all documents at once by :mod:`saleval.metrics.eraser` (``metrics.plausibility.
    convention``); registered here for its name, direction and source only, so
    :func:`plausibility_scores` does not run it per text."""

    kind = "plausibility"


_SCORER = " and its scorer, rationale_benchmark/metrics.py"


@register_metric(
    ERASER_AUPRC,
    higher_is_better=True,
    citation=ERASER + _SCORER + " (auprc)",
    description="trapezoid area under the precision-recall curve of the scores on ERASER's "
    "tokens, the whole document",
)
class EraserAuprc(EraserMetric):
    pass


@register_metric(
    ERASER_TOKEN_F1,
    higher_is_better=True,
    citation=ERASER + _SCORER + " (token_prf, instance macro F1)",
    description="F1 of the top-k ERASER tokens against the gold tokens, per document",
)
class EraserTokenF1(EraserMetric):
    pass


@register_metric(
    ERASER_IOU_F1,
    higher_is_better=True,
    citation=ERASER + _SCORER + " (iou_scores, macro F1)",
    description="F1 of the macro-averaged IOU precision and recall, gold spans as annotated",
    # its components, one value per document; not ranked on their own
    extra_outputs={ERASER_IOU_PRECISION: None, ERASER_IOU_RECALL: None},
)
class EraserIouF1(EraserMetric):
    pass


def plausibility_scores(
    human: np.ndarray,
    scores: Sequence[float] | np.ndarray,
    top_k: int | None = None,
    iou_threshold: float = 0.5,
) -> dict[str, float]:
    """Every registered plausibility metric of one explanation against one human rationale.

    ``top_k`` None discretizes at as many words as the human rationale has.
    """
    human = np.asarray(human, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    pred = top_k_mask(scores, rationale_k(top_k, human))
    return {
        m.info.name: m.score(human, scores, pred, iou_threshold)
        for m in registered("plausibility")
        if isinstance(m, RationaleMetric)
    }
