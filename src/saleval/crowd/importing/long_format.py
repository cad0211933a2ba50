"""The long answer format (docs/aggregation.md#import): one answer per row.

``worker_id, task_id`` (or ``bundle_id + position``), ``answer``, and
``started_at/submitted_at`` (ISO 8601) or ``duration_s``, as written by the simulated
crowd, the annotation app's export or a platform export, validated row by row against
a task run's ``tasks.csv``/``bundles.csv``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import WorkerIdCase
from saleval.crowd.answers import AnswerParser
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.rows import MAX_LISTED_REJECTS, Rejects, read_rows
from saleval.vocab import IDK_ALIASES

log = logging.getLogger(__name__)

ANSWER_FILE = "answers.csv"
"""The file name of a long answer file inside a run dir (``saleval-simulate``, export)."""


_TIME_FIELDS = ("started_at", "submitted_at")


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value.strip())
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def read_answers(
    path: str | Path,
    tasks: pd.DataFrame,
    bundles: pd.DataFrame | None,
    label_names: Sequence[str],
    idk: Iterable[str] = IDK_ALIASES,
    encoding: str = "utf-8",
    worker_id_case: WorkerIdCase | str = WorkerIdCase.insensitive,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Validate a long answer file against a task set; returns (accepted, rejects, info).

    ``accepted`` has the ANNOTATIONS columns plus ``row`` (the 1-based data row it
    came from). Checks, each reported with file, row and field: field count, empty
    worker, unknown task (or bundle/position), task not in the named bundle,
    unknown label, malformed or inverted times, negative durations, a duplicate
    answer of one worker to one task, a worker answering the same sample twice, and a
    worker taking more than one bundle (docs/study-design.md: one bundle per worker and dataset).

    Worker IDs are compared by :meth:`WorkerIdCase.key` (``worker_id_case``); IDs that name one
    worker are logged in one line and take the spelling of their first row
    (``info["worker_ids_merged"]``). A bundle answered by more than one worker is a
    warning naming file, row and field (``info["bundles_with_several_workers"]``):
    expected after a released lease, a mistake otherwise.
    """
    path = Path(path)
    header, rows, undecodable = read_rows(path, encoding=encoding)
    rejects = Rejects(str(path))
    layout = _Layout.of(path, header)
    parse = AnswerParser(label_names, idk)
    index = _TaskIndex.of(tasks, bundles)
    workers = _WorkerIds(worker_id_case)
    accepted = _Accepted(path)
    simulated = False
    for r, values in enumerate(rows, start=1):
        unreadable = _unreadable_row(r, values, len(header), undecodable)
        if unreadable:
            rejects.add(r, *unreadable)
            continue
        answer, problems = _read_fields(values, layout, index, parse, workers)
        for fld, problem in problems:
            rejects.add(r, fld, problem)
        if problems:
            continue
        sample = index.sample_of[answer.task]
        conflict = accepted.conflict(answer, sample)
        if conflict:
            rejects.add(r, *conflict)
            continue
        accepted.add(r, answer, sample, bool(index.gold.get(answer.task, False)))
        if layout.get(values, "simulated").lower() in ("true", "1", "yes"):
            simulated = True

    acc = _accepted_frame(accepted.rows, tasks)
    merged = workers.merged()
    several = {b: list(w) for b, w in accepted.bundle_workers.items() if len(w) > 1}
    info: dict[str, Any] = {
        "n_rows": len(rows),
        "n_accepted": len(acc),
        "n_rejected_rows": len(rejects.bad_rows),
        "columns": header,
        "timings": "started_at/submitted_at" if layout.has_times else "duration_s",
        "simulated_column": simulated,
        "worker_id_case": str(worker_id_case),
        "worker_ids_merged": merged,
        "bundles_with_several_workers": several,
    }
    _warn_worker_ids(path, merged, worker_id_case, accepted.shared)
    return acc, rejects.frame(), info


