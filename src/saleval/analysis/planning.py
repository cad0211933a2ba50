r"""Plan a crowd study before paying for it (docs/planning.md): what a design would show,
and what it would cost.

A **pool** holds what a crowd can answer: per sample i, method j and k either the
aggregated verdict A[i, j, k] (the published crowd: its majority votes are all that
was published) or up to R individual answer codes (a simulated crowd: 0 = "I don't
know", c + 1 = class c, as everywhere, saleval.crowd.answers). A **design** (n samples,
methods, k grid, R answers per task, bundle size) is studied by drawing many studies of
it from the pool — samples with replacement, and R of the pool's answers per task,
aggregated by the study's strict majority
(:func:`saleval.crowd.importing.aggregation.unique_winner`) — and scoring each with the
formulas of docs/scores.md (:mod:`saleval.analysis.scoring`):

* ``p_best``: the share of studies whose top method is the reference's (ties share);
* ``spearman``: Spearman's ρ between a study's method scores and the reference's;
* ``ci_width``: the 2.5–97.5 % spread of a method's s_j over studies, i.e. the width
  of the 95 % interval a study of this size would report;
* ``p_order``: per adjacent pair of the reference ranking, the share of studies that
  order it the same way (ties count half);
* ``power``: the share of studies whose paired test against the baseline
  (:func:`saleval.analysis.scoring.paired_test`) rejects at ``alpha``.

The reference is the pool itself: for the published crowd, the scores of all its
samples (the published ranking); for a simulated crowd, the scores at the design's R
averaged over many draws of answers.

A simulated pool carries the simulated crowd's measured error (:class:`Discrepancy`,
docs/planning.md#discrepancy): each drawn study's scores get one per-method discrepancy,
as large as one of the out-of-sample validation residuals (the plan's dataset's own where
its crowd was validated, else all of them) and of either sign (real = simulated −
discrepancy), as reality = simulator + discrepancy in Kennedy & O'Hagan's calibration of
computer models.
The reference stays the simulated crowd's own ranking, so ``p_best`` is the chance that a
study of real people crowns the method the simulated crowd ranks first.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from saleval.analysis import scoring
from saleval.crowd.answers import AnswerParser
from saleval.crowd.importing.aggregation import unique_winner
from saleval.errors import UserError


class PlanError(UserError, ValueError):
    """A design or a pool that cannot be planned; the message names the field."""


@dataclass(frozen=True)
class Design:
    """One study design: ``n`` samples × ``methods`` × ``ks``, ``repeats`` answers per task,
    tasks in bundles of ``bundle_size`` (one worker answers one bundle)."""

    n: int
    methods: tuple[str, ...]
    ks: tuple[int, ...]
    repeats: int
    bundle_size: int

    @property
    def tasks(self) -> int:
        return self.n * len(self.methods) * len(self.ks)

    @property
    def answers(self) -> int:
        return self.tasks * self.repeats

    @property
    def bundles(self) -> int:
        """Bundles to fill: every task R times, ``bundle_size`` tasks per worker."""
        return math.ceil(self.tasks / self.bundle_size) * self.repeats


OWN_WEIGHT = 0.5
"""Chance that a method's drawn discrepancy is one of its own residuals rather than any
(:meth:`Discrepancy.draw`; docs/planning.md#discrepancy)."""


@dataclass(frozen=True)
class Discrepancy:
    """What the simulated crowd's method scores are measured to be off by: per method,
    simulated minus real s_j in points, each from a fit that did not see that method or
    that dataset (docs/simulated-crowd.md#out-of-sample). A method draws from its own
    residuals where they were measured and from all of them otherwise (occlusion, a
    method of your own). ``own``: the validated dataset whose own residuals these are
    (the plan's dataset); empty when they are pooled over every validated dataset.
    ``source`` says where the values come from."""

    residuals: Mapping[str, tuple[float, ...]]
    source: str
    own: str = ""

    def __post_init__(self) -> None:
        values = self.pooled
        if not values or not np.all(np.isfinite(values)):
            raise PlanError(
                f"simulation.discrepancy.residuals: {dict(self.residuals)}; need finite values "
                "(points of s_j, simulated minus real)"
            )

    @classmethod
    def from_config(
        cls,
        residuals: Mapping[str, Mapping[str, Mapping[str, float]]],
        source: str,
        own: str | None = None,
    ) -> Discrepancy:
        """From ``simulation.discrepancy`` (dataset → fit → method → points): the residuals
        of dataset ``own`` where given (a dataset with a validated crowd of its own), else
        all of them.

        >>> cfg = {"imdb": {"lomo": {"a": 1.0}}, "ag": {"x": {"a": 3.0, "b": -2.0}}}
        >>> d = Discrepancy.from_config(cfg, "")
        >>> dict(d.residuals), d.pooled
        ({'a': (1.0, 3.0), 'b': (-2.0,)}, (1.0, 3.0, -2.0))
        >>> dict(Discrepancy.from_config(cfg, "", own="ag").residuals)
        {'a': (3.0,), 'b': (-2.0,)}
        """
        if own is not None and own not in residuals:
            raise PlanError(
                f"simulation.discrepancy.residuals: no residuals for {own!r}; "
                f"measured for {sorted(residuals)}"
            )
        blocks = {own: residuals[own]} if own is not None else residuals
        per: dict[str, list[float]] = {}
        for fits in blocks.values():
            for errs in fits.values():
                for method, value in errs.items():
                    per.setdefault(str(method), []).append(float(value))
        return cls({m: tuple(v) for m, v in per.items()}, source, own or "")

    @property
    def pooled(self) -> tuple[float, ...]:
        return tuple(v for values in self.residuals.values() for v in values)

    @property
    def rms(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.pooled))))

    def draw(self, methods: Sequence[str], replicates: int, rng: np.random.Generator) -> np.ndarray:
        """(replicates, methods) discrepancies as scores (0–1): per study and method, the
        size of a residual drawn with replacement — with chance :data:`OWN_WEIGHT` one of
        that method's own, else any of them (always any for a method without its own) —
        with a random sign.

        The sign is drawn because a residual's direction belongs to the fit that measured
        it, one that left the method or the dataset out; the settings in use saw both, so
        what carries over is how far off the simulated crowd can be, not which way. A
        method's own residuals are two to four values, too few to stand alone; all of them
        say how far off the crowd is on any method; half and half weighs the two as
        partial pooling would with the pooled spread worth as many measurements as the
        method's own (docs/planning.md#discrepancy).

        >>> d = Discrepancy({"a": (2.0,), "b": (1.0, 3.0)}, "")
        >>> d.draw(["a", "b", "c"], 4, np.random.default_rng(1)).round(2).tolist()
        [[-0.02, 0.01, -0.03], [0.01, -0.01, 0.02], [-0.02, -0.01, -0.01], [-0.02, -0.02, -0.02]]
        """
        everything = np.abs(np.asarray(self.pooled, dtype=float))
        cols = []
        for m in methods:
            mine = np.abs(np.asarray(self.residuals.get(m, ()), dtype=float))
            size = rng.choice(everything, size=replicates)
            if len(mine):
                own = rng.random(replicates) < OWN_WEIGHT
                size = np.where(own, rng.choice(mine, size=replicates), size)
            cols.append(rng.choice(np.array([-1.0, 1.0]), size=replicates) * size)
        return np.stack(cols, axis=1) / 100.0


