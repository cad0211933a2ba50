"""What a crowd study costs (docs/planning.md#cost): the one pay rule, shared by the
planner (``saleval-plan``) and the annotation app's rewards (docs/annotate.md#payments),
and the cheapest design that meets the plan's targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from saleval.analysis.planning import Design, PlanError


@dataclass(frozen=True)
class Costing:
    """Money and time: ``seconds_per_task`` per answer, paid at ``hourly_rate`` (in
    ``currency``) plus the platform's ``fee`` as a fraction of the pay."""

    seconds_per_task: float
    hourly_rate: float
    fee: float = 0.0
    currency: str = "GBP"
    seconds_source: str = "default"

    def __post_init__(self) -> None:
        if not self.hourly_rate > 0:
            raise PlanError(f"plan.cost.hourly_rate: {self.hourly_rate}; must be > 0")
        if not self.seconds_per_task > 0:
            raise PlanError(f"plan.cost.seconds_per_task: {self.seconds_per_task}; must be > 0")
        if self.fee < 0:
            raise PlanError(f"plan.cost.fee: {self.fee}; must be >= 0 (a fraction of the pay)")

    def pay(self, answers: int) -> float:
        """What ``answers`` answers pay the workers, before the fee (the app's reward per
        bundle is this rule too: docs/annotate.md#payments)."""
        return answers * self.seconds_per_task / 60 / 60 * self.hourly_rate  # minutes, hours

    def of(self, design: Design) -> dict[str, float]:
        return {
            "tasks": design.tasks,
            "answers": design.answers,
            "bundles": design.bundles,
            "worker_minutes": design.answers * self.seconds_per_task / 60,
            "cost": self.pay(design.answers) * (1 + self.fee),
        }


def cheapest(table: pd.DataFrame, p_best: float, spearman: float) -> pd.Series | None:
    """The least costly design whose ``p_best`` and ``spearman_mean`` meet the targets."""
    ok = table[(table["p_best"] >= p_best) & (table["spearman_mean"] >= spearman)]
    if ok.empty:
        return None
    return ok.sort_values(["cost", "n"], kind="stable").iloc[0]
