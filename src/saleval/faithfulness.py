"""Automated faithfulness metrics of SPEC §7: word deletion on token ids.

Every metric compares the model's probability of its own prediction ŷ (argmax on
the full text) before and after removing words in the order a saliency method
ranks them. Words are those of :mod:`saleval.words`; removing a word removes all
its word pieces *on the ids* (:func:`saleval.words.perturb_ids`), never by
decoding and re-tokenizing text, so a removed word cannot come back as other
pieces. Removal deletes the pieces (default), or replaces each with ``[MASK]`` or
``[UNK]``.

The formulas are small pure functions (one per metric, each citing its source);
:func:`evaluate` plans every perturbed input of every (sample, method), pushes
them through the model in large length-sorted batches
(:func:`saleval.inference.predict_proba`), de-duplicated by a cache, and times
each metric family separately.

Conventions:

* ranking: words sorted by score, highest first; equal scores keep text order;
* k words beyond a text's length are clipped to its length;
* a fraction f of a text's n words is ``ceil(f · n)`` words (at least one), so
  1 % of a 40-word headline is one word, not zero;
* "the predicted class changes" means ``argmax p(·|x') ≠ ŷ`` (numpy's argmax,
  ties to the lower class index).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.inference import BF16, parse_bf16, predict_proba
from saleval.words import Segmentation, perturb_ids

log = logging.getLogger(__name__)

ERASER_GRID: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
REMOVALS = ("delete", "mask", "unk")

# metric names as written to metrics.csv / metrics_per_example.parquet
COMPREHENSIVENESS = "comprehensiveness"
SUFFICIENCY = "sufficiency"
AOPC_MOST = "aopc_most"
AOPC_LEAST = "aopc_least"
SWITCHING_POINT = "switching_point"
NO_SWITCH = "no_switch"
LOG_ODDS_DROP = "log_odds_drop"
KGRID_SUFFIX = "_kgrid"


# ---------------------------------------------------------------------------------
# Formulas (pure)
# ---------------------------------------------------------------------------------


def importance_order(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Word indices from most to least important; equal scores keep text order.

    A stable sort keeps ties deterministic, so a method that gives many words the
    same score (attention on short texts, zero gradients) is not silently helped or
    hurt by an arbitrary tie-break.
    """
    s = np.asarray(scores, dtype=np.float64)
    if np.isnan(s).any():
        raise ValueError("word scores contain NaN")
    return np.argsort(-s, kind="stable")


def n_words_for_fraction(fraction: float, n_words: int) -> int:
    r"""Number of words that make up ``fraction`` of a text: :math:`\max(1, \lceil f n \rceil)`.

    ERASER (DeYoung et al. 2020, §4) bins rationales at 1, 5, 10, 20, 50 % of the
    tokens; rounding up keeps the 1 % bin non-empty on short texts.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"a fraction of words must lie in (0, 1), got {fraction}")
    if n_words <= 0:
        return 0
    return max(1, math.ceil(fraction * n_words - 1e-9))


def comprehensiveness(p_full: np.ndarray | float, p_without_top_k: np.ndarray | float) -> Any:
    r"""Comprehensiveness :math:`p(\hat y \mid x) - p(\hat y \mid x \setminus r_k)`.

    The drop in the predicted class's probability when the top-k words of the
    explanation are removed; higher = the explanation found words the model needs.
    DeYoung et al. (2020), "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL, §4 (https://aclanthology.org/2020.acl-main.408).

    >>> float(comprehensiveness(0.9, 0.3))
    0.6
    """
    return np.asarray(p_full, dtype=np.float64) - np.asarray(p_without_top_k, dtype=np.float64)


def sufficiency(p_full: np.ndarray | float, p_only_top_k: np.ndarray | float) -> Any:
    r"""Sufficiency :math:`p(\hat y \mid x) - p(\hat y \mid r_k)`.

    How much probability is lost when the model sees *only* the top-k words;
    lower = the shown words suffice (negative when they alone are more convincing).
    DeYoung et al. (2020), ERASER, ACL, §4.

    >>> float(sufficiency(0.9, 0.95))
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
    removal: str = "delete",
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> list[int]:
    """The text's ids with the words ``drop`` removed; everything else stays."""
    keep = np.ones(seg.n_words, dtype=bool)
    keep[list(drop)] = False
    return perturb_ids(seg, keep, removal, tokenizer, keep_other=True)