@dataclass(frozen=True)
class _Layout:
    """Where a long answer file keeps each field (lower-cased names), how it names a task
    (``task_id`` or ``bundle_id + position``) and how it times an answer."""

    col: dict[str, int]
    by_position: bool
    has_times: bool
    has_duration: bool

    @classmethod
    def of(cls, path: Path, header: list[str]) -> _Layout:
        """The header's layout; a missing column fails the whole file, since no row
        could be read without it."""
        col = {h.lower(): i for i, h in enumerate(header)}

        def missing(fields: str) -> CrowdImportError:
            return CrowdImportError(
                f"{path}, row header, field {fields}: missing column; the file has {header}. "
                "Expected worker_id, task_id (or bundle_id + position), answer, and "
                "started_at + submitted_at or duration_s"
            )

        for required in ("worker_id", "answer"):
            if required not in col:
                raise missing(required)
        by_position = "bundle_id" in col and "position" in col
        if "task_id" not in col and not by_position:
            raise missing("task_id")
        has_times = all(t in col for t in _TIME_FIELDS)
        has_duration = "duration_s" in col
        if not has_times and any(t in col for t in _TIME_FIELDS):
            raise missing("started_at/submitted_at (only one of the pair is present)")
        if not (has_times or has_duration):
            raise missing("started_at/submitted_at or duration_s")
        return cls(col, by_position, has_times, has_duration)

    def get(self, values: list[str], name: str) -> str:
        """A row's field without surrounding spaces; "" where the file has no such column."""
        return values[self.col[name]].strip() if name in self.col else ""


@dataclass(frozen=True)
class _TaskIndex:
    """What the task run says about the tasks an answer may name: each task's sample and
    gold flag, the task at each bundle position and the tasks of each bundle."""

    sample_of: dict[Any, Any]
    gold: dict[Any, bool]
    slot: dict[tuple[str, int], str]
    bundle_tasks: dict[str, set[str]]

    @classmethod
    def of(cls, tasks: pd.DataFrame, bundles: pd.DataFrame | None) -> _TaskIndex:
        """Index ``tasks.csv`` and ``bundles.csv`` (None or empty: no bundles); a bundle's
        gold flag wins over the task table's."""
        task_info = tasks.set_index("task_id")
        gold = (
            task_info["is_gold"].astype(bool).to_dict()
            if "is_gold" in task_info
            else dict.fromkeys(task_info.index, False)
        )
        slot: dict[tuple[str, int], str] = {}
        bundle_tasks: dict[str, set[str]] = {}
        if bundles is not None and len(bundles):
            for b, p, t in bundles[["bundle_id", "position", "task_id"]].itertuples(index=False):
                slot[(str(b), int(p))] = str(t)
                bundle_tasks.setdefault(str(b), set()).add(str(t))
            gold.update({str(t): bool(g) for t, g in zip(bundles["task_id"], bundles["is_gold"])})
        return cls(task_info["sample_id"].to_dict(), gold, slot, bundle_tasks)


class _WorkerIds:
    """Worker IDs as :meth:`WorkerIdCase.key` reads them: the first spelling of a worker names it
    in every later row; every raw spelling is kept for the merge warning."""

    def __init__(self, case: WorkerIdCase | str) -> None:
        self.case = case
        self.spelling: dict[str, str] = {}  # worker key -> the ID as first written (stripped)
        self.spellings: dict[str, dict[str, None]] = {}  # worker key -> every raw ID seen

    def name(self, raw: str) -> str:
        """The worker a raw ID names, as first spelt; "" for an empty ID."""
        worker = raw.strip()
        if worker:
            key = WorkerIdCase(self.case).key(worker)
            worker = self.spelling.setdefault(key, worker)
            self.spellings.setdefault(key, {})[raw] = None
        return worker

    def merged(self) -> dict[str, list[str]]:
        """The workers written in more than one spelling: first spelling -> every raw one."""
        return {self.spelling[k]: list(raw) for k, raw in self.spellings.items() if len(raw) > 1}


@dataclass(frozen=True)
class _Answer:
    """One row's fields once read: who answered which task (in which bundle), the answer
    code and the seconds it took (NaN where unknown)."""

    worker: str
    task: str
    bundle: str | None
    code: int
    duration: float


def _unreadable_row(
    r: int, values: list[str], n_fields: int, undecodable: dict[int, tuple[str, str]]
) -> tuple[str, str] | None:
    """(field, problem) for a row whose fields cannot be read at all: an undecodable byte,
    a blank row or the wrong number of fields."""
    if r in undecodable:
        return undecodable[r]
    if not any(v.strip() for v in values):
        return "*", "blank row"
    if len(values) != n_fields:
        return "*", f"expected {n_fields} fields, found {len(values)}"
    return None


