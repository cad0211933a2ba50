"""The built-in faithfulness metrics, registered in run order (docs/metrics.md).

Each removes words in the order the method ranks them (:attr:`Explanation.order`) and
compares the model's probability of its own prediction ŷ before and after. The order
matters for cost only: the cache serves AOPC's first deletions from comprehensiveness,
and the switching point's first steps from AOPC.
"""

from __future__ import annotations

import math

import numpy as np

from saleval.metrics.config import n_words_for_fraction
from saleval.metrics.faithfulness.engine import (
    KGRID_SUFFIX,
    AddRow,
    Context,
    Explanation,
    PerturbationMetric,
    Row,
    k_label,
)
from saleval.metrics.faithfulness.formulas import (
    aopc,
    comprehensiveness,
    log_odds_drop,
    sufficiency,
    switching_point,
)
from saleval.metrics.registry import register_metric

__all__ = [
    "AOPC_LEAST",
    "AOPC_MOST",
    "COMPREHENSIVENESS",
    "ERASER",
    "LOG_ODDS_DROP",
    "NGUYEN",
    "NO_SWITCH",
    "SAMEK",
    "SUFFICIENCY",
    "SWITCHING_POINT",
    "AopcLeast",
    "AopcMost",
    "Comprehensiveness",
    "LogOddsDrop",
    "Sufficiency",
    "SwitchingPoint",
]

# metric names as written to metrics.csv / metrics_per_example.parquet
COMPREHENSIVENESS = "comprehensiveness"
SUFFICIENCY = "sufficiency"
AOPC_MOST = "aopc_most"
AOPC_LEAST = "aopc_least"
SWITCHING_POINT = "switching_point"
NO_SWITCH = "no_switch"
LOG_ODDS_DROP = "log_odds_drop"

ERASER = (
    'DeYoung et al. (2020), "ERASER: A Benchmark to Evaluate Rationalized NLP Models", '
    "ACL, §4, https://aclanthology.org/2020.acl-main.408"
)
NGUYEN = (
    'Nguyen (2018), "Comparing Automatic and Human Evaluation of Local Explanations for '
    'Text Classification", NAACL, https://aclanthology.org/N18-1097'
)


