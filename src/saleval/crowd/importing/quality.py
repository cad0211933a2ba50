"""Quality filters on accepted crowd answers (docs/aggregation.md#quality-filters).

Each filter names whole workers to drop (a spammer's answers are all suspect),
and each is logged with the workers and the number of answers it removed.
Filters run in a fixed order (speed, "I don't know" everywhere, gold accuracy)
on what the previous ones left, so the counts add up to what was removed.

Settings: ``crowd.filters`` (:class:`saleval.config.crowd.FiltersConfig`).
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from saleval.config.crowd import FiltersConfig
from saleval.crowd.answers import IDK_CODE

log = logging.getLogger(__name__)


def bundle_seconds(annotations: pd.DataFrame) -> pd.Series:
    """Time each worker spent on their bundle: the sum of their per-answer durations.

    A worker takes one bundle per dataset (the importer enforces it), so this is
    per worker. NaN where no duration is known.
    """
    d = annotations.groupby("worker_id")["duration_s"]
    total = d.sum(min_count=1)
    return total.where(d.count() == d.size())


def too_fast(annotations: pd.DataFrame, min_seconds: float) -> list[str]:
    """Workers who finished their bundle in under ``min_seconds``."""
    if "duration_s" not in annotations or annotations["duration_s"].isna().all():
        return []
    secs = bundle_seconds(annotations)
    return sorted(secs.index[secs < float(min_seconds)].astype(str))


def all_idk(annotations: pd.DataFrame) -> list[str]:
    """Workers whose every answer was "I don't know"."""
    share = (annotations["answer_code"] == IDK_CODE).groupby(annotations["worker_id"]).mean()
    return sorted(share.index[share == 1.0].astype(str))


def gold_accuracy(annotations: pd.DataFrame) -> pd.Series:
    """Per worker, the share of gold (attention-check) questions answered correctly."""
    if "is_gold" not in annotations:
        return pd.Series(dtype="float64")
    g = annotations[annotations["is_gold"].astype(bool)]
    return (g["answer_code"] == g["label"] + 1).groupby(g["worker_id"]).mean()


def low_gold(annotations: pd.DataFrame, min_accuracy: float) -> list[str]:
    """Workers below ``min_accuracy`` on gold questions (workers without gold are kept)."""
    acc = gold_accuracy(annotations)
    return sorted(acc.index[acc < float(min_accuracy)].astype(str))


def apply_filters(
    annotations: pd.DataFrame, settings: FiltersConfig
) -> tuple[pd.DataFrame, pd.DataFrame, list[dict[str, Any]]]:
    """Run the configured filters; returns (kept answers, removed answers, log).

    ``removed`` holds ``worker_id, task_id, filter``; the log has one entry per
    filter: ``name, threshold, workers, n_workers, n_answers`` (and a ``note`` when a
    filter could not run, e.g. no timings).
    """
    steps: list[tuple[str, Any, Any]] = []
    if settings.min_bundle_seconds is not None:
        v = settings.min_bundle_seconds
        steps.append(("min_bundle_seconds", v, lambda a, v=v: too_fast(a, v)))
    if settings.all_idk:
        steps.append(("all_idk", True, all_idk))
    if settings.gold_min_accuracy is not None:
        v = settings.gold_min_accuracy
        steps.append(("gold_min_accuracy", v, lambda a, v=v: low_gold(a, v)))
    kept = annotations
    removed: list[pd.DataFrame] = []
    report: list[dict[str, Any]] = []
    for name, threshold, find in steps:
        workers = find(kept)
        drop = kept["worker_id"].isin(workers)
        entry: dict[str, Any] = {
            "name": name,
            "threshold": threshold,
            "workers": workers,
            "n_workers": len(workers),
            "n_answers": int(drop.sum()),
        }
        if name == "min_bundle_seconds" and (
            "duration_s" not in kept or kept["duration_s"].isna().all()
        ):
            entry["note"] = "no timings in the answers; filter not applied"
        if name == "gold_min_accuracy" and gold_accuracy(kept).empty:
            entry["note"] = "no gold questions answered; filter not applied"
        report.append(entry)
        if workers:
            log.info("filter %s removed %d workers, %d answers", name, len(workers), drop.sum())
            removed.append(kept.loc[drop, ["worker_id", "task_id"]].assign(filter=name))
        kept = kept.loc[~drop]
    removed_df = (
        pd.concat(removed, ignore_index=True)
        if removed
        else pd.DataFrame({"worker_id": [], "task_id": [], "filter": []}, dtype="string")
    )
    return kept.reset_index(drop=True), removed_df, report
