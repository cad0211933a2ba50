"""``plan.*``: the designs ``saleval-plan`` studies and how (docs/planning.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class PlanSource(StrEnum):
    """Where a plan's noise comes from (docs/planning.md#sources)."""

    empirical = "empirical"  # the published crowd's own verdicts (real people)
    simulated = "simulated"  # the validated simulated crowd (docs/simulated-crowd.md)


@dataclass
class PlanTarget:
    """What a study must achieve for its design to count (the cheapest such is recommended)."""

    p_best: float = 0.9  # probability that the study's best method is the reference's
    spearman: float = 0.9  # expected Spearman's rho with the reference ranking


@dataclass
class PlanCost:
    """What an answer costs. ``seconds_per_task`` null: the median answer time of
    ``inputs.answers`` when given, else the simulated crowd's timing model at the design's
    mean k (docs/planning.md#cost)."""

    seconds_per_task: float | None = None
    hourly_rate: float = 9.0  # paid per worker-hour, in `currency`
    fee: float = 0.0  # the platform's fee as a fraction of the pay (e.g. 0.33)
    currency: str = "GBP"


@dataclass
class PlanConfig:
    """The design grid (every combination is one design) and the simulation effort."""

    source: PlanSource | None = None  # null: empirical for crowd=..., simulated for an explain run
    n: list[int] = field(default_factory=lambda: [10, 20, 30, 40, 50, 70, 100])
    repeats: list[int] | None = None  # R answers per task; null: the source's own (published 5)
    methods: list[list[str]] | None = None  # method sets; null: every method of the source
    ks: list[list[int]] | None = None  # k grids; null: the source's k grid
    bundle_size: int = 100  # tasks per worker (one bundle each)
    pool_repeats: int = 5  # simulated source: answers held per task (R can go up to this)
    replicates: int = 500  # studies drawn per design
    power_replicates: int = 100  # of those, how many get the paired test (the slow part)
    test_resamples: int = 999  # sign flips per paired test
    alpha: float = 0.05
    level: float = 0.95  # the interval whose width is predicted
    baseline: str = "random"
    # simulated source: add the simulated crowd's measured discrepancy (simulation.discrepancy)
    # to every drawn study and its reference; false: take the simulated crowd at its word
    discrepancy: bool = True
    half_sample_check: bool = True  # empirical: set predictions beside half-samples (n = N/2)
    target: PlanTarget = field(default_factory=PlanTarget)
    cost: PlanCost = field(default_factory=PlanCost)
    seed: int = 0
