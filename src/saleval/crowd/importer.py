"""Import crowd answers (SPEC §5): long answer files and the published lu2024 format.

Two sources reach the same tables:

* the **long answer format** (``worker_id, task_id`` or ``bundle_id + position``,
  ``answer``, ``started_at/submitted_at`` or ``duration_s``) written by the simulated
  crowd, the annotation app's export or a platform export, joined against a task
  run's ``tasks.csv``/``bundles.csv``;
* the **published aggregated format** of the original study (Lu et al. 2024,
  ``Text Label Saliency Words Correct`` in blocks of 41 rows) that gives
  A[i, j, k] directly.

Nothing is dropped silently: every data row is either accepted or listed in the
rejects table with the file, the 1-based data row, the field and the problem.
With policy ``strict`` any reject is an error; with ``report`` the good rows go
on and the rejects are written next to them. A file that cannot be read at all
(missing file, missing required column) is an error under both policies.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from saleval import tables

log = logging.getLogger(__name__)

IDK_CODE = 0
"""Answer code of "I don't know" (SPEC §5: L = 0); label c (0-based) is coded c + 1."""

DEFAULT_IDK: tuple[str, ...] = ("I don't know", "I do not know", "don't know", "idk", "unknown")

LU2024_METHODS: dict[str, str] = {
    "All_Attention": "all_attention",
    "Last_Attention": "last_attention",
    "Vanilla_Gradient": "vanilla_gradient",
    "InputXGrad": "input_x_gradient",
    "Integrated_Gradient": "integrated_gradients",
    "DeepLIFT": "deeplift",
    "LIME": "lime",
    "Random": "random",
}

ANSWER_FILE = "answers.csv"
MAX_LISTED_REJECTS = 20


class CrowdImportError(ValueError):
    """Crowd answers cannot be imported; the message names the file, row and field."""


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, logged with every import so results trace to their bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------
# Answers: label names, indices, "I don't know"
# ---------------------------------------------------------------------------------

_APOSTROPHES = str.maketrans({"\u2019": "", "\u2018": "", "`": "", "'": "", "\u00b4": ""})
_INT = re.compile(r"^[+-]?\d+(\.0*)?$")


def _norm(text: str) -> str:
    """Case-, space- and apostrophe-insensitive key ("I Don’t  know" == "idontknow")."""
    return "".join(str(text).lower().translate(_APOSTROPHES).split())


class AnswerParser:
    """Maps a raw answer to its code: 0 = "I don't know", c + 1 = label c.

    Label names win over indices, so a dataset whose label names are digits still
    parses as names; indices are 0-based positions in ``label_names``.
    """

    def __init__(self, label_names: Sequence[str], idk: Iterable[str] = DEFAULT_IDK) -> None:
        self.label_names = [str(n) for n in label_names]
        self.names = {_norm(n): i + 1 for i, n in enumerate(self.label_names)}
        if len(self.names) != len(self.label_names):
            raise CrowdImportError(f"label names collide once normalised: {self.label_names}")
        self.idk = {_norm(s) for s in idk} | {_norm("I don't know")}
        clash = self.idk & set(self.names)
        if clash:
            raise CrowdImportError(f"'I don't know' aliases {sorted(clash)} are also label names")

    def __call__(self, raw: str) -> int:
        key = _norm(raw)
        if key in self.names:
            return self.names[key]
        if key in self.idk:
            return IDK_CODE
        if _INT.match(key):
            idx = int(float(key))
            if 0 <= idx < len(self.label_names):
                return idx + 1
            raise ValueError(f"label index {idx} out of range 0..{len(self.label_names) - 1}")
        raise ValueError(
            f"unknown label {raw!r}; expected one of {self.label_names}, an index "
            f'0..{len(self.label_names) - 1} or "I don\'t know"'
        )


# ---------------------------------------------------------------------------------
# Result of an import
# ---------------------------------------------------------------------------------


@dataclass
class _Rejects:
    file: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: int | None, fld: str, problem: str) -> None:
        self.rows.append({"file": self.file, "row": row, "field": fld, "problem": problem})

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=list(tables.REJECTS.columns))
        df["row"] = df["row"].astype("Int64")
        return df

    @property
    def bad_rows(self) -> set[int]:
        return {int(r["row"]) for r in self.rows if r["row"] is not None}


@dataclass
class CrowdImport:
    """Everything one import produces; the stage writes these as its outputs.

    ``annotations`` are the accepted answers that passed the quality filters
    (ANNOTATIONS); ``removed`` the accepted answers a filter took out (with the
    filter's name); ``aggregated`` is A[i, j, k] (AGGREGATED); ``report`` the
    counts, hashes and settings written to ``import_report.json``.
    """

    annotations: pd.DataFrame
    aggregated: pd.DataFrame
    rejects: pd.DataFrame
    report: dict[str, Any]
    removed: pd.DataFrame = field(default_factory=pd.DataFrame)


def empty_annotations() -> pd.DataFrame:
    cols = {**tables.ANNOTATIONS.columns}
    return tables.ANNOTATIONS.validate(
        pd.DataFrame({c: pd.Series(dtype="object") for c in cols}), where="<empty>"
    )


def enforce_policy(rejects: pd.DataFrame, policy: str, source: str | Path) -> None:
    """``strict``: any reject is an error listing the first ones; ``report``: go on."""
    if policy not in ("strict", "report"):
        raise CrowdImportError(f"crowd.policy must be 'strict' or 'report', not {policy!r}")
    if policy == "strict" and len(rejects):
        listed = "\n".join(
            f"  {r.file}, row {'-' if pd.isna(r.row) else r.row}, field {r.field}: {r.problem}"
            for r in rejects.head(MAX_LISTED_REJECTS).itertuples()
        )
        more = len(rejects) - MAX_LISTED_REJECTS
        raise CrowdImportError(
            f"{source}: {len(rejects)} problem(s) under policy 'strict'; nothing was imported:\n"
            f"{listed}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\n(policy 'report' imports the good rows and writes rejects.csv)"
        )


# ---------------------------------------------------------------------------------
# Long answer format
# ---------------------------------------------------------------------------------

_TIME_FIELDS = ("started_at", "submitted_at")


def _read_rows(
    path: Path, delimiter: str = ",", quoting: int = csv.QUOTE_MINIMAL
) -> tuple[list[str], list[list[str]]]:
    """Header (stripped) and data rows of a delimited file, via csv (no type guessing)."""
    if not path.is_file():
        raise CrowdImportError(f"{path}: file not found")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter, quoting=quoting)
        try:
            header = next(reader)
        except StopIteration:
            raise CrowdImportError(f"{path}: empty file (no header row)") from None
        rows = list(reader)
    return [h.strip() for h in header], rows


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value.strip())
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def read_answers(
    path: str | Path,
    tasks: pd.DataFrame,
    bundles: pd.DataFrame | None,
    label_names: Sequence[str],
    idk: Iterable[str] = DEFAULT_IDK,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Validate a long answer file against a task set; returns (accepted, rejects, info).

    ``accepted`` has the ANNOTATIONS columns plus ``row`` (the 1-based data row it
    came from). Checks, each reported with file, row and field: field count, empty
    worker, unknown task (or bundle/position), task not in the named bundle,
    unknown label, malformed or inverted times, negative durations, a duplicate
    answer of one worker to one task, a worker answering the same sample twice, and a
    worker taking more than one bundle (SPEC §4: one bundle per worker and dataset).
    """
    path = Path(path)
    header, rows = _read_rows(path)
    col = {h.lower(): i for i, h in enumerate(header)}
    rejects = _Rejects(str(path))

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
    accepted: list[dict[str, Any]] = []
    simulated = False
    n_fields = len(header)
    for r, values in enumerate(rows, start=1):
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
    info = {
        "n_rows": len(rows),
        "n_accepted": len(acc),
        "n_rejected_rows": len(rejects.bad_rows),
        "columns": header,
        "timings": "started_at/submitted_at" if has_times else "duration_s",
        "simulated_column": simulated,
    }
    return acc, rejects.frame(), info


def import_answers(
    path: str | Path,
    tasks: pd.DataFrame,
    bundles: pd.DataFrame | None,
    label_names: Sequence[str],
    crowd: Mapping[str, Any],
    seed: int = 0,
    expert: pd.DataFrame | None = None,
) -> CrowdImport:
    """Read, filter and aggregate one long answer file (the whole of ``saleval-import``).

    ``crowd`` is the ``crowd`` config (policy, idk aliases, filters, aggregator,
    agreement). Raises :class:`CrowdImportError` under policy ``strict`` when any row
    is rejected.
    """
    from saleval.crowd import aggregation, quality

    policy = str(crowd.get("policy", "report"))
    accepted, rejects, info = read_answers(
        path, tasks, bundles, label_names, crowd.get("idk") or DEFAULT_IDK
    )
    enforce_policy(rejects, policy, path)
    annotations = tables.ANNOTATIONS.validate(accepted.drop(columns="row"), where=str(path))
    kept, removed, filter_log = quality.apply_filters(annotations, crowd.get("filters") or {})
    agg_cfg = dict(crowd.get("aggregator") or {"name": "strict_majority"})
    aggregator = aggregation.build_aggregator(agg_cfg.pop("name"), seed=seed, **agg_cfg)
    aggregated = aggregation.aggregate(kept, tasks, aggregator)
    if (aggregated["n_answers"] == 0).any():
        log.warning(
            "%d of %d tasks have no answer left after import and filters; A = 0 for them",
            int((aggregated["n_answers"] == 0).sum()),
            len(aggregated),
        )
    agreement = aggregation.agreement(
        kept, idk=str((crowd.get("agreement") or {}).get("idk", "category"))
    )
    report: dict[str, Any] = {
        "format": "answers",
        "policy": policy,
        **info,
        "rejects_by_field": rejects["field"].value_counts().to_dict(),
        "filters": filter_log,
        "n_annotations": len(kept),
        "n_workers": int(kept["worker_id"].nunique()),
        "n_tasks": len(aggregated),
        "tasks_without_answers": int((aggregated["n_answers"] == 0).sum()),
        "aggregator": {"name": type(aggregator).__name__, **agg_cfg},
        "agreement": agreement,
        "label_names": list(label_names),
    }
    if expert is not None:
        report["expert"] = aggregation.expert_check(
            expert, aggregated, tasks, AnswerParser(label_names, crowd.get("idk") or DEFAULT_IDK)
        )
    return CrowdImport(kept, aggregated, rejects, report, removed)


# ---------------------------------------------------------------------------------
# Published lu2024 format
# ---------------------------------------------------------------------------------

_LU_COLUMNS = ("Text", "Label", "Saliency", "Words", "Correct")


def read_lu2024(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    methods: Mapping[str, str] = LU2024_METHODS,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Read the published aggregated results; returns (aggregated, rejects, info).

    Blocks of rows: a sample row (``Saliency`` N/A, ``Words`` All) followed by its
    tasks, whose ``Correct`` is A[i, j, k]. Sample ids are ``lu2024-<dataset>-<block>``
    (block counted from 0). Checked per row: field count, label in range and equal to
    its sample's, known method, integer k, Correct in {0, 1}, no repeated (method, k)
    within a sample, and no more shown words than k.
    """
    path = Path(path)
    header, rows = _read_rows(path, delimiter="\t", quoting=csv.QUOTE_NONE)
    col = {h: i for i, h in enumerate(header)}
    for name in _LU_COLUMNS:
        if name not in col:
            raise CrowdImportError(
                f"{path}, row header, field {name}: missing column; the file has {header} "
                f"(expected tab-separated {' '.join(_LU_COLUMNS)})"
            )
    rejects = _Rejects(str(path))
    n_labels = len(label_names)
    out: list[dict[str, Any]] = []
    block = -1
    block_ok = False
    block_label = -1
    block_row = 0
    seen: dict[tuple[int, str, int], int] = {}
    n_samples = 0
    for r, values in enumerate(rows, start=1):
        if len(values) != len(header):
            rejects.add(r, "*", f"expected {len(header)} fields, found {len(values)}")
            continue
        get = {name: values[col[name]].strip() for name in _LU_COLUMNS}
        label: int | None = None
        try:
            label = int(get["Label"])
            if not 0 <= label < n_labels:
                raise ValueError
        except ValueError:
            label = None
        if get["Saliency"] in ("N/A", "") and get["Words"].lower() == "all":
            block += 1
            block_row = r
            block_ok = label is not None
            block_label = -1 if label is None else label
            if label is None:
                rejects.add(r, "Label", f"not a label index 0..{n_labels - 1}: {get['Label']!r}")
            else:
                n_samples += 1
            continue
        problems: list[tuple[str, str]] = []
        if block < 0:
            problems.append(("Saliency", "task row before any sample row"))
        elif not block_ok:
            problems.append(("Label", f"its sample (row {block_row}) was rejected"))
        if label is None:
            problems.append(("Label", f"not a label index 0..{n_labels - 1}: {get['Label']!r}"))
        elif block_ok and label != block_label:
            problems.append(("Label", f"{label} differs from its sample's label {block_label}"))
        method = methods.get(get["Saliency"])
        if method is None:
            problems.append(
                ("Saliency", f"unknown method {get['Saliency']!r}; expected one of {list(methods)}")
            )
        k = -1
        try:
            k = int(get["Words"])
            if k <= 0:
                raise ValueError
        except ValueError:
            problems.append(("Words", f"not a positive integer: {get['Words']!r}"))
        if get["Correct"] not in ("0", "1"):
            problems.append(("Correct", f"not 0 or 1: {get['Correct']!r}"))
        shown = sum(1 for w in values[col["Text"]].split(" ") if w.strip("."))
        if k > 0 and shown > k:
            problems.append(("Text", f"shows {shown} words, more than Words={k}"))
        if not problems and (block, method, k) in seen:
            problems.append(
                (
                    "Words",
                    f"{get['Saliency']} k={k} repeated in this sample (row {seen[(block, method, k)]})",
                )
            )
        if problems:
            for fld, problem in problems:
                rejects.add(r, fld, problem)
            continue
        assert method is not None and label is not None
        seen[(block, method, k)] = r
        out.append(
            {
                "sample_id": f"lu2024-{dataset}-{block}",
                "method": method,
                "k": k,
                "correct": int(get["Correct"]),
                "label": label,
                "n_words_shown": shown,
            }
        )
    agg = pd.DataFrame(
        out, columns=["sample_id", "method", "k", "correct", "label", "n_words_shown"]
    )
    cells = agg.groupby("sample_id").size()
    grid = agg[["method", "k"]].drop_duplicates()
    info = {
        "n_rows": len(rows),
        "n_samples": n_samples,
        "n_tasks": len(agg),
        "n_rejected_rows": len(rejects.bad_rows),
        "methods": sorted(agg["method"].unique().tolist()),
        "ks": sorted(int(k) for k in agg["k"].unique()),
        "incomplete_samples": sorted(cells[cells < len(grid)].index.tolist()),
        "columns": header,
    }
    return agg.drop(columns="n_words_shown"), rejects.frame(), info


def import_published(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    crowd: Mapping[str, Any],
) -> CrowdImport:
    """Import the published lu2024 file: A[i, j, k] as given, no worker-level data."""
    policy = str(crowd.get("policy", "report"))
    methods = dict(crowd.get("methods") or LU2024_METHODS)
    aggregated, rejects, info = read_lu2024(path, label_names, dataset, methods)
    enforce_policy(rejects, policy, path)
    aggregated = tables.AGGREGATED.validate(aggregated, where=str(path))
    report = {
        "format": "lu2024",
        "policy": policy,
        **info,
        "n_accepted": len(aggregated),
        "rejects_by_field": rejects["field"].value_counts().to_dict(),
        "aggregator": {"name": "published majority vote (Correct column)"},
        "agreement": {"note": "individual answers are not published; no agreement statistic"},
        "filters": [],
        "label_names": list(label_names),
    }
    return CrowdImport(empty_annotations(), aggregated, rejects, report)
