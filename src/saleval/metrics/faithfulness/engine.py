"""The evaluation engine: every registered faithfulness metric over one probability cache.

:func:`evaluate` computes the model's prediction ŷ and p(ŷ|x) on every full text once,
then runs the registered ``faithfulness`` metrics (:mod:`saleval.metrics.registry`) one
after another. Each metric plans the perturbed inputs of every explanation, and the
shared :class:`ProbabilityCache` pushes the ones nobody asked for before through the
model in large length-sorted batches (:func:`saleval.modeling.inference.predict_proba`); the
wall time and the new forward passes of every metric are measured (``timings``, the
rows of ``metric_timings.csv``).
"""

from __future__ import annotations

import abc
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from saleval.errors import UserError
from saleval.metrics.config import MetricsConfig, n_words_for_fraction
from saleval.metrics.faithfulness.formulas import (
    grid_average,
    only_words,
    without_words,
)
from saleval.metrics.registry import Metric, registered
from saleval.vocab import Removal
from saleval.words import Segmentation, rank_words, removal_token

if TYPE_CHECKING:  # types only: the metrics register without loading torch (saleval.cli)
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "FULL_TEXT",
    "KGRID_SUFFIX",
    "AddRow",
    "AlignmentError",
    "Context",
    "Explanation",
    "FaithfulnessResult",
    "PerturbationMetric",
    "ProbabilityCache",
    "Row",
    "evaluate",
    "explanations_from_tables",
    "k_label",
    "p_target_rows",
    "summarize",
]

log = logging.getLogger(__name__)

FULL_TEXT = "full_text"
"""The timings row of the full-text pass every metric shares (ŷ and p(ŷ|x))."""

KGRID_SUFFIX = "_kgrid"
"""Suffix of a per-k metric averaged over the crowd k-grid (``metrics.ks``)."""

Row = tuple[str, str, float]
"""One result of a metric for one explanation: ``(metric name, k, value)``."""

AddRow = Callable[["Explanation", str, str, float], None]
"""How a metric hands over a result: ``add(explanation, metric name, k, value)``."""


def k_label(k: int | float) -> str:
    """How a k is written in the tables: word counts as '5', fractions as '0.05'."""
    return str(int(k)) if isinstance(k, int | np.integer) else f"{float(k):g}"


@dataclass
class Explanation:
    """One method's word scores for one sample, on the sample's segmentation.

    ``order``: the words from most to least salient (:func:`saleval.words.rank_words`,
    equal scores in text order), the order every metric removes them in.
    """

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
        self.order = rank_words(self.scores)


class ProbabilityCache:
    """Class probabilities of id sequences, each distinct sequence computed once.

    Metrics overlap (AOPC's first deletions are comprehensiveness at small k and the
    start of the switching-point walk); the cache makes every metric pay only for
    sequences nobody asked for before.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast | None,
        config: MetricsConfig,
        progress: bool = False,
    ) -> None:
        from saleval.modeling.inference import parse_bf16

        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.bf16 = parse_bf16(config.inference.bf16, "metrics.inference.bf16")
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
        from saleval.modeling.inference import n_labels_of, predict_proba

        keys = [self.key(s) for s in sequences]
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._probs:
                first.setdefault(k, i)
        if first:
            probs = predict_proba(
                self.model,
                [sequences[i] for i in first.values()],
                tokenizer=self.tokenizer,
                max_tokens=self.config.inference.max_tokens,
                max_batch=self.config.inference.max_batch,
                bf16=self.bf16,
                progress=self.progress,
                desc=desc,
            )
            self._probs.update(zip(first, probs))
            self.n_forward += len(first)
        n_labels = n_labels_of(self.model)
        if not keys:
            return np.empty((0, n_labels), dtype=np.float32)
        return np.stack([self._probs[k] for k in keys])


@dataclass
class Context:
    """What a metric sees: the explanations, ŷ and p(ŷ|x), the shared cache, the config."""

    config: MetricsConfig
    items: list[Explanation]  # explanations of texts with at least one word
    target: dict[str, int]  # ŷ per sample
    p_full: dict[str, float]  # p(ŷ|x) per sample
    probs: ProbabilityCache
    tokenizer: PreTrainedTokenizerFast | None  # for mask/unk removal; None when deleting

    def without(self, e: Explanation, drop: Iterable[int]) -> list[int]:
        """``e``'s text without the words ``drop`` (removed per ``config.removal``)."""
        return without_words(e.seg, drop, self.config.removal, self.tokenizer)

    def only(self, e: Explanation, shown: Iterable[int]) -> list[int]:
        """``e``'s text with only the words ``shown`` (sufficiency's input)."""
        return only_words(
            e.seg, shown, self.config.removal, self.tokenizer, self.config.sufficiency_keep_other
        )

    def p_target(self, e: Explanation, probs: np.ndarray) -> np.ndarray:
        """The probability of ``e``'s ŷ in each row of ``probs``."""
        return probs[:, self.target[e.sample_id]].astype(np.float64)

    def grid(self, n_words: int) -> list[tuple[str, int]]:
        """``(label, words)`` of every k: the crowd grid, clipped, then the ERASER fractions."""
        return [(k_label(int(k)), min(int(k), n_words)) for k in self.config.ks] + [
            (k_label(f), n_words_for_fraction(f, n_words)) for f in self.config.eraser_grid
        ]

    def grid_rows(self, name: str, by_k: Mapping[str, float]) -> list[Row]:
        """Per-k rows, the ERASER average (k ``""``) and the crowd-grid average (``_kgrid``)."""
        rows: list[Row] = [(name, lab, v) for lab, v in by_k.items()]
        eraser = [k_label(f) for f in self.config.eraser_grid]
        crowd = [k_label(int(k)) for k in self.config.ks]
        if eraser:
            rows.append((name, "", grid_average([by_k[lab] for lab in eraser])))
        if crowd:
            rows.append((name + KGRID_SUFFIX, "", grid_average([by_k[c] for c in crowd])))
        return rows


