"""The faithfulness formulas: small pure functions, one per metric, each citing its source.

Also the two perturbations every metric builds on, always on token ids
(:func:`saleval.words.perturb_ids`): a text without some words, a text with only some.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from saleval.vocab import Removal
from saleval.words import Segmentation, perturb_ids

if TYPE_CHECKING:  # a type only: the formulas need no transformers at import
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "aopc",
    "comprehensiveness",
    "grid_average",
    "log_odds",
    "log_odds_drop",
    "only_words",
    "sufficiency",
    "switching_point",
    "without_words",
]

# ---------------------------------------------------------------------------------
# Formulas (pure)
# ---------------------------------------------------------------------------------


def comprehensiveness(p_full: np.ndarray | float, p_without_top_k: np.ndarray | float) -> Any:
    r"""Comprehensiveness :math:`p(\hat y \mid x) - p(\hat y \mid x \setminus r_k)`.

    The drop in the predicted class's probability when the top-k words of the
    explanation are removed; higher = the explanation found words the model needs.
    DeYoung et al. (2020), "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL, §4 (https://aclanthology.org/2020.acl-main.408).

    >>> round(float(comprehensiveness(0.9, 0.3)), 6)
    0.6
    """
    return np.asarray(p_full, dtype=np.float64) - np.asarray(p_without_top_k, dtype=np.float64)


def sufficiency(p_full: np.ndarray | float, p_only_top_k: np.ndarray | float) -> Any:
    r"""Sufficiency :math:`p(\hat y \mid x) - p(\hat y \mid r_k)`.

    How much probability is lost when the model sees *only* the top-k words;
    lower = the shown words suffice (negative when they alone are more convincing).
    DeYoung et al. (2020), ERASER, ACL, §4.

    >>> round(float(sufficiency(0.9, 0.95)), 6)
    -0.05
    """
    return np.asarray(p_full, dtype=np.float64) - np.asarray(p_only_top_k, dtype=np.float64)


def grid_average(values_per_bin: np.ndarray | Sequence[float]) -> Any:
    r"""Mean of a per-bin metric over a grid of k: :math:`\frac{1}{|B|}\sum_{k \in B} m_k`.

    ERASER reports comprehensiveness and sufficiency as this "AOPC" over the bins
    B = {1, 5, 10, 20, 50 %} of words (DeYoung et al. 2020, §4); the same average
    over the crowd k-grid puts the metric on the human study's footing.
    Averages over the last axis.
    """
    return np.asarray(values_per_bin, dtype=np.float64).mean(axis=-1)


def aopc(p_full: np.ndarray | float, p_removed: np.ndarray | Sequence[float]) -> Any:
    r"""Area over the perturbation curve :math:`\frac{1}{K+1}\sum_{k=1}^{K} [f(x) - f(x_{\setminus 1..k})]`.

    ``p_removed[..., k-1]`` is the predicted class's probability after deleting the
    first k words of an order (most important first for positive evidence, least
    important first for the "least" variant); K is the last axis' length. The
    k = 0 term of the original definition is zero and only counts in the 1/(K+1).
    Samek et al. (2017), "Evaluating the visualization of what a deep neural network
    has learned", IEEE TNNLS (https://doi.org/10.1109/TNNLS.2016.2599820); for text,
    Nguyen (2018), "Comparing Automatic and Human Evaluation of Local Explanations
    for Text Classification", NAACL (https://aclanthology.org/N18-1097).

    >>> round(float(aopc(1.0, [0.5, 0.0])), 4)
    0.5
    """
    p = np.asarray(p_removed, dtype=np.float64)
    full = np.asarray(p_full, dtype=np.float64)[..., None]
    return (full - p).sum(axis=-1) / (p.shape[-1] + 1)


def switching_point(
    pred_after_k: Sequence[int] | np.ndarray, target: int, n_words: int
) -> tuple[float, bool]:
    r"""Switching point :math:`\min\{k : \arg\max p(\cdot \mid x_{\setminus 1..k}) \ne \hat y\} / n`.

    ``pred_after_k[k-1]`` is the predicted class after deleting the method's top k
    words (k = 1, 2, ...). The fraction of the text's words that must go before the
    prediction changes; lower = the method put decisive words first. Returns
    ``(value, switched)``: when the class never changes over the deletions given,
    the value is 1.0 (as if it changed only once every word was gone) and
    ``switched`` is False. Nguyen (2018), NAACL, §3.2
    (https://aclanthology.org/N18-1097).

    >>> switching_point([1, 1, 0, 0], target=1, n_words=10)
    (0.3, True)
    """
    if n_words <= 0:
        raise ValueError("switching point of a text without words")
    preds = np.asarray(pred_after_k)
    changed = np.flatnonzero(preds != target)
    if changed.size == 0:
        return 1.0, False
    return float(changed[0] + 1) / n_words, True


def log_odds(p: np.ndarray | float, eps: float = 1e-7) -> Any:
    r"""Log-odds :math:`\log p - \log(1 - p)`, with p clipped to [eps, 1 − eps]."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1 - eps)
    return np.log(q) - np.log1p(-q)


def log_odds_drop(p_full: np.ndarray | float, p_removed: np.ndarray | float) -> Any:
    r"""Log-odds drop :math:`\mathrm{lo}(p(\hat y \mid x)) - \mathrm{lo}(p(\hat y \mid x_{\setminus \lceil f n \rceil}))`.

    The change of the predicted class's log-odds when the top fraction f of words
    is removed (higher = more faithful). Unlike a probability difference it does not
    saturate for confident models. Shrikumar et al. (2017), "Learning Important
    Features Through Propagating Activation Differences", ICML, §4.2
    (https://proceedings.mlr.press/v70/shrikumar17a.html); Chen et al. (2019),
    "L-Shapley and C-Shapley", ICLR, §5.

    >>> round(float(log_odds_drop(0.5, 0.5)), 6)
    0.0
    """
    return log_odds(p_full) - log_odds(p_removed)


# ---------------------------------------------------------------------------------
# Perturbations (always on ids)
# ---------------------------------------------------------------------------------


def without_words(
    seg: Segmentation,
    drop: Iterable[int],
    removal: Removal | str = Removal.delete,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> list[int]:
    """The text's ids with the words ``drop`` removed; everything else stays."""
    keep = np.ones(seg.n_words, dtype=bool)
    keep[list(drop)] = False
    return perturb_ids(seg, keep, removal, tokenizer, keep_other=True)


def only_words(
    seg: Segmentation,
    shown: Iterable[int],
    removal: Removal | str = Removal.delete,
    tokenizer: PreTrainedTokenizerFast | None = None,
    keep_other: bool = False,
) -> list[int]:
    """The text's ids keeping only the words ``shown`` (and special tokens).

    ``keep_other=False`` (default) also removes tokens that belong to no word
    (punctuation), so the model sees what a crowd worker sees: the shown words.
    """
    keep = np.zeros(seg.n_words, dtype=bool)
    keep[list(shown)] = True
    return perturb_ids(seg, keep, removal, tokenizer, keep_other=keep_other)
