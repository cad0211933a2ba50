"""What a run sent to MLflow, kept in its run dir, so that an outage of the tracking store
loses nothing (the user's view: docs/tracking.md, *When the tracking server fails*).

Everything saleval logs to one of its runs (params, metrics, tags, the run's name, files,
per-method child runs, saved views, datasets, the model, the run's end) is one **op**: a
JSON object appended to ``<run dir>/tracking_log.jsonl`` and then sent (:func:`send`).
One function per kind of op does the sending (:func:`applies` registers it), and the same
function serves the live run and, later, ``saleval-catch-up``
(:mod:`saleval.pipeline.tracker.catch_up`), which sends the journal's ops again into the same run
or, for a run moved to another store, into a new one.

While the store answers, each op is sent as it is written. When it fails after MLflow's
own retries (:func:`saleval.pipeline.tracker.tracking_health.store_failure`: connection lost,
server errors, 401/403, a database gone), the run goes on: that op and every later one are
kept in the journal only, one warning line says so, and the run's record says what was not
logged (:meth:`Journal.record`, written into ``run.json``). The ops the store took are
always the journal's first ``sent`` ones. A full disk is not the store's failure: it ends
the stage.

NaN metric values are kept as JSON's non-standard ``NaN`` (Python reads them back); the
journal is read by saleval, not by other tools.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saleval.pipeline.tracker import tracking_health

log = logging.getLogger(__name__)

#: the journal's file in a run dir (and in a ``saleval-run`` dir, for the pipeline's run)
JOURNAL = "tracking_log.jsonl"
#: the record's field (``run.json``, ``pipeline.json``) saying what reached the store
RECORD = "tracking"

#: op kind -> the function that sends it (:func:`applies`)
_APPLY: dict[str, Callable[[dict[str, Any], Target], Any]] = {}
#: the journals of the runs saleval has started and not ended, innermost last
_OPEN: list[Journal] = []


@dataclass
class Target:
    """Where ops are sent: the MLflow run (active while they are sent), its experiment,
    the run dir the op's files are relative to, and, when catching up, the ids the target
    store gave the things the journal names by their first store's ids."""

    run_id: str
    experiment_id: str
    run_dir: Path | None = None
    #: catching up: an op may have been sent in part before (child runs made, ...)
    replay: bool = False
    #: logged model id in the journal -> in the target store
    models: dict[str, str] = field(default_factory=dict)
    #: the run's name in the target store (a saved view is named after it)
    run_name: str | None = None


def applies(kind: str) -> Callable[[Callable[[dict[str, Any], Target], Any]], Any]:
    """Register the function that sends ops of ``kind`` (one per kind)."""

    def register(fn: Callable[[dict[str, Any], Target], Any]) -> Any:
        if kind in _APPLY and _APPLY[kind] is not fn:
            raise ValueError(f"op kind {kind!r} is sent by {_APPLY[kind].__qualname__} already")
        _APPLY[kind] = fn
        return fn

    return register


def apply(op: Mapping[str, Any], target: Target) -> Any:
    """Send ``op`` to ``target`` with the function registered for its kind."""
    try:
        fn = _APPLY[str(op["op"])]
    except KeyError:
        raise ValueError(f"{JOURNAL}: unknown op {op.get('op')!r}") from None
    return fn(dict(op), target)


def describe(op: Mapping[str, Any]) -> str:
    """An op in a few words, for the record's ``not_logged`` list.

    >>> describe({"op": "metrics", "metrics": {"n_samples": 8, "accuracy": 0.5}})
    'metrics n_samples, accuracy'
    >>> describe({"op": "file", "path": "attributions.parquet"})
    'file attributions.parquet'
    """
    kind = str(op.get("op"))
    if kind in ("params", "metrics", "tags"):
        keys = list(op.get(kind) or {})
        shown = ", ".join(keys[:6]) + (f" (+{len(keys) - 6})" if len(keys) > 6 else "")
        return f"{kind} {shown}"
    if kind == "file":
        return f"file {op.get('path')}"
    if kind == "rows":
        return f"child runs of {op.get('stage')} ({len(op.get('names') or [])} {op.get('key')}s)"
    if kind == "dataset":
        return f"dataset {op.get('name')}"
    if kind == "end":
        return f"end ({op.get('status')})"
    return kind


