"""A paid study's rules, each in one function: which gold answers fail an attention
check, what each participant's decision is (approve, reject, return) and why, and what
they are paid (docs/annotate.md#running-a-paid-study).

The rules follow Prolific's for researchers: a participant is flagged for rejection only
after failing ``attention.max_failures`` (default 2) fair attention checks; one who fails
the comprehension check is screened out and asked to return the study, never rejected;
partial pay goes through bonuses. The dashboard, the MLflow metrics and the export all
read :func:`participant_table`, so the three never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from saleval.analysis.costing import Costing
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import Study
from saleval.config.annotate import AnnotateConfig, AttentionConfig, PayConfig
from saleval.vocab import IDK


class Decision(StrEnum):
    """What the researcher does with a participant's submission on the platform."""

    approve = "approve"  # completed bundle, attention checks passed: pay the reward
    reject = "reject"  # failed at least attention.max_failures attention checks
    return_ = "return"  # screened out or did not finish: ask them to return (bonus if due)
    pending = "pending"  # still working on their bundle


def gold_answers(answers: pd.DataFrame, study: Study, idk_fails: bool) -> pd.DataFrame:
    """The answers to gold questions with ``correct`` and ``failed``: a gold answer fails
    the attention check when it is another label (and, with ``idk_fails``, "I don't know").

    "I don't know" is a proper answer in these tasks (the instructions say so); counting
    it as a failure is the study's choice (``annotate.attention.idk_fails``)."""
    tasks = study.tasks
    gold_ids = tasks.index[tasks["is_gold"].astype(bool)] if "is_gold" in tasks else []
    g = answers[answers["task_id"].isin(gold_ids)].copy()
    right = [study.label_names[int(tasks.at[t, "label"])] for t in g["task_id"]]
    g["correct"] = g["answer"].to_numpy() == np.asarray(right, dtype=object)
    g["failed"] = ~g["correct"] & ((g["answer"] != IDK) | idk_fails)
    return g


def reward_per_bundle(pay: PayConfig, n_tasks: int, seconds_per_task: float | None) -> float:
    """The reward for a completed bundle: ``pay.reward``, else the planner's pay for its
    answers at ``pay.hourly_rate`` (:meth:`Costing.pay`), rounded to cents; NaN when no
    time per task is known yet.

    >>> reward_per_bundle(PayConfig(hourly_rate=9.0), 20, 12.0)
    0.6
    >>> reward_per_bundle(PayConfig(reward=1.5), 20, None)
    1.5
    """
    if pay.reward is not None:
        return float(pay.reward)
    if seconds_per_task is None or not seconds_per_task > 0:
        return float("nan")
    return round(Costing(seconds_per_task, pay.hourly_rate, pay.fee).pay(n_tasks), 2)


@dataclass(frozen=True)
class StudyRecords:
    """What the store holds about one task set, read once for the rules below."""

    participants: pd.DataFrame
    assignments: pd.DataFrame
    answers: pd.DataFrame
    attempts: pd.DataFrame

    @classmethod
    def read(cls, store: AnnotationStore, run_key: str) -> StudyRecords:
        return cls(
            participants=store.participants(run_key),
            assignments=store.assignments(run_key),
            answers=store.answers(run_key),
            attempts=store.comprehension_attempts(run_key),
        )


COLUMNS = [
    "worker_id",
    "decision",
    "reason",
    "bundle_id",
    "n_answered",
    "n_tasks",
    "gold_answered",
    "gold_correct",
    "gold_failed",
    "gold_accuracy",
    "comprehension_attempts",
    "comprehension",
    "reward",
    "bonus",
    "bonus_reason",
    "completion_code",
    "first_seen_at",
    "completed_at",
]


