"""The long answer format (docs/aggregation.md#import): one answer per row.

``worker_id, task_id`` (or ``bundle_id + position``), ``answer``, and
``started_at/submitted_at`` (ISO 8601) or ``duration_s``, as written by the simulated
crowd, the annotation app's export or a platform export, validated row by row against
a task run's ``tasks.csv``/``bundles.csv``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import WorkerIdCase
from saleval.crowd.answers import IDK_ALIASES, AnswerParser
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.reading import MAX_LISTED_REJECTS, Rejects, read_rows

log = logging.getLogger(__name__)

ANSWER_FILE = "answers.csv"
"""The file name of a long answer file inside a run dir (``saleval-simulate``, export)."""


def worker_key(raw: str, case: WorkerIdCase | str = WorkerIdCase.insensitive) -> str:
    """Who a worker ID names: surrounding spaces never count, case only under ``sensitive``
    (docs/aggregation.md#worker-ids).

    >>> worker_key(" A1b2 "), worker_key(" A1b2 ", "sensitive")
    ('a1b2', 'A1b2')
    """
    value = raw.strip()
    return value if WorkerIdCase(case) == WorkerIdCase.sensitive else value.casefold()


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

    Worker IDs are compared by :func:`worker_key` (``worker_id_case``); IDs that name one
    worker are logged in one line and take the spelling of their first row
    (``info["worker_ids_merged"]``). A bundle answered by more than one worker is a
    warning naming file, row and field (``info["bundles_with_several_workers"]``):
    expected after a released lease, a mistake otherwise.
    """
    path = Path(path)
    header, rows, undecodable = read_rows(path, encoding=encoding)
    col = {h.lower(): i for i, h in enumerate(header)}
    rejects = Rejects(str(path))

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

    parse = AnswerParser(label_names, idk)
    task_info = tasks.set_index("task_id")
    sample_of = task_info["sample_id"].to_dict()
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

    seen_task: dict[tuple[str, str], int] = {}
    seen_sample: dict[tuple[str, str], tuple[str, int]] = {}
    seen_bundle: dict[str, tuple[str, int]] = {}
    spelling: dict[str, str] = {}  # worker key -> the ID as first written (stripped)
    spellings: dict[str, dict[str, None]] = {}  # worker key -> every raw ID seen
    bundle_workers: dict[str, dict[str, int]] = {}  # bundle -> worker -> first row
    shared: list[str] = []  # the warnings about bundles with a second worker
    accepted: list[dict[str, Any]] = []
    simulated = False
    n_fields = len(header)
    for r, values in enumerate(rows, start=1):
        if r in undecodable:
            rejects.add(r, *undecodable[r])
            continue
        if not any(v.strip() for v in values):
            rejects.add(r, "*", "blank row")
            continue
        if len(values) != n_fields:
            rejects.add(r, "*", f"expected {n_fields} fields, found {len(values)}")
            continue

        def get(name: str, _values: list[str] = values) -> str:
            return _values[col[name]].strip() if name in col else ""

        problems: list[tuple[str, str]] = []
        worker = get("worker_id")
        if not worker:
            problems.append(("worker_id", "empty worker id"))
        else:
            key = worker_key(worker, worker_id_case)
            worker = spelling.setdefault(key, worker)
            spellings.setdefault(key, {})[values[col["worker_id"]]] = None
        task = get("task_id")
        bundle = get("bundle_id") or None
        position: int | None = None
        if by_position and get("position"):
            try:
                as_float = float(get("position"))
                if not as_float.is_integer():
                    raise ValueError
                position = int(as_float)
            except ValueError:
                problems.append(("position", f"not an integer: {get('position')!r}"))
        if by_position and bundle and position is not None:
            at = slot.get((bundle, position))
            if at is None:
                fld = "bundle_id" if bundle not in bundle_tasks else "position"
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
        elif task not in sample_of:
            problems.append(("task_id", f"unknown task {task!r}"))
        elif bundle and bundle_tasks and task not in bundle_tasks.get(bundle, set()):
            fld = "bundle_id" if bundle not in bundle_tasks else "task_id"
            problems.append((fld, f"task {task!r} is not in bundle {bundle!r}"))
        code = -1
        try:
            code = parse(get("answer"))
        except ValueError as err:
            problems.append(("answer", str(err)))
        duration = np.nan
        if has_times:
            times: dict[str, datetime] = {}
            for t in _TIME_FIELDS:
                try:
                    times[t] = _parse_time(get(t))
                except ValueError:
                    problems.append((t, f"malformed time {get(t)!r} (expected ISO 8601)"))
            if len(times) == 2:
                duration = (times["submitted_at"] - times["started_at"]).total_seconds()
                if duration < 0:
                    problems.append(("submitted_at", "submitted before started"))
        if has_duration and (not has_times or get("duration_s")):
            try:
                d = float(get("duration_s"))
                if not np.isfinite(d) or d < 0:
                    raise ValueError
                duration = d if not has_times else duration
            except ValueError:
                problems.append(("duration_s", f"not a non-negative number: {get('duration_s')!r}"))
        if problems:
            for fld, problem in problems:
                rejects.add(r, fld, problem)
            continue
        # Relations to earlier accepted rows: the first valid occurrence wins.
        if (worker, task) in seen_task:
            rejects.add(
                r,
                "task_id",
                f"duplicate answer of worker {worker!r} to task {task!r} "
                f"(first at row {seen_task[(worker, task)]})",
            )
            continue
        sample = sample_of[task]
        if (worker, sample) in seen_sample:
            t0, r0 = seen_sample[(worker, sample)]
            rejects.add(
                r,
                "task_id",
                f"worker {worker!r} already answered sample {sample!r} (task {t0!r}, row {r0})",
            )
            continue
        if bundle and worker in seen_bundle and seen_bundle[worker][0] != bundle:
            b0, r0 = seen_bundle[worker]
            rejects.add(
                r,
                "bundle_id",
                f"worker {worker!r} already took bundle {b0!r} (row {r0}); one bundle per "
                "worker and dataset",
            )
            continue
        seen_task[(worker, task)] = r
        seen_sample[(worker, sample)] = (task, r)
        if bundle:
            seen_bundle.setdefault(worker, (bundle, r))
            holders = bundle_workers.setdefault(bundle, {})
            if holders and worker not in holders:
                w0, r0 = next(iter(holders.items()))
                shared.append(
                    f"{path}, row {r}, field bundle_id: bundle {bundle!r} is answered by "
                    f"another worker {worker!r} (first {w0!r}, row {r0}); expected only when "
                    "its lease ran out or the admin released it (released.csv), otherwise "
                    "check the worker IDs"
                )
            holders.setdefault(worker, r)
        if "simulated" in col and get("simulated").lower() in ("true", "1", "yes"):
            simulated = True
        accepted.append(
            {
                "row": r,
                "worker_id": worker,
                "task_id": task,
                "answer_code": code,
                "duration_s": duration,
                "bundle_id": bundle,
                "is_gold": bool(gold.get(task, False)),
            }
        )

    acc = pd.DataFrame(
        accepted,
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
    merged = {spelling[k]: list(raw) for k, raw in spellings.items() if len(raw) > 1}
    several = {b: list(w) for b, w in bundle_workers.items() if len(w) > 1}
    info: dict[str, Any] = {
        "n_rows": len(rows),
        "n_accepted": len(acc),
        "n_rejected_rows": len(rejects.bad_rows),
        "columns": header,
        "timings": "started_at/submitted_at" if has_times else "duration_s",
        "simulated_column": simulated,
        "worker_id_case": str(worker_id_case),
        "worker_ids_merged": merged,
        "bundles_with_several_workers": several,
    }
    _warn_worker_ids(path, merged, worker_id_case, shared)
    return acc, rejects.frame(), info


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