class _TopKGrid(PerturbationMetric):
    """A per-k metric over the crowd grid and the ERASER fractions, with both averages."""

    def perturb(self, ctx: Context, e: Explanation, k: int) -> list[int]:
        raise NotImplementedError

    def formula(self, p_full: float, p: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sequences(self, ctx: Context, e: Explanation) -> list[list[int]]:
        return [self.perturb(ctx, e, k) for _, k in ctx.grid(e.seg.n_words)]

    def reduce(self, ctx: Context, e: Explanation, probs: np.ndarray) -> list[Row]:
        labels = [lab for lab, _ in ctx.grid(e.seg.n_words)]
        values = self.formula(ctx.p_full[e.sample_id], ctx.p_target(e, probs))
        return ctx.grid_rows(self.info.name, dict(zip(labels, values)))


@register_metric(
    COMPREHENSIVENESS,
    higher_is_better=True,
    citation=ERASER,
    description="p(ŷ|x) − p(ŷ|x without the top-k words), per k and averaged over the grids",
    extra_outputs={COMPREHENSIVENESS + KGRID_SUFFIX: True},
)
class Comprehensiveness(_TopKGrid):
    def perturb(self, ctx: Context, e: Explanation, k: int) -> list[int]:
        return ctx.without(e, e.order[:k])

    def formula(self, p_full: float, p: np.ndarray) -> np.ndarray:
        return np.asarray(comprehensiveness(p_full, p))


@register_metric(
    SUFFICIENCY,
    higher_is_better=False,
    citation=ERASER,
    description="p(ŷ|x) − p(ŷ|only the top-k words), per k and averaged over the grids",
    extra_outputs={SUFFICIENCY + KGRID_SUFFIX: False},
)
class Sufficiency(_TopKGrid):
    def perturb(self, ctx: Context, e: Explanation, k: int) -> list[int]:
        return ctx.only(e, e.order[:k])

    def formula(self, p_full: float, p: np.ndarray) -> np.ndarray:
        return np.asarray(sufficiency(p_full, p))


class _Aopc(PerturbationMetric):
    most_first = True

    def sequences(self, ctx: Context, e: Explanation) -> list[list[int]]:
        order = e.order if self.most_first else e.order[::-1]
        n = e.seg.n_words
        return [ctx.without(e, order[: min(k, n)]) for k in range(1, ctx.config.aopc_k + 1)]

    def reduce(self, ctx: Context, e: Explanation, probs: np.ndarray) -> list[Row]:
        return [(self.info.name, "", aopc(ctx.p_full[e.sample_id], ctx.p_target(e, probs)))]


SAMEK = (
    'Samek et al. (2017), "Evaluating the visualization of what a deep neural network has '
    'learned", IEEE TNNLS, https://doi.org/10.1109/TNNLS.2016.2599820; for text ' + NGUYEN
)


@register_metric(
    AOPC_MOST,
    higher_is_better=True,
    citation=SAMEK,
    description="area over the perturbation curve, deleting the most salient words first",
)
class AopcMost(_Aopc):
    most_first = True


@register_metric(
    AOPC_LEAST,
    higher_is_better=False,
    citation=SAMEK,
    description="area over the perturbation curve, deleting the least salient words first",
)
class AopcLeast(_Aopc):
    most_first = False


@register_metric(
    SWITCHING_POINT,
    higher_is_better=False,
    citation=NGUYEN + ", §3.2",
    description="share of the words deleted (most salient first) before ŷ changes",
    extra_outputs={NO_SWITCH: None},  # 1 when ŷ never changed: a diagnostic, not ranked
)
class SwitchingPoint(PerturbationMetric):
    def reduce(self, ctx: Context, e: Explanation, probs: np.ndarray) -> list[Row]:
        preds = probs.argmax(axis=1)
        value, switched = switching_point(preds, ctx.target[e.sample_id], e.seg.n_words)
        return [(SWITCHING_POINT, "", value), (NO_SWITCH, "", 0.0 if switched else 1.0)]

    def compute(self, ctx: Context, add: AddRow) -> int:
        """Delete words in the method's order, chunk by chunk, until the class changes.

        Each round evaluates the next ``switching.chunk`` deletions of every explanation
        still pending in one batched call; the first change inside a chunk is exact.
        """
        cfg = ctx.config.switching
        limit = {
            id(e): max(1, math.ceil(cfg.max_fraction * e.seg.n_words - 1e-9)) for e in ctx.items
        }
        start = {id(e): 1 for e in ctx.items}
        preds: dict[int, list[int]] = {id(e): [] for e in ctx.items}
        pending = list(ctx.items)
        total = 0
        while pending:
            plan: list[tuple[Explanation, int, int]] = []
            seqs: list[list[int]] = []
            for e in pending:
                lo = start[id(e)]
                hi = min(lo + cfg.chunk - 1, limit[id(e)])
                plan.append((e, lo, hi))
                seqs.extend(ctx.without(e, e.order[:k]) for k in range(lo, hi + 1))
            probs = ctx.probs(seqs, desc=SWITCHING_POINT)
            total += len(seqs)
            at, still = 0, []
            for e, lo, hi in plan:
                chunk = probs[at : at + hi - lo + 1].argmax(axis=1)
                at += hi - lo + 1
                preds[id(e)].extend(int(c) for c in chunk)
                if (chunk != ctx.target[e.sample_id]).any() or hi >= limit[id(e)]:
                    value, switched = switching_point(
                        preds[id(e)], ctx.target[e.sample_id], e.seg.n_words
                    )
                    add(e, SWITCHING_POINT, "", value)
                    add(e, NO_SWITCH, "", 0.0 if switched else 1.0)
                else:
                    start[id(e)] = hi + 1
                    still.append(e)
            pending = still
        return total


@register_metric(
    LOG_ODDS_DROP,
    higher_is_better=True,
    citation=(
        'Shrikumar et al. (2017), "Learning Important Features Through Propagating '
        'Activation Differences", ICML, §4.2; Chen et al. (2019), "L-Shapley and C-Shapley", '
        "ICLR, §5"
    ),
    description="log-odds of ŷ before minus after removing the top fraction of the words",
)
class LogOddsDrop(PerturbationMetric):
    def sequences(self, ctx: Context, e: Explanation) -> list[list[int]]:
        k = n_words_for_fraction(ctx.config.log_odds_fraction, e.seg.n_words)
        return [ctx.without(e, e.order[:k])]

    def reduce(self, ctx: Context, e: Explanation, probs: np.ndarray) -> list[Row]:
        p = float(ctx.p_target(e, probs)[0])
        f = ctx.config.log_odds_fraction
        return [(LOG_ODDS_DROP, k_label(f), log_odds_drop(ctx.p_full[e.sample_id], p))]