@dataclass
class Pool:
    """What a crowd can answer, per sample × method × k (module docstring)."""

    source: str  # "empirical" (real people) | "simulated"
    samples: list[str]
    methods: list[str]
    ks: list[int]
    repeats: int  # answers per task behind each verdict (published) or held (simulated)
    A: np.ndarray | None = None  # (N, J, K) verdicts, when only those exist
    codes: np.ndarray | None = None  # (N, J, K, R) answer codes, −1 = no answer
    target: np.ndarray | None = None  # (N,) the code of each sample's target answer
    n_options: int = 0  # answer codes 0..n_options-1 ("I don't know" + classes)
    origin: str = ""  # where the pool came from, for plan.md
    discrepancy: Discrepancy | None = None  # a simulated pool's measured error (module doc)
    _reference: dict[tuple[tuple[str, ...], tuple[int, ...], int], np.ndarray] = field(
        default_factory=dict, repr=False
    )

    @property
    def n_samples(self) -> int:
        return len(self.samples)

    def check(self, design: Design, where: Mapping[str, str]) -> None:
        """One located line per problem of ``design`` against this pool; ``where`` maps a
        design field (methods, ks, repeats, n, bundle_size) to its config key."""
        if not design.methods:
            raise PlanError(f"{where['methods']}: no methods; name at least two of {self.methods}")
        missing = [m for m in design.methods if m not in self.methods]
        if missing:
            raise PlanError(f"{where['methods']}: {missing} not in the pool; known: {self.methods}")
        bad_k = [k for k in design.ks if k not in self.ks]
        if not design.ks or bad_k:
            raise PlanError(
                f"{where['ks']}: {bad_k or '[]'} outside the k grid the crowd answered, {self.ks}"
            )
        if design.n < 2:
            raise PlanError(f"{where['n']}: {design.n}; a study needs at least 2 samples")
        if design.bundle_size < 1:
            raise PlanError(f"{where['bundle_size']}: {design.bundle_size}; must be >= 1")
        if self.codes is None and design.repeats != self.repeats:
            raise PlanError(
                f"{where['repeats']}: {design.repeats}; the {self.source} pool holds majority "
                f"verdicts of R = {self.repeats} answers only (single answers were not "
                f"published), so it can plan R = {self.repeats}; plan other R with the "
                "simulated crowd (plan.source=simulated or inputs.explain)"
            )
        if self.codes is not None and not 1 <= design.repeats <= self.repeats:
            raise PlanError(
                f"{where['repeats']}: {design.repeats}; the simulated pool holds "
                f"{self.repeats} answers per task; raise plan.pool_repeats to plan more"
            )

    def _axes(self, design: Design) -> tuple[list[int], list[int]]:
        return [self.methods.index(m) for m in design.methods], [
            self.ks.index(k) for k in design.ks
        ]

    def draw(
        self, design: Design, replicates: int, rng: np.random.Generator, replace: bool = True
    ) -> np.ndarray:
        """``replicates`` studies of ``design``: A of shape (B, n, J, K)."""
        js, ks = self._axes(design)
        if replace:
            idx = rng.integers(0, self.n_samples, size=(replicates, design.n))
        else:
            if design.n > self.n_samples:
                raise PlanError(f"n = {design.n} > the pool's {self.n_samples} samples")
            idx = np.argsort(rng.random((replicates, self.n_samples)), axis=1)[:, : design.n]
        if self.codes is None:
            assert self.A is not None
            return self.A[:, js][:, :, ks][idx]
        return self._thinned(self.codes[:, js][:, :, ks][idx], idx, design.repeats, rng)

    def _thinned(
        self, codes: np.ndarray, idx: np.ndarray, repeats: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Verdicts from ``repeats`` of each task's pool answers, drawn without replacement;
        ``codes`` (..., R_pool) of the samples ``idx``."""
        assert self.target is not None
        pick = np.argsort(rng.random(codes.shape), axis=-1)[..., :repeats]
        return verdicts(np.take_along_axis(codes, pick, axis=-1), self.target[idx], self.n_options)

    def reference(self, design: Design, rng: np.random.Generator, draws: int = 200) -> np.ndarray:
        """The scores s_j a study of every pool sample would approach (module docstring)."""
        key = (design.methods, design.ks, design.repeats)
        if key not in self._reference:
            js, ks = self._axes(design)
            if self.codes is None:
                assert self.A is not None
                p = scoring.accuracy(self.A[:, js][:, :, ks])
            else:
                codes, idx = self.codes[:, js][:, :, ks], np.arange(self.n_samples)
                n_draws = draws if design.repeats < self.repeats else 1  # all answers: no draw
                p = np.mean(
                    [
                        scoring.accuracy(self._thinned(codes, idx, design.repeats, rng))
                        for _ in range(n_draws)
                    ],
                    axis=0,
                )
            self._reference[key] = scoring.method_scores(np.nan_to_num(p))
        return self._reference[key]


def verdicts(codes: np.ndarray, target: np.ndarray, n_options: int) -> np.ndarray:
    """A = 1 where the target strictly beats every other answer (``(..., R)`` codes,
    ``target`` broadcast over the trailing method and k axes), else 0."""
    counts = (codes[..., None] == np.arange(n_options)).sum(axis=-2)  # (..., options)
    won = unique_winner(counts)
    t = target.reshape(target.shape + (1,) * (won.ndim - target.ndim))
    return (won == t).astype("float64")


def empirical_pool(aggregated: pd.DataFrame, repeats: int, origin: str) -> Pool:
    """The published crowd's verdicts as a pool (no single answers: R is fixed)."""
    cube = scoring.Cube.from_aggregated(aggregated)
    return Pool(
        "empirical", cube.samples, cube.methods, cube.ks, int(repeats), A=cube.A, origin=origin
    )


def simulated_pool(
    tasks: pd.DataFrame, answers: pd.DataFrame, label_names: Sequence[str], origin: str
) -> Pool:
    """A simulated crowd's single answers (``tables.ANSWERS``) to ``tasks`` as a pool."""
    parse = AnswerParser(label_names)
    study = tasks[~tasks["is_gold"].astype(bool)] if "is_gold" in tasks else tasks
    samples = sorted(study["sample_id"].astype(str).unique())
    methods = scoring.order_methods(study["method"].astype(str).unique())
    ks = sorted(int(k) for k in study["k"].unique())
    a = answers.merge(study[["task_id", "sample_id", "method", "k", "label"]], on="task_id")
    if a.empty:
        raise PlanError(f"{origin}: no answer belongs to a study task")
    a["code"] = a["answer"].astype(str).map(parse)
    a["slot"] = a.groupby("task_id").cumcount()
    R = int(a["slot"].max()) + 1
    codes = np.full((len(samples), len(methods), len(ks), R), -1, dtype="int8")
    si = a["sample_id"].astype(str).map({s: i for i, s in enumerate(samples)}).to_numpy()
    mi = a["method"].astype(str).map({m: i for i, m in enumerate(methods)}).to_numpy()
    ki = a["k"].astype(int).map({k: i for i, k in enumerate(ks)}).to_numpy()
    codes[si, mi, ki, a["slot"].to_numpy()] = a["code"].to_numpy()
    first = study.drop_duplicates("sample_id")
    label = pd.Series(first["label"].astype(int).to_numpy(), index=first["sample_id"].astype(str))
    target = label.loc[samples].to_numpy() + 1
    return Pool(
        "simulated",
        samples,
        methods,
        ks,
        R,
        codes=codes,
        target=target,
        n_options=len(label_names) + 1,
        origin=origin,
    )


@dataclass(frozen=True)
class Settings:
    """How hard to look (``plan.*``; saleval.config.plan.PlanConfig)."""

    replicates: int = 500
    power_replicates: int = 100
    test_resamples: int = 999
    alpha: float = 0.05
    level: float = 0.95
    baseline: str = scoring.BASELINE


def spearman_rows(s: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Spearman's ρ of each row of ``s`` (B, J) with ``ref`` (J,) or its own row of ``ref``
    (B, J); NaN for a constant row."""
    refs = np.broadcast_to(ref, s.shape)
    out = np.full(len(s), np.nan)
    for b, (row, r) in enumerate(zip(s, refs)):
        if np.ptp(row) > 0 and np.ptp(r) > 0:
            out[b] = float(stats.spearmanr(row, r).statistic)
    return out


def same_order(study: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """1 where a study's difference of two scores has the truth's sign, 0 where it has the
    other, ½ where either is a tie.

    >>> same_order(np.array([0.1, -0.1, 0.0]), np.array([0.2, 0.2, 0.2])).tolist()
    [1.0, 0.0, 0.5]
    """
    agree = np.sign(study) * np.sign(truth)
    return np.where(agree == 0, 0.5, (agree > 0).astype(float))


def predict(
    pool: Pool, design: Design, settings: Settings, rng: np.random.Generator, replace: bool = True
) -> tuple[dict[str, float], pd.DataFrame]:
    """What studies of ``design`` drawn from ``pool`` show (module docstring): one row of
    summaries and one row per method."""
    A = pool.draw(design, settings.replicates, rng, replace=replace)
    s = scoring.method_scores(np.nan_to_num(scoring.accuracy(A)))  # (B, J)
    ref = pool.reference(design, rng)
    J = len(design.methods)
    truth = np.broadcast_to(ref, s.shape)
    if pool.discrepancy is not None:  # drawn last: zero residuals change nothing
        # what real people would give: simulated − residual; judged against the simulated
        # reference, the ranking the plan is asked to confirm
        s = s - pool.discrepancy.draw(design.methods, len(s), rng)
    ranks = scoring.rank_desc(s, axis=1)
    top = ranks == 1
    true_top = truth == truth.max(axis=1, keepdims=True)  # ties share
    p_best = float(np.mean((top & true_top).sum(axis=1) / top.sum(axis=1) / true_top.sum(axis=1)))
    rho = spearman_rows(s, truth)
    q = [(1 - settings.level) / 2 * 100, (1 + settings.level) / 2 * 100]
    lo, hi = np.percentile(s, q, axis=0)
    order = list(np.argsort(-ref, kind="stable"))
    p_order = np.full(J, np.nan)  # of each method with the next one below it
    for a, b in itertools.pairwise(order):
        p_order[a] = float(np.mean(same_order(s[:, a] - s[:, b], truth[:, a] - truth[:, b])))
    power = np.full(J, np.nan)
    if settings.baseline in design.methods and settings.power_replicates > 0:
        base = design.methods.index(settings.baseline)
        hits = np.zeros(J)
        for b in range(min(settings.power_replicates, len(A))):
            pv = scoring.paired_test(A[b], base, n_resamples=settings.test_resamples, seed=b)
            hits += np.nan_to_num(pv, nan=1.0) < settings.alpha
        power = hits / min(settings.power_replicates, len(A))
        power[base] = np.nan
    per_method = pd.DataFrame(
        {
            "method": list(design.methods),
            "reference_score": 100 * ref,
            "reference_rank": scoring.rank_desc(ref),
            "mean_score": 100 * s.mean(axis=0),
            "ci_width": 100 * (hi - lo),
            "p_order_next": p_order,
            "power": power,
        }
    )
    adjacent = p_order[order[:-1]]
    row = {
        "p_best": p_best,
        "spearman_mean": float(np.nanmean(rho)) if np.isfinite(rho).any() else float("nan"),
        "spearman_p05": float(np.nanpercentile(rho, 5)) if np.isfinite(rho).any() else float("nan"),
        "ci_width_mean": float(100 * np.mean(hi - lo)),
        "ci_width_max": float(100 * np.max(hi - lo)),
        "p_order_min": float(np.nanmin(adjacent)) if len(adjacent) else float("nan"),
        "power_min": float(np.nanmin(power)) if np.isfinite(power).any() else float("nan"),
    }
    return row, per_method


def half_sample_check(
    pool: Pool, design: Design, settings: Settings, rng: np.random.Generator
) -> pd.DataFrame:
    """Predictions against what half-samples of the pool actually show (docs/planning.md#check).

    Half-samples (n = N/2 drawn without replacement) share half their samples with the
    reference, so they vary less than independent studies: by the finite-population
    correction their variance is that of studies of n/(1 − n/N) = N samples. The table
    holds the prediction for n = N/2 (what a new study of that size shows), the prediction
    for n = N (what half-samples should resemble), and the half-samples themselves.
    """
    N = pool.n_samples
    half = dataclasses.replace(design, n=N // 2)
    full = dataclasses.replace(design, n=N)
    quiet = dataclasses.replace(settings, power_replicates=0)
    rows = []
    for label, d, replace in (
        ("prediction, n = N/2", half, True),
        ("prediction, n = N (the half-samples' equivalent)", full, True),
        ("half-samples of the pool, n = N/2", half, False),
    ):
        row, _ = predict(pool, d, quiet, rng, replace=replace)
        rows.append(
            {
                "row": label,
                "n": d.n,
                "sampling": "with replacement" if replace else "without replacement",
                **{
                    k: row[k]
                    for k in (
                        "p_best",
                        "spearman_mean",
                        "spearman_p05",
                        "ci_width_mean",
                        "ci_width_max",
                        "p_order_min",
                    )
                },
            }
        )
    return pd.DataFrame(rows)
