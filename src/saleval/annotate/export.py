"""Answers out of the store in the import format (``tables.ANSWERS``, docs/aggregation.md#import).

Columns: ``worker_id, task_id, answer, started_at, submitted_at`` (ISO 8601 UTC), then
``bundle_id, position, duration_s``. ``answer`` is a label name or "I don't know" —
exactly what the import stage accepts — and every ``task_id`` is one of the served
``tasks.csv``, checked here so an export never carries a row the import would reject.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pandas as pd

from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import Study
from saleval.errors import UserError
from saleval.pipeline import tables

COMPLETIONS = "completions.csv"
RELEASED = "released.csv"


class ExportError(UserError, RuntimeError):
    """The store holds answers that do not fit the served task set."""


def answers_frame(
    store: AnnotationStore,
    study: Study,
    complete_only: bool = False,
    exclude: Collection[str] = (),
) -> pd.DataFrame:
    """Committed answers of ``study`` as a validated ``tables.ANSWERS`` frame, without
    those of the workers in ``exclude`` (participants flagged for rejection)."""
    raw = store.answers(study.run_key)  # released assignments' answers too (acknowledged)
    if complete_only:
        raw = raw[raw["bundle_complete"].astype(bool)]
    if exclude:
        raw = raw[~raw["worker_id"].isin(list(exclude))]
    df = raw.drop(columns=["bundle_complete"]).reset_index(drop=True)
    started = pd.to_datetime(df["started_at"], utc=True, format="ISO8601")
    submitted = pd.to_datetime(df["submitted_at"], utc=True, format="ISO8601")
    df["duration_s"] = (submitted - started).dt.total_seconds().astype("float64")
    unknown = ~df["task_id"].isin(study.tasks.index)
    if unknown.any():
        row = int(unknown.to_numpy().nonzero()[0][0])
        raise ExportError(
            f"{store.path}: answer row {row + 1} names task {df['task_id'].iloc[row]!r}, "
            f"which is not in {study.tasks_dir / tables.TASKS.filename}"
        )
    bad = ~df["answer"].isin(study.options)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise ExportError(
            f"{store.path}: answer row {row + 1}, field 'answer': {df['answer'].iloc[row]!r} "
            f"is not one of {list(study.options)}"
        )
    return tables.ANSWERS.validate(df, where=f"export of {store.path}")


def to_csv_bytes(df: pd.DataFrame) -> bytes:
    """The same bytes ``tables.ANSWERS.write`` puts on disk, for the admin download."""
    return df.to_csv(index=False).encode("utf-8")


def write_completions(store: AnnotationStore, study: Study, run_dir: str | Path) -> Path:
    """``completions.csv``: worker, bundle, completion code, when (to check payment claims)."""
    path = Path(run_dir) / COMPLETIONS
    store.completions(study.run_key).to_csv(path, index=False)
    return path


def write_released(store: AnnotationStore, study: Study, run_dir: str | Path) -> Path:
    """``released.csv``: assignments taken back (lease ran out, admin); their answers are
    in ``answers.csv`` all the same, as answers of bundles not completed."""
    path = Path(run_dir) / RELEASED
    store.released(study.run_key).to_csv(path, index=False)
    return path
