"""The researcher's live figures of a study (docs/annotate.md#the-dashboard): progress,
pace, quality, and money spent and projected.

One function computes them (:func:`figures`); the dashboard page, its JSON and the
metrics the serving run logs to MLflow all show its result, and the money comes from
:func:`saleval.annotate.policy.participant_table`, the export's own rule.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from saleval.annotate import policy
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import Study
from saleval.config.annotate import AnnotateConfig

log = logging.getLogger(__name__)


def answer_seconds(answers: pd.DataFrame) -> pd.Series:
    """Seconds from a task shown to its answer, per answer (the export's ``duration_s``)."""
    started = pd.to_datetime(answers["started_at"], utc=True, format="ISO8601")
    submitted = pd.to_datetime(answers["submitted_at"], utc=True, format="ISO8601")
    return (submitted - started).dt.total_seconds()


def seconds_per_task(answers: pd.DataFrame, given: float | None) -> float | None:
    """The time per task pay is reckoned at: ``given`` (``pay.seconds_per_task`` or the
    pilot's median), else this study's own median answer time; None before any answer."""
    if given is not None:
        return float(given)
    if answers.empty:
        return None
    return float(answer_seconds(answers).median())


def figures(
    store: AnnotationStore,
    study: Study,
    settings: AnnotateConfig,
    seconds_hint: float | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Every figure of the dashboard; ``participants`` is the per-participant table."""
    now = now or datetime.now(UTC)
    records = policy.StudyRecords.read(store, study.run_key)
    progress = store.progress(study.run_key)
    secs = seconds_per_task(records.answers, seconds_hint)
    table = policy.participant_table(records, study, settings, secs)
    status = progress["status"].value_counts()
    n_bundles = len(progress)
    done = int(status.get("completed", 0))
    leased = int(status.get("active", 0) + status.get("expired", 0))
    answers = records.answers
    submitted = pd.to_datetime(answers["submitted_at"], utc=True, format="ISO8601")
    window = settings.dashboard.rate_window_minutes
    recent = int((submitted >= pd.Timestamp(now - timedelta(minutes=window))).sum())
    starts = (
        pd.to_datetime(records.assignments["assigned_at"], utc=True, format="ISO8601").tolist()
        + pd.to_datetime(records.participants["first_seen_at"], utc=True, format="ISO8601").tolist()
    )
    began = min(starts) if starts else None
    elapsed_min = (now - began).total_seconds() / 60 if began is not None else 0.0
    durations = answer_seconds(answers) if len(answers) else pd.Series(dtype=float)
    gold = policy.gold_answers(answers, study, settings.attention.idk_fails)
    att = records.attempts
    took = table[table["comprehension"].isin(["passed", "screened out"])]
    spent = policy.totals(table, settings.pay)
    # what each bundle still open will cost once completed: its own reward
    open_sizes = progress.loc[progress["status"] != "completed", "n_tasks"].astype(int)
    to_come = sum(policy.reward_per_bundle(settings.pay, int(n), secs) for n in open_sizes)
    left = len(open_sizes)
    rate = done / elapsed_min if elapsed_min > 0 else 0.0  # bundles per minute
    return {
        "bundles": n_bundles,
        "bundles_done": done,
        "bundles_leased": leased,
        "bundles_free": n_bundles - done - leased,
        "answers": len(answers),
        "answers_per_minute": recent / window if window > 0 else float("nan"),
        "median_task_s": float(durations.median()) if len(durations) else float("nan"),
        "seconds_per_task": float("nan") if secs is None else secs,
        "participants_n": len(table),
        "gold_accuracy": float(gold["correct"].mean()) if len(gold) else float("nan"),
        "flagged": int((table["decision"] == policy.Decision.reject).sum()),
        "comprehension_failures": int((att["passed"] == 0).sum()) if len(att) else 0,
        "screened_out": int((table["comprehension"] == "screened out").sum()),
        "comprehension_pass_rate": (
            float((took["comprehension"] == "passed").mean()) if len(took) else float("nan")
        ),
        "elapsed_minutes": elapsed_min,
        "spent": spent["total"],
        "projected_total": round(spent["total"] + to_come * (1 + settings.pay.fee), 2),
        "projected_minutes_left": left / rate if rate > 0 else float("nan"),
        "currency": settings.pay.currency,
        "participants": table,
    }


NUMERIC = [
    "bundles",
    "bundles_done",
    "bundles_leased",
    "bundles_free",
    "answers",
    "answers_per_minute",
    "median_task_s",
    "gold_accuracy",
    "flagged",
    "comprehension_failures",
    "screened_out",
    "comprehension_pass_rate",
    "elapsed_minutes",
    "spent",
    "projected_total",
    "projected_minutes_left",
]
"""The figures logged to MLflow (``dashboard_<name>``), step = minutes since the start."""


def metrics_of(figs: dict[str, Any]) -> dict[str, float]:
    """The finite numeric figures under ``dashboard_`` keys (the project's key style,
    :func:`saleval.pipeline.records.run_naming.metric_key`); a NaN is left out, not logged."""
    out = {f"dashboard_{k}": float(figs[k]) for k in NUMERIC}
    return {k: v for k, v in out.items() if np.isfinite(v)}


class MetricsLogger:
    """Logs the figures to the serving run every ``dashboard.log_every_s`` seconds, from a
    thread, through MLflow's client with the run's id (the fluent API's active run is the
    main thread's). A failed log is a warning: the study goes on."""

    def __init__(self, compute: Any, run_id: str | None, every_s: float) -> None:
        self.compute, self.run_id, self.every_s = compute, run_id, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = datetime.now(UTC)

    def __enter__(self) -> MetricsLogger:
        if self.run_id and self.every_s > 0:
            self._thread = threading.Thread(target=self._loop, name="dashboard-mlflow", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.log_once()  # the final figures, whatever the interval

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.log_once()

    def log_once(self) -> None:
        if not self.run_id:
            return
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        try:
            values = metrics_of(self.compute())
            step = int((datetime.now(UTC) - self._t0).total_seconds() // 60)
            stamp = int(datetime.now(UTC).timestamp() * 1000)
            MlflowClient().log_batch(
                self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in values.items()]
            )
        except Exception as err:
            log.warning("dashboard metrics not logged to MLflow: %s", err)
