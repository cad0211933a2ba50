"""What a paid study's export writes beside ``answers.csv``
(docs/annotate.md#running-a-paid-study): each participant's decision and pay, the
platform's bulk files, the totals set beside the planner's cost, and for a pilot its
report (time per task and bundle, the pay they imply, comprehension and gold rates) with
the planner's designs re-costed at the measured times.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis import costing
from saleval.annotate import policy
from saleval.annotate.dashboard import answer_seconds, seconds_per_task
from saleval.annotate.study import Study
from saleval.config.annotate import AnnotateConfig
from saleval.pipeline import tables

PARTICIPANTS = "participants.csv"
APPROVALS = "approvals.csv"
REJECTIONS = "rejections.csv"
BONUSES = "bonuses.csv"
PROLIFIC_APPROVE = "prolific_approve.txt"
PROLIFIC_BONUS = "prolific_bonus.txt"
PAYMENTS = "payments.json"
PILOT = "pilot.json"
PILOT_MD = "pilot.md"
PILOT_PLAN = "pilot_plan.csv"


@dataclass(frozen=True)
class PaidExport:
    """The files written and the figures logged."""

    files: list[Path]
    metrics: dict[str, float]
    table: pd.DataFrame


def write_payments(
    run_dir: Path,
    records: policy.StudyRecords,
    study: Study,
    settings: AnnotateConfig,
    seconds_hint: float | None,
) -> PaidExport:
    """participants.csv (every participant: decision, reason, pay), the bulk files
    (approvals, rejections with reasons, bonuses) and payments.json (the totals beside
    what the planner's rule says the served bundles cost)."""
    secs = seconds_per_task(records.answers, seconds_hint)
    table = policy.participant_table(records, study, settings, secs)
    files = [run_dir / n for n in (PARTICIPANTS, APPROVALS, REJECTIONS, BONUSES)]
    table.to_csv(files[0], index=False)
    approved = table[table["decision"] == policy.Decision.approve]
    approved[["worker_id", "completion_code"]].to_csv(files[1], index=False)
    rejected = table[table["decision"] == policy.Decision.reject]
    rejected[["worker_id", "reason"]].to_csv(files[2], index=False)
    bonus = table[table["bonus"].fillna(0) > 0]
    bonus = bonus.assign(amount=bonus["bonus"].map(lambda x: f"{x:.2f}"))
    bonus[["worker_id", "amount", "bonus_reason"]].rename(
        columns={"bonus_reason": "reason"}
    ).to_csv(files[3], index=False)
    # Prolific's own boxes: bulk approve takes IDs one per line, bulk bonus "ID,amount"
    (run_dir / PROLIFIC_APPROVE).write_text("".join(f"{w}\n" for w in approved["worker_id"]))
    (run_dir / PROLIFIC_BONUS).write_text(
        "".join(f"{w},{a}\n" for w, a in zip(bonus["worker_id"], bonus["amount"]))
    )
    files += [run_dir / PROLIFIC_APPROVE, run_dir / PROLIFIC_BONUS]

    pay = settings.pay
    spent = policy.totals(table, pay)
    n_answers = len(study.bundles)
    sizes = study.bundles.groupby("bundle_id").size()
    planned = (
        costing.Costing(secs, pay.hourly_rate, pay.fee).pay(n_answers) * (1 + pay.fee)
        if secs
        else float("nan")
    )
    at_reward = sum(policy.reward_per_bundle(pay, int(n), secs) for n in sizes) * (1 + pay.fee)
    summary: dict[str, Any] = {
        "currency": pay.currency,
        "seconds_per_task": secs,
        "seconds_source": "annotate.pay.seconds_per_task"
        if pay.seconds_per_task is not None
        else ("the pilot's median" if seconds_hint is not None else "this study's median"),
        "hourly_rate": pay.hourly_rate,
        "fee": pay.fee,
        "decisions": {str(k): int(v) for k, v in table["decision"].value_counts().items()},
        **spent,
        "bundles": len(sizes),
        "answers_planned": n_answers,
        # every served bundle completed and approved: what the planner's rule says it costs
        "planned_cost": _round(planned),
        "cost_at_reward": _round(at_reward),
    }
    files.append(run_dir / PAYMENTS)
    files[-1].write_text(json.dumps(summary, indent=2) + "\n")
    metrics = {f"pay_{k}": float(v) for k, v in spent.items()} | {
        f"n_{k}": float(v) for k, v in summary["decisions"].items()
    }
    return PaidExport(files, metrics, table)


def _round(x: float) -> float | None:
    """Money and rates to cents; None where nothing was measured."""
    return round(float(x), 2) if np.isfinite(x) else None


def _seconds(x: float) -> float | None:
    """Times as measured (the main study reckons its pay at the pilot's median)."""
    return float(x) if np.isfinite(x) else None


def pilot_report(
    run_dir: Path,
    records: policy.StudyRecords,
    pilot: Study,
    main: Study,
    settings: AnnotateConfig,
    table: pd.DataFrame,
    plan_dir: Path | None,
    plan_cfg: DictConfig | None,
) -> PaidExport:
    """pilot.json and pilot.md: median seconds per task, per bundle and per submission
    (start page to last answer, what the platform's median counts), the hourly pay that
    implies at the reward and the reward the hourly rate asks for, the comprehension pass
    rate and the gold accuracy; the main study and, with ``plan_dir``, every design of
    the plan re-costed at the measured time per task (pilot_plan.csv)."""
    pay = settings.pay
    answers = records.answers
    task_s = float(answer_seconds(answers).median()) if len(answers) else float("nan")
    done = records.assignments[records.assignments["completed_at"].notna()]
    bundle_s = _median_between(done["assigned_at"], done["completed_at"])
    seen = records.participants.set_index("worker_id")["first_seen_at"]
    starts = done["worker_id"].map(seen).fillna(done["assigned_at"])
    submission_s = _median_between(starts, done["completed_at"])
    reward = (
        policy.reward_per_bundle(pay, int(done["n_tasks"].median()), task_s)
        if len(done)
        else float("nan")
    )
    took = table[table["comprehension"].isin(["passed", "screened out"])]
    gold = policy.gold_answers(answers, pilot, settings.attention.idk_fails)
    rule = costing.Costing(task_s, pay.hourly_rate, pay.fee) if task_s > 0 else None
    report: dict[str, Any] = {
        "participants": len(table),
        "bundles_completed": len(done),
        "answers": len(answers),
        "median_task_s": _seconds(task_s),
        "median_bundle_s": _seconds(bundle_s),
        "median_submission_s": _seconds(submission_s),
        "reward": _round(reward) if pay.reward is not None else None,
        "hourly_pay_at_reward": (
            _round(pay.reward / submission_s * 3600)
            if pay.reward is not None and submission_s > 0
            else None
        ),
        "reward_for_hourly_rate": _round(pay.hourly_rate * submission_s / 3600),
        "hourly_rate": pay.hourly_rate,
        "currency": pay.currency,
        "comprehension_pass_rate": (
            _round(float((took["comprehension"] == "passed").mean())) if len(took) else None
        ),
        "gold_accuracy": _round(float(gold["correct"].mean())) if len(gold) else None,
        "main_bundles": len(main.bundle_ids),
        "main_answers": len(main.bundles),
        "main_cost_at_pilot_times": (
            _round(rule.pay(len(main.bundles)) * (1 + pay.fee)) if rule else None
        ),
    }
    files = [run_dir / PILOT, run_dir / PILOT_MD]
    recosted = None
    if plan_dir is not None and task_s > 0:
        recosted, report["plan"] = recost_plan(plan_dir, plan_cfg, task_s)
        files.append(run_dir / PILOT_PLAN)
        recosted.to_csv(files[-1], index=False)
    files[0].write_text(json.dumps(report, indent=2) + "\n")
    files[1].write_text(pilot_markdown(report))
    metrics = {
        f"pilot_{k}": float(v)
        for k, v in report.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return PaidExport(files, metrics, table)


def _median_between(start: pd.Series, end: pd.Series) -> float:
    if not len(end):
        return float("nan")
    a = pd.to_datetime(start, utc=True, format="ISO8601")
    b = pd.to_datetime(end, utc=True, format="ISO8601")
    return float((b - a).dt.total_seconds().median())


def recost_plan(
    plan_dir: Path, plan_cfg: DictConfig | None, task_s: float
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The plan's designs with ``worker_minutes`` and ``cost`` at the pilot's time per task
    (the plan's own hourly rate and fee), and its recommendation before and after."""
    plan = tables.PLAN.read(plan_dir)
    cost = OmegaConf.select(plan_cfg, "plan.cost", default=None) if plan_cfg else None
    rate = float(OmegaConf.select(cost, "hourly_rate", default=9.0)) if cost else 9.0
    fee = float(OmegaConf.select(cost, "fee", default=0.0)) if cost else 0.0
    target = OmegaConf.select(plan_cfg, "plan.target", default=None) if plan_cfg else None
    p_best = float(OmegaConf.select(target, "p_best", default=0.9)) if target else 0.9
    rho = float(OmegaConf.select(target, "spearman", default=0.9)) if target else 0.9
    rule = costing.Costing(task_s, rate, fee)
    out = plan.assign(
        cost_planned=plan["cost"],
        worker_minutes=plan["answers"] * task_s / 60,
        cost=[rule.pay(int(a)) * (1 + fee) for a in plan["answers"]],
    )
    before = costing.cheapest(plan, p_best, rho)
    after = costing.cheapest(out, p_best, rho)
    summary = {
        "seconds_per_task": task_s,
        "recommended_before": None if before is None else int(before["design"]),
        "recommended": None if after is None else int(after["design"]),
        "recommended_cost": None if after is None else _round(float(after["cost"])),
    }
    return out, summary


def pilot_markdown(r: dict[str, Any]) -> str:
    def show(x: Any, unit: str = "") -> str:
        return "—" if x is None else f"{x}{unit}"

    lines = [
        "# Pilot",
        "",
        f"* Participants: {r['participants']}; bundles completed: {r['bundles_completed']}; "
        f"answers: {r['answers']}",
        f"* Median seconds per task: {show(r['median_task_s'])}; per bundle: "
        f"{show(r['median_bundle_s'])}; per submission (start page to last answer): "
        f"{show(r['median_submission_s'])}",
        f"* Hourly pay at the reward ({show(r['reward'], ' ' + r['currency'])}): "
        f"{show(r['hourly_pay_at_reward'], ' ' + r['currency'])}; the reward "
        f"{r['hourly_rate']} {r['currency']}/hour asks for: "
        f"{show(r['reward_for_hourly_rate'], ' ' + r['currency'])}",
        f"* Comprehension pass rate: {show(r['comprehension_pass_rate'])}; gold accuracy: "
        f"{show(r['gold_accuracy'])}",
        f"* Main study: {r['main_bundles']} bundles, {r['main_answers']} answers, "
        f"{show(r['main_cost_at_pilot_times'], ' ' + r['currency'])} at the pilot's time per task",
    ]
    if "plan" in r:
        p = r["plan"]
        lines.append(
            f"* The plan re-costed at {p['seconds_per_task']:.1f} s per task: recommended design "
            f"{show(p['recommended'])} ({show(p['recommended_cost'])}), before: "
            f"{show(p['recommended_before'])} (pilot_plan.csv)"
        )
    return "\n".join(lines) + "\n"