def _read_fields(
    values: list[str],
    layout: _Layout,
    index: _TaskIndex,
    parse: AnswerParser,
    workers: _WorkerIds,
) -> tuple[_Answer, list[tuple[str, str]]]:
    """A row's answer and every problem of its own fields (field, problem), in the order
    worker, task, answer, timing: one reject lists them all."""
    problems: list[tuple[str, str]] = []
    worker = workers.name(values[layout.col["worker_id"]])
    if not worker:
        problems.append(("worker_id", "empty worker id"))
    task, bundle = _task_of(values, layout, index, problems)
    code = -1
    try:
        code = parse(layout.get(values, "answer"))
    except ValueError as err:
        problems.append(("answer", str(err)))
    duration = _duration(values, layout, problems)
    return _Answer(worker, task, bundle, code, duration), problems


def _task_of(
    values: list[str], layout: _Layout, index: _TaskIndex, problems: list[tuple[str, str]]
) -> tuple[str, str | None]:
    """The task a row answers and its bundle: named by ``task_id``, or found at ``bundle_id``
    + ``position`` (a ``task_id`` given as well must agree); the task must be known and,
    where bundles are known, in the row's bundle. Problems are appended to ``problems``."""
    task = layout.get(values, "task_id")
    bundle = layout.get(values, "bundle_id") or None
    position = _position(values, layout, problems)
    if layout.by_position and bundle and position is not None:
        at = index.slot.get((bundle, position))
        if at is None:
            fld = "bundle_id" if bundle not in index.bundle_tasks else "position"
            problems.append((fld, f"no task at bundle {bundle!r} position {position}"))
        elif task and task != at:
            problems.append(
                ("task_id", f"task {task!r} is not at bundle {bundle!r} position {position}")
            )
        else:
            task = at
    if not task:
        if not any(f in ("bundle_id", "position") for f, _ in problems):
            problems.append(("task_id", "empty task id"))
    elif task not in index.sample_of:
        problems.append(("task_id", f"unknown task {task!r}"))
    elif bundle and index.bundle_tasks and task not in index.bundle_tasks.get(bundle, set()):
        fld = "bundle_id" if bundle not in index.bundle_tasks else "task_id"
        problems.append((fld, f"task {task!r} is not in bundle {bundle!r}"))
    return task, bundle


def _position(values: list[str], layout: _Layout, problems: list[tuple[str, str]]) -> int | None:
    """A row's bundle position (an integer, ``3.0`` allowed); None where the file names tasks
    by ``task_id``, the field is empty or it is no integer (a problem then)."""
    text = layout.get(values, "position")
    if not (layout.by_position and text):
        return None
    try:
        as_float = float(text)
        if not as_float.is_integer():
            raise ValueError
        return int(as_float)
    except ValueError:
        problems.append(("position", f"not an integer: {text!r}"))
        return None


def _duration(values: list[str], layout: _Layout, problems: list[tuple[str, str]]) -> float:
    """Seconds spent on an answer: ``submitted_at - started_at`` where the file has times,
    else ``duration_s`` (beside times, a ``duration_s`` given is only checked); NaN where
    neither can be read. Problems are appended to ``problems``."""
    duration = np.nan
    if layout.has_times:
        times: dict[str, datetime] = {}
        for t in _TIME_FIELDS:
            try:
                times[t] = _parse_time(layout.get(values, t))
            except ValueError:
                problems.append(
                    (t, f"malformed time {layout.get(values, t)!r} (expected ISO 8601)")
                )
        if len(times) == 2:
            duration = (times["submitted_at"] - times["started_at"]).total_seconds()
            if duration < 0:
                problems.append(("submitted_at", "submitted before started"))
    given = layout.get(values, "duration_s")
    if layout.has_duration and (not layout.has_times or given):
        try:
            d = float(given)
            if not np.isfinite(d) or d < 0:
                raise ValueError
            duration = d if not layout.has_times else duration
        except ValueError:
            problems.append(("duration_s", f"not a non-negative number: {given!r}"))
    return duration