def only_words(
    seg: Segmentation,
    shown: Iterable[int],
    removal: str = "delete",
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


# ---------------------------------------------------------------------------------
# Evaluation engine
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaithfulnessConfig:
    """What :func:`evaluate` computes (``conf/metrics/*.yaml``)."""

    removal: str = "delete"
    ks: tuple[int, ...] = (5, 10, 20, 30, 40)
    eraser_grid: tuple[float, ...] = ERASER_GRID
    aopc_k: int = 10
    log_odds_fraction: float = 0.2
    sufficiency_keep_other: bool = False
    switching_chunk: int = 10
    switching_max_fraction: float = 1.0
    max_tokens: int = 8192
    max_batch: int = 512
    bf16: BF16 = False  # true | false | auto (inference.use_bf16)

    def __post_init__(self) -> None:
        if self.removal not in REMOVALS:
            raise ValueError(f"metrics.removal must be one of {REMOVALS}, got {self.removal!r}")
        if any(int(k) < 1 for k in self.ks):
            raise ValueError(f"metrics.ks must be positive word counts, got {list(self.ks)}")
        for f in (*self.eraser_grid, self.log_odds_fraction):
            n_words_for_fraction(f, 1)  # validates 0 < f < 1
        if self.aopc_k < 1 or self.switching_chunk < 1:
            raise ValueError("metrics.aopc_k and metrics.switching.chunk must be ≥ 1")
        if not 0 < self.switching_max_fraction <= 1:
            raise ValueError("metrics.switching.max_fraction must lie in (0, 1]")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> FaithfulnessConfig:
        """Build from the ``metrics`` config node."""
        sw = cfg.get("switching") or {}
        inf = cfg.get("inference") or {}
        return cls(
            removal=str(cfg.get("removal", "delete")),
            ks=tuple(int(k) for k in cfg.get("ks") or ()),
            eraser_grid=tuple(float(f) for f in cfg.get("eraser_grid") or ()),
            aopc_k=int(cfg.get("aopc_k", 10)),
            log_odds_fraction=float(cfg.get("log_odds_fraction", 0.2)),
            sufficiency_keep_other=bool(cfg.get("sufficiency_keep_other", False)),
            switching_chunk=int(sw.get("chunk", 10)),
            switching_max_fraction=float(sw.get("max_fraction", 1.0)),
            max_tokens=int(inf.get("max_tokens", 8192)),
            max_batch=int(inf.get("max_batch", 512)),
            bf16=parse_bf16(inf.get("bf16", False), "metrics.inference.bf16"),
        )


def k_label(k: int | float) -> str:
    """How a k is written in the tables: word counts as '5', fractions as '0.05'."""
    return str(int(k)) if isinstance(k, int | np.integer) else f"{float(k):g}"


@dataclass
class Explanation:
    """One method's word scores for one sample, on the sample's segmentation."""

    sample_id: str
    method: str
    seg: Segmentation
    scores: np.ndarray

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float64)
        if self.scores.shape != (self.seg.n_words,):
            raise ValueError(
                f"sample {self.sample_id}, method {self.method}: {self.scores.shape[0]} "
                f"scores for {self.seg.n_words} words"
            )
        self.order = importance_order(self.scores)