def participant_table(
    records: StudyRecords,
    study: Study,
    settings: AnnotateConfig,
    seconds_per_task: float | None,
) -> pd.DataFrame:
    """One row per participant (``COLUMNS``): their decision and its reason, their gold
    record, and what they are paid: ``reward`` on approval, ``bonus`` for partial work,
    gold answers or a screen-out (before the platform's fee)."""
    gold = gold_answers(records.answers, study, settings.attention.idk_fails)
    per_gold = gold.groupby("worker_id").agg(
        gold_answered=("correct", "size"),
        gold_correct=("correct", "sum"),
        gold_failed=("failed", "sum"),
    )
    people = list(
        dict.fromkeys(
            [*records.participants["worker_id"].tolist(), *records.assignments["worker_id"]]
        )
    )
    part = records.participants.set_index("worker_id")
    rows = []
    for w in people:
        held = records.assignments[records.assignments["worker_id"] == w]
        # their latest assignment: the one completed, else the last made
        done = held[held["completed_at"].notna()]
        a = (done if len(done) else held).tail(1)
        n_answered = int(held["n_answered"].sum())
        g = per_gold.loc[w] if w in per_gold.index else None
        p = part.loc[w] if w in part.index else None
        row = {
            "worker_id": w,
            "bundle_id": a["bundle_id"].iloc[0] if len(a) else None,
            "n_answered": n_answered,
            "n_tasks": int(a["n_tasks"].iloc[0]) if len(a) else 0,
            "gold_answered": int(g["gold_answered"]) if g is not None else 0,
            "gold_correct": int(g["gold_correct"]) if g is not None else 0,
            "gold_failed": int(g["gold_failed"]) if g is not None else 0,
            "comprehension_attempts": int(p["attempts"]) if p is not None else 0,
            "comprehension": _comprehension(p, settings),
            "completion_code": a["completion_code"].iloc[0] if len(a) else None,
            "completed_at": a["completed_at"].iloc[0] if len(a) else None,
            "first_seen_at": p["first_seen_at"]
            if p is not None
            else (held["assigned_at"].min() if len(held) else None),
            "active": bool(
                len(a) and pd.isna(a["completed_at"].iloc[0]) and pd.isna(a["released_at"].iloc[0])
            ),
        }
        row["gold_accuracy"] = (
            row["gold_correct"] / row["gold_answered"] if row["gold_answered"] else float("nan")
        )
        row["decision"], row["reason"] = decide(row, settings)
        row["reward"], row["bonus"], row["bonus_reason"] = payment(
            row, settings.pay, reward_per_bundle(settings.pay, row["n_tasks"], seconds_per_task)
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _comprehension(p: pd.Series | None, settings: AnnotateConfig) -> str:
    """Where the participant stands with the check, from what the store holds (an
    export given other ``comprehension.*`` settings than the server still reads it)."""
    if p is not None and isinstance(p["passed_at"], str):
        return "passed"
    if p is not None and isinstance(p["screened_out_at"], str):
        return "screened out"
    if p is not None and int(p["attempts"]):
        return "failed, may retry"
    return "not taken" if settings.comprehension.enabled else "not asked"


def flagged(failed: int, attention: AttentionConfig) -> bool:
    """Flagged for rejection: at least ``attention.max_failures`` failed attention checks
    (0 turns the policy off).

    >>> flagged(1, AttentionConfig()), flagged(2, AttentionConfig())
    (False, True)
    """
    return attention.max_failures > 0 and failed >= attention.max_failures


def decide(row: Mapping[str, Any], settings: AnnotateConfig) -> tuple[str, str]:
    """A participant's decision and the reason the platform is given.

    The order matters: a screen-out is never a rejection; failed attention checks are
    judged before completion (a flagged participant who finished is still flagged)."""
    att = settings.attention
    failed, asked = int(row["gold_failed"]), int(row["gold_answered"])
    if row["comprehension"] == "screened out":
        return Decision.return_, (
            f"screened out: failed the comprehension check {settings.comprehension.attempts} times"
        )
    if flagged(failed, att):
        return Decision.reject, f"failed {failed} of {asked} attention checks"
    if row["completed_at"] is not None and not pd.isna(row["completed_at"]):
        return Decision.approve, f"completed bundle {row['bundle_id']} ({row['n_tasks']} tasks)"
    if row["active"]:
        return Decision.pending, f"working: {row['n_answered']} of {row['n_tasks']} answered"
    if row["bundle_id"] is None and row["comprehension"] in ("failed, may retry", "not taken"):
        return Decision.pending, "taking the comprehension check"
    if row["bundle_id"] is None:
        return Decision.return_, "no bundle was free for them"
    return Decision.return_, f"did not finish: {row['n_answered']} of {row['n_tasks']} answered"


def payment(row: Mapping[str, Any], pay: PayConfig, reward: float) -> tuple[float, float, str]:
    """(reward, bonus, why) for one participant, before the platform's fee."""
    decision = row["decision"]
    if decision == Decision.approve:
        bonus = round(pay.gold_bonus * int(row["gold_correct"]), 2)
        return reward, bonus, f"{row['gold_correct']} gold answers right" if bonus else ""
    if decision == Decision.return_ and row["comprehension"] == "screened out":
        return 0.0, round(pay.screen_out, 2), "screened out" if pay.screen_out else ""
    if decision == Decision.return_ and pay.partial and int(row["n_answered"]):
        share = int(row["n_answered"]) / max(int(row["n_tasks"]), 1)
        bonus = round(reward * share, 2) if np.isfinite(reward) else float("nan")
        return 0.0, bonus, f"partial work: {row['n_answered']} of {row['n_tasks']} answered"
    return 0.0, 0.0, ""


def totals(table: pd.DataFrame, pay: PayConfig) -> dict[str, float]:
    """What the study has cost so far: rewards, bonuses and the platform's fee on both."""
    rewards = float(table["reward"].fillna(0).sum())
    bonuses = float(table["bonus"].fillna(0).sum())
    return {
        "rewards": round(rewards, 2),
        "bonuses": round(bonuses, 2),
        "fee": round((rewards + bonuses) * pay.fee, 2),
        "total": round((rewards + bonuses) * (1 + pay.fee), 2),
    }