class PerturbationMetric(Metric):
    """A faithfulness metric: the perturbed sequences it needs, and how their probabilities
    reduce to rows.

    :meth:`compute` plans the sequences of every explanation and asks the shared cache
    for all of them in one call; a metric whose next inputs depend on the last outputs
    (the switching point's walk) overrides it.
    """

    kind = "faithfulness"

    def sequences(self, ctx: Context, e: Explanation) -> list[list[int]]:
        """The perturbed token ids whose probabilities :meth:`reduce` needs."""
        return []

    @abc.abstractmethod
    def reduce(self, ctx: Context, e: Explanation, probs: np.ndarray) -> list[Row]:
        """Rows from the class probabilities of :meth:`sequences` (one row of ``probs`` each)."""

    def compute(self, ctx: Context, add: AddRow) -> int:
        """Every explanation's rows through ``add(e, metric, k, value)``; returns the inputs asked for."""
        plans = [self.sequences(ctx, e) for e in ctx.items]
        seqs = [s for plan in plans for s in plan]
        probs = ctx.probs(seqs, desc=self.info.name)
        at = 0
        for e, plan in zip(ctx.items, plans):
            for metric, k, value in self.reduce(ctx, e, probs[at : at + len(plan)]):
                add(e, metric, k, value)
            at += len(plan)
        return len(seqs)


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
    config: MetricsConfig,
    progress: bool = False,
    metrics: Sequence[str] | None = None,
) -> FaithfulnessResult:
    """Every registered faithfulness metric (or those named in ``metrics``) for every explanation.

    One full-text pass gives ŷ and p(ŷ|x) per sample; then each metric runs in
    registration order over the shared cache, its wall time, CPU time, inputs asked for
    and new forward passes recorded as one row of ``timings``.
    """
    model.eval()
    chosen = _chosen(metrics)
    if config.removal != Removal.delete:  # a removal the model cannot take: before any work
        from saleval.modeling.interface import check_replacement

        token = removal_token(config.removal, tokenizer)
        assert token is not None
        check_replacement(model, tokenizer, token, f"metrics.removal: {config.removal}")
    cache = ProbabilityCache(model, tokenizer, config, progress=progress)
    rows = _Rows()
    timed = _Timings(cache)

    # -- the full texts: ŷ and p(ŷ|x) once per sample ---------------------------------
    segs = _segmentations(explanations)
    sample_ids = list(segs)
    full_probs: dict[str, np.ndarray] = {}

    def _full() -> int:
        probs = cache([segs[s].input_ids for s in sample_ids], desc="full texts")
        full_probs.update(zip(sample_ids, probs))
        return len(sample_ids)

    timed(FULL_TEXT, _full)
    target = {s: int(np.argmax(p)) for s, p in full_probs.items()}
    p_full = {s: float(full_probs[s][target[s]]) for s in sample_ids}
    items = [e for e in explanations if e.seg.n_words > 0]
    if len(items) < len(explanations):
        log.warning(
            "%d explanations of texts without words skipped", len(explanations) - len(items)
        )
    ctx = Context(
        config=config,
        items=items,
        target=target,
        p_full=p_full,
        probs=cache,
        tokenizer=tokenizer if config.removal != Removal.delete else None,
    )
    for metric in chosen:
        timed(metric.info.name, lambda m=metric: m.compute(ctx, rows.add))

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
        timings=pd.DataFrame(timed.rows),
        extra={"n_forward": cache.n_forward},
    )


def _chosen(metrics: Sequence[str] | None) -> list[Any]:
    """The registered faithfulness metrics, in registration order, or those named."""
    chosen = registered("faithfulness")
    if metrics is None:
        return chosen
    unknown = sorted(set(metrics) - {m.info.name for m in chosen})
    if unknown:
        raise ValueError(
            f"metric(s) {unknown} not registered; registered: {[m.info.name for m in chosen]}"
        )
    return [m for m in chosen if m.info.name in set(metrics)]


def _segmentations(explanations: Sequence[Explanation]) -> dict[str, Segmentation]:
    """Each sample's segmentation once; explanations of one sample must agree on it."""
    segs: dict[str, Segmentation] = {}
    for e in explanations:
        if e.sample_id in segs and segs[e.sample_id].input_ids != e.seg.input_ids:
            raise ValueError(f"sample {e.sample_id}: explanations disagree on its token ids")
        segs.setdefault(e.sample_id, e.seg)
    return segs


class _Timings:
    """One row per step of :func:`evaluate`: wall and CPU time, inputs asked for and the
    new forward passes the cache made for it."""

    def __init__(self, cache: ProbabilityCache) -> None:
        self.cache = cache
        self.rows: list[dict[str, Any]] = []

    def __call__(self, name: str, fn: Any) -> None:
        t0, c0, f0 = time.perf_counter(), time.process_time(), self.cache.n_forward
        n_seq = fn()
        self.rows.append(
            {
                "metric": name,
                "seconds": time.perf_counter() - t0,
                # CPU time of this process (all threads): steadier than wall on a shared machine
                "cpu_seconds": time.process_time() - c0,
                "n_sequences": n_seq,
                "n_forward": self.cache.n_forward - f0,
            }
        )
        t = self.rows[-1]
        log.info(
            "%s: %.1fs, %d inputs, %d new forward passes", name, t["seconds"], n_seq, t["n_forward"]
        )


class AlignmentError(UserError, ValueError):
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