class ProbabilityCache:
    """Class probabilities of id sequences, each distinct sequence computed once.

    Metrics overlap (AOPC's first deletions are comprehensiveness at small k and the
    start of the switching-point walk); the cache makes every family pay only for
    sequences nobody asked for before.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        pad_token_id: int,
        config: FaithfulnessConfig,
        progress: bool = False,
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.config = config
        self.progress = progress
        self._probs: dict[bytes, np.ndarray] = {}
        self.n_forward = 0

    @staticmethod
    def key(sequence: Sequence[int]) -> bytes:
        """A 16-byte digest of the ids: long texts × many deletions stay cheap to remember."""
        return hashlib.blake2b(
            np.asarray(sequence, dtype=np.int64).tobytes(), digest_size=16
        ).digest()

    def __call__(self, sequences: Sequence[Sequence[int]], desc: str = "forward") -> np.ndarray:
        keys = [self.key(s) for s in sequences]
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._probs:
                first.setdefault(k, i)
        if first:
            probs = predict_proba(
                self.model,
                [sequences[i] for i in first.values()],
                pad_token_id=self.pad_token_id,
                max_tokens=self.config.max_tokens,
                max_batch=self.config.max_batch,
                bf16=self.config.bf16,
                progress=self.progress,
                desc=desc,
            )
            self._probs.update(zip(first, probs))
            self.n_forward += len(first)
        n_labels = int(self.model.config.num_labels)
        if not keys:
            return np.empty((0, n_labels), dtype=np.float32)
        return np.stack([self._probs[k] for k in keys])


@dataclass
class FaithfulnessResult:
    per_example: pd.DataFrame  # sample_id, method, metric, k, value
    full: pd.DataFrame  # sample_id, pred, confidence, n_words
    timings: pd.DataFrame  # metric, seconds, cpu_seconds, n_sequences, n_forward
    extra: dict[str, Any] = field(default_factory=dict)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, float]] = []

    def add(self, e: Explanation, metric: str, k: str, value: float) -> None:
        self.rows.append((e.sample_id, e.method, metric, k, float(value)))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["sample_id", "method", "metric", "k", "value"])


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    explanations: Sequence[Explanation],
    config: FaithfulnessConfig,
    progress: bool = False,
) -> FaithfulnessResult:
    """Every faithfulness metric of SPEC §7 for every explanation.

    Families run one after another, each planning all its perturbed inputs across
    explanations and pushing them through the model in one batched call, so the
    wall time of each family is measurable (``timings``).
    """
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    cache = ProbabilityCache(model, int(pad), config, progress=progress)
    rows = _Rows()
    timings: list[dict[str, Any]] = []
    tok = tokenizer if config.removal != "delete" else None

    def timed(name: str, fn: Callable[[], int]) -> None:
        t0, c0, f0 = time.perf_counter(), time.process_time(), cache.n_forward
        n_seq = fn()
        timings.append(
            {
                "metric": name,
                "seconds": time.perf_counter() - t0,
                # CPU time of this process (all threads): steadier than wall on a shared machine
                "cpu_seconds": time.process_time() - c0,
                "n_sequences": n_seq,
                "n_forward": cache.n_forward - f0,
            }
        )
        t = timings[-1]
        log.info(
            "%s: %.1fs, %d inputs, %d new forward passes",
            name,
            t["seconds"],
            n_seq,
            t["n_forward"],
        )

    # -- the full texts: ŷ and p(ŷ|x) once per sample ---------------------------------
    segs: dict[str, Segmentation] = {}
    for e in explanations:
        if e.sample_id in segs and segs[e.sample_id].input_ids != e.seg.input_ids:
            raise ValueError(f"sample {e.sample_id}: explanations disagree on its token ids")
        segs.setdefault(e.sample_id, e.seg)
    sample_ids = list(segs)
    full_probs: dict[str, np.ndarray] = {}

    def _full() -> int:
        probs = cache([segs[s].input_ids for s in sample_ids], desc="full texts")
        full_probs.update(zip(sample_ids, probs))
        return len(sample_ids)

    timed("full_text", _full)
    target = {s: int(np.argmax(p)) for s, p in full_probs.items()}
    p_full = {s: float(full_probs[s][target[s]]) for s in sample_ids}
    items = [e for e in explanations if e.seg.n_words > 0]
    if len(items) < len(explanations):
        log.warning(
            "%d explanations of texts without words skipped", len(explanations) - len(items)
        )

    def p_target(e: Explanation, probs: np.ndarray) -> np.ndarray:
        return probs[:, target[e.sample_id]].astype(np.float64)

    grid_ks: list[tuple[str, Callable[[int], int]]] = [
        (k_label(k), lambda n, k=int(k): min(k, n)) for k in config.ks
    ] + [(k_label(f), lambda n, f=f: n_words_for_fraction(f, n)) for f in config.eraser_grid]
    crowd_labels = [k_label(k) for k in config.ks]
    eraser_labels = [k_label(f) for f in config.eraser_grid]

    def _top_k_family(name: str, make: Callable[[Explanation, int], list[int]], fn: Any) -> int:
        seqs: list[list[int]] = []
        for e in items:
            seqs.extend(make(e, how(e.seg.n_words)) for _, how in grid_ks)
        probs = cache(seqs, desc=name)
        n = len(grid_ks)
        for i, e in enumerate(items):
            values = fn(p_full[e.sample_id], p_target(e, probs[i * n : (i + 1) * n]))
            by_k = dict(zip((lab for lab, _ in grid_ks), values))
            for lab, v in by_k.items():
                rows.add(e, name, lab, v)
            if eraser_labels:
                rows.add(e, name, "", grid_average([by_k[lab] for lab in eraser_labels]))
            if crowd_labels:
                rows.add(e, name + KGRID_SUFFIX, "", grid_average([by_k[c] for c in crowd_labels]))
        return len(seqs)

    timed(
        COMPREHENSIVENESS,
        lambda: _top_k_family(
            COMPREHENSIVENESS,
            lambda e, k: without_words(e.seg, e.order[:k], config.removal, tok),
            comprehensiveness,
        ),
    )
    timed(
        SUFFICIENCY,
        lambda: _top_k_family(
            SUFFICIENCY,
            lambda e, k: only_words(
                e.seg, e.order[:k], config.removal, tok, config.sufficiency_keep_other
            ),
            sufficiency,
        ),
    )

    def _aopc(name: str, most_first: bool) -> int:
        K = config.aopc_k
        seqs = []
        for e in items:
            order = e.order if most_first else e.order[::-1]
            seqs.extend(
                without_words(e.seg, order[: min(k, e.seg.n_words)], config.removal, tok)
                for k in range(1, K + 1)
            )
        probs = cache(seqs, desc=name)
        for i, e in enumerate(items):
            rows.add(
                e, name, "", aopc(p_full[e.sample_id], p_target(e, probs[i * K : (i + 1) * K]))
            )
        return len(seqs)

    timed(AOPC_MOST, lambda: _aopc(AOPC_MOST, True))
    timed(AOPC_LEAST, lambda: _aopc(AOPC_LEAST, False))

    def _switching() -> int:
        """Delete words in the method's order, chunk by chunk, until the class changes.

        Each round evaluates the next ``chunk`` deletions of every explanation still
        pending in one batched call; the first change inside a chunk is exact.
        """
        limit = {
            id(e): max(1, math.ceil(config.switching_max_fraction * e.seg.n_words - 1e-9))
            for e in items
        }
        start = {id(e): 1 for e in items}
        preds: dict[int, list[int]] = {id(e): [] for e in items}
        pending = list(items)
        total = 0
        while pending:
            plan: list[tuple[Explanation, int, int]] = []
            seqs: list[list[int]] = []
            for e in pending:
                lo = start[id(e)]
                hi = min(lo + config.switching_chunk - 1, limit[id(e)])
                plan.append((e, lo, hi))
                seqs.extend(
                    without_words(e.seg, e.order[:k], config.removal, tok)
                    for k in range(lo, hi + 1)
                )
            probs = cache(seqs, desc=SWITCHING_POINT)
            total += len(seqs)
            at, still = 0, []
            for e, lo, hi in plan:
                chunk = probs[at : at + hi - lo + 1].argmax(axis=1)
                at += hi - lo + 1
                preds[id(e)].extend(int(c) for c in chunk)
                if (chunk != target[e.sample_id]).any() or hi >= limit[id(e)]:
                    value, switched = switching_point(
                        preds[id(e)], target[e.sample_id], e.seg.n_words
                    )
                    rows.add(e, SWITCHING_POINT, "", value)
                    rows.add(e, NO_SWITCH, "", 0.0 if switched else 1.0)
                else:
                    start[id(e)] = hi + 1
                    still.append(e)
            pending = still
        return total

    timed(SWITCHING_POINT, _switching)

    def _log_odds() -> int:
        f = config.log_odds_fraction
        seqs = [
            without_words(
                e.seg, e.order[: n_words_for_fraction(f, e.seg.n_words)], config.removal, tok
            )
            for e in items
        ]
        probs = cache(seqs, desc=LOG_ODDS_DROP)
        for e, p in zip(items, p_target_rows(items, probs, target)):
            rows.add(e, LOG_ODDS_DROP, k_label(f), log_odds_drop(p_full[e.sample_id], p))
        return len(seqs)

    timed(LOG_ODDS_DROP, _log_odds)

    full = pd.DataFrame(
        {
            "sample_id": sample_ids,
            "pred": [target[s] for s in sample_ids],
            "confidence": [p_full[s] for s in sample_ids],
            "n_words": [segs[s].n_words for s in sample_ids],
        }
    )
    return FaithfulnessResult(
        per_example=rows.frame(),
        full=full,
        timings=pd.DataFrame(timings),
        extra={"n_forward": cache.n_forward},
    )


class AlignmentError(ValueError):
    """Attribution rows do not match the words the model's tokenizer gives the text."""