@dataclass
class _Accepted:
    """The rows accepted so far, which each later row is checked against: the first valid
    occurrence wins. Collects the bundles that a second worker answered (warnings)."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    seen_task: dict[tuple[str, str], int] = field(default_factory=dict)
    seen_sample: dict[tuple[str, Any], tuple[str, int]] = field(default_factory=dict)
    seen_bundle: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: bundle -> worker -> first row
    bundle_workers: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the warnings about bundles with a second worker
    shared: list[str] = field(default_factory=list)

    def conflict(self, a: _Answer, sample: Any) -> tuple[str, str] | None:
        """(field, problem) when an earlier accepted row rules this one out: the worker
        answered the task or its sample already, or took another bundle."""
        worker, task, bundle = a.worker, a.task, a.bundle
        if (worker, task) in self.seen_task:
            return (
                "task_id",
                f"duplicate answer of worker {worker!r} to task {task!r} "
                f"(first at row {self.seen_task[(worker, task)]})",
            )
        if (worker, sample) in self.seen_sample:
            t0, r0 = self.seen_sample[(worker, sample)]
            return (
                "task_id",
                f"worker {worker!r} already answered sample {sample!r} (task {t0!r}, row {r0})",
            )
        if bundle and worker in self.seen_bundle and self.seen_bundle[worker][0] != bundle:
            b0, r0 = self.seen_bundle[worker]
            return (
                "bundle_id",
                f"worker {worker!r} already took bundle {b0!r} (row {r0}); one bundle per "
                "worker and dataset",
            )
        return None

    def add(self, r: int, a: _Answer, sample: Any, is_gold: bool) -> None:
        """Accept row ``r``; a bundle it shows a second worker on is warned about."""
        worker, task, bundle = a.worker, a.task, a.bundle
        self.seen_task[(worker, task)] = r
        self.seen_sample[(worker, sample)] = (task, r)
        if bundle:
            self.seen_bundle.setdefault(worker, (bundle, r))
            holders = self.bundle_workers.setdefault(bundle, {})
            if holders and worker not in holders:
                w0, r0 = next(iter(holders.items()))
                self.shared.append(
                    f"{self.path}, row {r}, field bundle_id: bundle {bundle!r} is answered by "
                    f"another worker {worker!r} (first {w0!r}, row {r0}); expected only when "
                    "its lease ran out or the admin released it (released.csv), otherwise "
                    "check the worker IDs"
                )
            holders.setdefault(worker, r)
        self.rows.append(
            {
                "row": r,
                "worker_id": worker,
                "task_id": task,
                "answer_code": a.code,
                "duration_s": a.duration,
                "bundle_id": bundle,
                "is_gold": is_gold,
            }
        )


def _accepted_frame(rows: list[dict[str, Any]], tasks: pd.DataFrame) -> pd.DataFrame:
    """The accepted rows with their tasks' sample, method, k and label; without ``bundle_id``
    where no row names a bundle."""
    acc = pd.DataFrame(
        rows,
        columns=[
            "row",
            "worker_id",
            "task_id",
            "answer_code",
            "duration_s",
            "bundle_id",
            "is_gold",
        ],
    )
    meta = tasks.set_index("task_id")[["sample_id", "method", "k", "label"]]
    acc = acc.join(meta, on="task_id")
    if acc["bundle_id"].isna().all():
        acc = acc.drop(columns="bundle_id")
    return acc


def _warn_worker_ids(
    path: Path, merged: dict[str, list[str]], case: WorkerIdCase | str, shared: list[str]
) -> None:
    """One line for the worker IDs read as one worker; one per bundle with a second worker."""
    if merged:
        groups = [" = ".join(repr(s) for s in raw) for raw in merged.values()]
        insensitive = WorkerIdCase(case) == WorkerIdCase.insensitive
        no_case = ", case ignored: crowd.worker_id_case=insensitive" if insensitive else ""
        more = len(groups) - MAX_LISTED_REJECTS
        log.warning(
            "%s, field worker_id: %d spellings read as %d workers (surrounding spaces "
            "ignored%s): %s%s",
            path,
            sum(len(raw) for raw in merged.values()),
            len(merged),
            no_case,
            "; ".join(groups[:MAX_LISTED_REJECTS]),
            f"; and {more} more" if more > 0 else "",
        )
    for line in shared[:MAX_LISTED_REJECTS]:
        log.warning("%s", line)
    if len(shared) > MAX_LISTED_REJECTS:
        log.warning(
            "%s: %d more bundles with another worker", path, len(shared) - MAX_LISTED_REJECTS
        )