@dataclass
class Journal:
    """One run's journal: the ops written, how many the store took, and whether (why) it
    stopped taking them."""

    run_dir: Path
    target: Target
    uri: str
    ops: int = 0
    sent: int = 0
    lost: str | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / JOURNAL

    def write(self, op: Mapping[str, Any]) -> None:
        """Append ``op`` (a full disk raises: the stage ends, naming the disk)."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(op, default=str) + "\n")
        self.ops += 1

    def lose(self, cause: str, op: Mapping[str, Any]) -> None:
        """The store failed while taking ``op``: keep the rest here (one warning line); the
        next run this process starts checks the store again, within its short wait."""
        self.lost = cause
        tracking_health.forget_checks()
        log.warning(
            "the tracking store %s failed (%s) while logging %s; the run goes on without it "
            "and keeps what it logs in %s: send it later with saleval-catch-up %s",
            tracking_health.redact(self.uri), cause, describe(op), self.path, self.run_dir,
        )  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The record's ``tracking`` field: the journal, how much of it the store took, and
        (when not all) why and what it lacks."""
        return record_of(self.run_dir, self.ops, self.sent, self.lost)


def record_of(run_dir: Path, ops: int, sent: int, lost: str | None) -> dict[str, Any]:
    """The ``tracking`` field of a run's record (see :meth:`Journal.record`)."""
    out: dict[str, Any] = {"journal": JOURNAL, "ops": ops, "sent": sent, "logged": sent >= ops}
    if sent < ops:
        out["lost"] = lost or "not sent"
        out["not_logged"] = [describe(op) for op in read_ops(run_dir)[sent:]]
    return out


def open_journal(
    run_dir: Path, uri: str, target: Target, start: Mapping[str, Any], fresh: bool = True
) -> Journal:
    """The journal of a run that has just started in the store: its first op, ``start``
    (what the run was started with), is written as already sent. ``fresh``: a new run
    dir's journal (an old one, of a run that was resumed in place, is replaced)."""
    journal = Journal(Path(run_dir), target, uri)
    if fresh:
        journal.path.unlink(missing_ok=True)
    journal.write({"op": "start", **start})
    journal.sent = journal.ops
    _OPEN.append(journal)
    return journal


def close_journal(journal: Journal) -> None:
    if journal in _OPEN:
        _OPEN.remove(journal)


def active(run_id: str | None) -> Journal | None:
    """The journal of the run ``run_id`` (the active MLflow run), when saleval keeps one."""
    if run_id is None:
        return None
    for journal in reversed(_OPEN):
        if journal.target.run_id == run_id:
            return journal
    return None


def send(op: dict[str, Any], live: Callable[[], Any] | None = None) -> Any:
    """Journal ``op`` when the active MLflow run is a saleval run, then send it (``live``:
    how to send it from objects in memory, e.g. a model, instead of from the op). After
    the store failed, the op is only journaled. Returns what sending returned (None when
    it was not sent)."""
    import mlflow

    run = mlflow.active_run()
    journal = active(run.info.run_id if run is not None else None)
    if journal is None:
        target = Target("", "") if run is None else Target(run.info.run_id, run.info.experiment_id)
        return live() if live is not None else apply(op, target)
    journal.write(op)
    if journal.lost is not None:
        return None
    try:
        result = live() if live is not None else apply(op, journal.target)
    except Exception as err:
        cause = tracking_health.store_failure(err)
        if cause is None:
            raise
        journal.lose(cause, op)
        return None
    journal.sent = journal.ops
    return result


def read_ops(run_dir: str | Path) -> list[dict[str, Any]]:
    """The ops of a run dir's journal, in order ([] when it has none). A last line cut
    short (the process was killed as it wrote) is left out."""
    path = Path(run_dir, JOURNAL)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    ops = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ops.append(json.loads(line))
        except ValueError as err:
            if i == len(lines):
                break
            raise ValueError(f"{path}: line {i} is not an op ({err})") from err
    return ops