def explanations_from_tables(
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    methods: Sequence[str] | None = None,
    where: str = "attributions.parquet",
) -> list[Explanation]:
    """Re-segment every text and attach each method's word scores, checking alignment.

    The attribution table's ``word_index`` indexes :func:`saleval.words.segment`'s
    words; re-segmenting with the trained model's tokenizer and the explain run's
    ``max_length`` must give the same words at the same character spans, or the
    deletions would remove other words than the method ranked. Any mismatch fails,
    naming the sample, method, word and field.
    """
    from saleval.words import segment

    if methods is not None:
        unknown = sorted(set(methods) - set(attributions["method"]))
        if unknown:
            raise AlignmentError(
                f"{where}: method(s) {unknown} not present; has {sorted(set(attributions['method']))}"
            )
        attributions = attributions[attributions["method"].isin(list(methods))]
    texts = dict(zip(predictions["sample_id"].astype(str), predictions["text"].astype(str)))
    missing = sorted(set(attributions["sample_id"].astype(str)) - set(texts))
    if missing:
        raise AlignmentError(f"{where}: sample(s) {missing[:5]} have no row in predictions.parquet")
    out: list[Explanation] = []
    attributions = attributions.sort_values(["sample_id", "method", "word_index"], kind="stable")
    segs: dict[str, Segmentation] = {}
    for (sid, method), g in attributions.groupby(["sample_id", "method"], sort=False):
        sid, method = str(sid), str(method)
        if sid not in segs:
            segs[sid] = segment(texts[sid], tokenizer, max_length)
        seg = segs[sid]
        idx = g["word_index"].to_numpy()
        if len(idx) != seg.n_words or (idx != np.arange(seg.n_words)).any():
            raise AlignmentError(
                f"{where}: sample {sid}, method {method}: word_index covers {len(idx)} words "
                f"(max {int(idx.max()) if len(idx) else -1}) but the text has {seg.n_words} words "
                f"when segmented with the model's tokenizer at max_length={max_length}; was the "
                "explain run made with another model or max_length?"
            )
        for field_name, have, want in (
            ("char_start", g["char_start"].to_numpy(), np.array([s for s, _ in seg.spans])),
            ("char_end", g["char_end"].to_numpy(), np.array([e for _, e in seg.spans])),
        ):
            bad = np.flatnonzero(have != want)
            if bad.size:
                i = int(bad[0])
                raise AlignmentError(
                    f"{where}: sample {sid}, method {method}, word_index {i}, field {field_name}: "
                    f"{int(have[i])} but re-segmentation gives {int(want[i])} "
                    f"(word {seg.words[i]!r})"
                )
        words = g["word"].astype(str).tolist()
        if words != seg.words:
            i = next(j for j, (a, b) in enumerate(zip(words, seg.words)) if a != b)
            raise AlignmentError(
                f"{where}: sample {sid}, method {method}, word_index {i}, field word: "
                f"{words[i]!r} but re-segmentation gives {seg.words[i]!r}"
            )
        scores = g["score"].to_numpy(np.float64)
        if not np.isfinite(scores).all():
            i = int(np.flatnonzero(~np.isfinite(scores))[0])
            raise AlignmentError(
                f"{where}: sample {sid}, method {method}, word_index {i}, field score: "
                f"{scores[i]} is not finite"
            )
        out.append(Explanation(sid, method, seg, scores))
    return out


def p_target_rows(
    items: Sequence[Explanation], probs: np.ndarray, target: Mapping[str, int]
) -> np.ndarray:
    """Probability of each row's sample's target class (one row per item)."""
    idx = np.asarray([target[e.sample_id] for e in items], dtype=np.int64)
    return probs[np.arange(len(items)), idx].astype(np.float64)


def summarize(per_example: pd.DataFrame) -> pd.DataFrame:
    """Mean over examples per (method, metric, k), with n and the standard deviation."""
    g = per_example.dropna(subset=["value"]).groupby(["method", "metric", "k"], sort=False)
    out = g["value"].agg(value="mean", std="std", n="count").reset_index()
    return out[["method", "metric", "k", "value", "n", "std"]]
