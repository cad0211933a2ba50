"""``saleval-catch-up``: log finished run dirs to a tracking store afterwards (the user's
view: docs/tracking.md, *When the tracking server fails*).

Every saleval run keeps what it sends to MLflow in its run dir (its journal,
:mod:`saleval.pipeline.tracker.tracking_journal`), so a run dir can be logged again later:

* **after an outage**, into the store it was meant for (the one its ``run.json`` names):
  its MLflow run gets the params, metrics, tags, files, child runs and views it missed,
  and ends with the run's own status (it is no longer RUNNING or KILLED);
* **into another store** (``--tracking-uri``), e.g. from a laptop's SQLite store to the
  lab's server: a new run with everything the first one holds, tagged
  ``saleval.copy_of=<first run id>``; its parent links (``parent.<input>`` tags) point at
  the parents' runs *in that store*, and a parent that is not there yet is logged first
  when its run dir is at hand (its recorded ``parent_dirs``), so a whole chain moves
  with its last run.

It takes run dirs, ``-m`` sweep dirs (every job) and ``saleval-run`` dirs (the pipeline's
run, then each stage's). It is idempotent: a run whose record says everything reached the
store, or that has a finished copy there, is left alone, so running it twice logs once.
Only FINISHED runs whose tables are the ones they wrote (:class:`~saleval.pipeline.records.run_record.RunRecord`)
are logged; the others are named, one line each, and the command exits 1 after logging the
rest.

Example::

    saleval-catch-up outputs/explain/2026-12-01/10-00-00
    saleval-catch-up --tracking-uri http://mlflow.lab:5000 outputs/run/multirun/2026-12-01/09-00-00
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saleval.errors import UserError
from saleval.pipeline import views
from saleval.pipeline.records.merge import PIPELINE_JSON, is_sweep_dir, sweep_jobs
from saleval.pipeline.records.run_record import FINISHED, RUN_JSON, RunRecord, write_atomically
from saleval.pipeline.tracker import tracking, tracking_health, tracking_journal, tracking_reads
from saleval.progress import interactive

log = logging.getLogger(__name__)

#: the tags of a run copied into another store: the first run's id, and its store
COPY_OF = "saleval.copy_of"
COPIED_FROM = "saleval.copied_from"
#: ``pipeline.json``'s field listing the pipeline run's copies in other stores: store URI
#: -> run id (a stage run's record holds them as :attr:`RunRecord.copies`)
COPIES = "copies"


class CatchUpError(UserError, ValueError):
    """A run dir that cannot be logged (not finished, changed tables, no journal)."""


@dataclass
class Record:
    """A run dir's record: a stage run's :class:`RunRecord` (``run`` set), or the
    ``pipeline.json`` of a ``saleval-run`` dir (``pipeline`` set), whose run is the
    pipeline's parent run."""

    run_dir: Path
    path: Path
    run: RunRecord | None = None
    pipeline: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, run_dir: Path) -> Record:
        if RunRecord.exists(run_dir):
            return cls(run_dir, RunRecord.path_in(run_dir), run=RunRecord.read(run_dir))
        path = run_dir / PIPELINE_JSON
        if path.is_file():
            return cls(run_dir, path, pipeline=json.loads(path.read_text()))
        raise CatchUpError(
            f"{run_dir}: neither {RUN_JSON} nor {PIPELINE_JSON}: not a saleval run dir"
        )

    @property
    def is_pipeline(self) -> bool:
        return self.run is None

    @property
    def status(self) -> str:
        """A ``saleval-run`` dir has a ``pipeline.json`` only once the pipeline finished."""
        return FINISHED if self.run is None else str(self.run.status)

    @property
    def tracking_uri(self) -> str:
        store = self.pipeline.get("tracking_uri") if self.run is None else self.run.tracking_uri
        return str(store or "")

    @property
    def journal(self) -> dict[str, Any]:
        """What the run's tracking store took (:data:`tracking_journal.RECORD`)."""
        held = self.pipeline.get(tracking_journal.RECORD) if self.run is None else self.run.tracking
        return dict(held or {})

    def save(
        self, journal: Mapping[str, Any] | None = None, copy: tuple[str, str] | None = None
    ) -> None:
        """Write the record again with ``journal`` as what the store took and/or ``copy``
        (store, run id) added to its copies."""
        if self.run is not None:
            copies = dict(self.run.copies or {}) | (dict([copy]) if copy else {})
            self.run = dataclasses.replace(
                self.run,
                tracking=self.run.tracking if journal is None else dict(journal),
                copies=copies or self.run.copies,
            )
            self.run.write(self.run_dir)
            return
        if journal is not None:
            self.pipeline[tracking_journal.RECORD] = dict(journal)
        if copy is not None:
            self.pipeline.setdefault(COPIES, {})[copy[0]] = copy[1]
        write_atomically(self.path, json.dumps(self.pipeline, indent=2))


def run_dirs(paths: Sequence[str | Path]) -> Iterator[Path]:
    """The run dirs the command's arguments name: a run dir, a ``saleval-run`` dir (itself,
    then its stages' runs; only the stages' runs when the pipeline was cut short), a ``-m``
    sweep dir (each job, the same way)."""
    for given in paths:
        path = Path(given).expanduser().resolve()
        if not path.is_dir():
            raise CatchUpError(f"{given}: no such directory")
        for job in sweep_jobs(path) if is_sweep_dir(path) else [path]:
            if RunRecord.exists(job):
                yield job
            elif (job / PIPELINE_JSON).is_file():
                yield job
                stages = json.loads((job / PIPELINE_JSON).read_text()).get("stages") or {}
                for stage in stages.values():
                    yield Path(str(stage["run_dir"])).resolve()
            else:  # a saleval-run cut short (no pipeline.json yet): its stages' runs
                yield from sorted(d for d in job.iterdir() if RunRecord.exists(d)) or [job]


@dataclass
class Outcome:
    run_dir: Path
    run_id: str | None
    line: str
    ok: bool


class CatchUp:
    """One command's catch-up into one store: runs already handled are remembered, so a
    parent reached from two children is logged once."""

    def __init__(
        self, uri: str | None, experiment: str | None = None, wait_s: float | None = None
    ) -> None:
        self.uri, self.experiment, self.wait_s = uri, experiment, wait_s
        #: (store, first run id) -> its id in that store
        self.ids: dict[tuple[str, str], str] = {}
        self.done: dict[Path, Outcome] = {}

    # -- one run -----------------------------------------------------------------------
    def run(self, run_dir: Path) -> Outcome:
        run_dir = run_dir.resolve()
        if run_dir in self.done:
            return self.done[run_dir]
        try:
            outcome = self._run(run_dir)
        except (UserError, ValueError) as err:
            outcome = Outcome(run_dir, None, f"not logged: {run_dir}: {err}", False)
        except Exception as err:
            cause = tracking_health.store_failure(err)
            if cause is None:
                raise
            line = (
                f"not logged: {run_dir}: the tracking store failed ({cause}); what was sent "
                "stays, and saleval-catch-up sends the rest when it is run again"
            )
            outcome = Outcome(run_dir, None, line, False)
        self.done[run_dir] = outcome
        return outcome

    def _run(self, run_dir: Path) -> Outcome:
        import mlflow
        from mlflow.tracking import MlflowClient

        record = Record.of(run_dir)
        self._check(record)
        ops = tracking_journal.read_ops(run_dir)
        start = ops[0]
        uri = self.uri or record.tracking_uri
        if not uri:
            raise CatchUpError("its record names no tracking store: pass --tracking-uri")
        tracking_health.check_store(uri, self.wait_s)
        mlflow.set_tracking_uri(uri)
        client = MlflowClient()
        first = str(start["run_id"])
        existing = _get_run(client, first)
        shown = tracking_health.redact(uri)
        if existing is not None:
            return self._resume(record, ops, existing, shown)
        return self._copy(record, ops, uri, shown)

    def _check(self, record: Record) -> None:
        if record.run is not None:
            problem = record.run.status_problem()
            if problem:
                raise CatchUpError(f"the run {problem}: rerun it; it is not logged")
            changed = record.run.changed_tables(record.run_dir)
            if changed:
                raise CatchUpError(record.run.changed_message(record.run_dir, changed))
        ops = tracking_journal.read_ops(record.run_dir)
        if not ops or ops[0].get("op") != "start":
            raise CatchUpError(
                f"no {tracking_journal.JOURNAL} (made by a saleval older than the journal, or "
                "its run never reached a store): it cannot be logged afterwards"
            )

    def _resume(self, record: Record, ops: list[dict[str, Any]], run: Any, shown: str) -> Outcome:
        """The run is in the store: send what it missed, and end it with its status."""
        import mlflow

        sent = int(record.journal.get("sent", len(ops)))
        status = _final_status(ops, record)
        rid = run.info.run_id
        if sent >= len(ops) and run.info.status == status:
            return Outcome(
                record.run_dir,
                rid,
                f"already logged: {record.run_dir} (run {rid} in {shown})",
                True,
            )
        todo = [op for op in ops[sent:] if op.get("op") not in ("start", "end")]
        target = tracking_journal.Target(
            rid, run.info.experiment_id, record.run_dir, replay=True, run_name=run.info.run_name
        )
        mlflow.start_run(run_id=rid)
        done = False
        try:
            for op in todo:
                tracking_journal.apply(op, target)
                sent += 1
            self._finish_record(record, ops)
            mlflow.log_artifact(str(record.path))
            done = True
        finally:
            if not done:  # the next catch-up goes on from here
                record.save(journal=dict(record.journal, sent=sent))
            _end(status if done else "KILLED", done)
        return Outcome(
            record.run_dir, rid,
            f"logged: {record.run_dir} -> run {rid} in {shown} ({len(todo)} missed op(s) sent, "
            f"ended {status})",
            True,
        )  # fmt: skip

    def _copy(self, record: Record, ops: list[dict[str, Any]], uri: str, shown: str) -> Outcome:
        """The run is not in the store: a copy of it, unless a finished one is there."""
        import mlflow
        from mlflow.tracking import MlflowClient

        start = ops[0]
        first = str(start["run_id"])
        client = MlflowClient()
        for old in _copies(client, first):
            if old.info.status == FINISHED:
                self.ids[(uri, first)] = old.info.run_id
                line = f"already logged: {record.run_dir} (run {old.info.run_id} in {shown})"
                return Outcome(record.run_dir, old.info.run_id, line, True)
            _delete_with_children(client, old)  # a copy cut short: made again
        tags = self._mapped_tags(start, uri)
        tags[COPY_OF] = first
        tags[COPIED_FROM] = str(start.get("uri") or record.tracking_uri)
        experiment = self.experiment or str(start.get("experiment") or "Default")
        experiment_id = tracking.setup(uri, experiment, _artifact_root(uri))
        run_name = str(start.get("run_name") or "")
        run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags)
        rid = run.info.run_id
        self.ids[(uri, first)] = rid
        target = tracking_journal.Target(
            rid, experiment_id, record.run_dir, replay=True, run_name=run_name
        )
        status = _final_status(ops, record)
        done = False
        try:
            for op in ops[1:]:
                if op.get("op") != "end":
                    tracking_journal.apply(op, target)
            record.save(copy=(shown, rid))
            mlflow.log_artifact(str(record.path))
            done = True
        finally:  # a copy cut short is not FINISHED: the next catch-up makes it again
            _end(status if done else "FAILED", done)
        return Outcome(
            record.run_dir, rid, f"logged: {record.run_dir} -> new run {rid} in {shown} "
            f"(a copy of {first}, {len(ops) - 1} op(s))", True,
        )  # fmt: skip

    def _finish_record(self, record: Record, ops: list[dict[str, Any]]) -> None:
        """The record says everything reached the store now."""
        done = tracking_journal.record_of(record.run_dir, len(ops), len(ops), None)
        done["caught_up"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        record.save(journal=done)

    # -- parent links ------------------------------------------------------------------
    def _mapped_tags(self, start: dict[str, Any], uri: str) -> dict[str, str]:
        """The first run's tags, with each parent's run id (``parent.<input>``) and the
        pipeline run it was nested in as they are in the target store (the parent logged
        first when the store lacks it and its run dir is here); a link that cannot be
        made is dropped (the nesting) or kept with a warning (a parent)."""
        tags = {str(k): str(v) for k, v in (start.get("tags") or {}).items()}
        tags.pop(tracking_reads.PARENT_TAG, None)
        for key in [k for k in tags if k.startswith("parent.")]:
            where = tags.get("parent_dir." + key.removeprefix("parent."))
            mapped = self._in_store(tags[key], where, uri)
            if mapped is None:
                log.warning(
                    "%s=%s is not in %s and its run dir %s cannot be logged: the link keeps "
                    "the first store's id", key, tags[key], tracking_health.redact(uri), where,
                )  # fmt: skip
            else:
                tags[key] = mapped
        nested = start.get("nested_in")
        if nested:
            mapped = self._in_store(str(nested), start.get("nested_in_dir"), uri)
            if mapped is not None:
                tags[tracking_reads.PARENT_TAG] = mapped
        return tags

    def _in_store(self, first: str, run_dir: str | None, uri: str) -> str | None:
        """The run ``first`` (of the first store) as the target store knows it."""
        from mlflow.tracking import MlflowClient

        if not first:
            return None
        if (uri, first) in self.ids:
            return self.ids[(uri, first)]
        client = MlflowClient()
        if _get_run(client, first) is not None:
            return first
        for old in _copies(client, first):
            if old.info.status == FINISHED:
                return str(old.info.run_id)
        if run_dir and Path(run_dir).is_dir():
            outcome = self.run(Path(run_dir))
            print(outcome.line, flush=True)
            if outcome.ok and outcome.run_id:
                return outcome.run_id
        return None


#: tracking and views register the function that sends each kind of op a journal holds
#: (:func:`saleval.pipeline.tracker.tracking_journal.applies`): imported, every kind has its sender
_SENDERS = (tracking, views)


def _get_run(client: Any, run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        cause = tracking_health.store_failure(err)
        # an authenticating server answers 403 for a run it does not hold (it cannot tell
        # whose experiment it would be in): for this account, the run is not there
        if cause is not None and not cause.startswith("403"):
            raise
        return None
    return None if run.info.lifecycle_stage == "deleted" else run


def _copies(client: Any, first: str) -> list[Any]:
    exps = [e.experiment_id for e in client.search_experiments()]
    if not exps:
        return []
    return list(client.search_runs(exps, filter_string=f"tags.`{COPY_OF}` = '{first}'"))


def _delete_with_children(client: Any, run: Any) -> None:
    for child in tracking_reads.children(client, run):
        client.delete_run(child.info.run_id)
    client.delete_run(run.info.run_id)


def _end(status: str, done: bool) -> None:
    """End the active run; after a failure, without waiting minutes for a store that may
    be down (its status then stays as the store has it)."""
    import mlflow

    if done:
        mlflow.end_run(status=status)
        return
    with tracking_health.quick_requests(3), contextlib.suppress(Exception):
        mlflow.end_run(status=status)


def _final_status(ops: list[dict[str, Any]], record: Record) -> str:
    ends = [op for op in ops if op.get("op") == "end"]
    return str(ends[-1]["status"]) if ends else record.status


def _artifact_root(uri: str) -> str | None:
    """Where a new experiment of a local SQLite store keeps its files: beside the store,
    as saleval's configs put them (``<output root>/mlartifacts``)."""
    if uri.startswith("sqlite:///"):
        return str(Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts")
    return None


def catch_up(
    paths: Sequence[str | Path],
    uri: str | None = None,
    experiment: str | None = None,
    wait_s: float | None = None,
) -> list[Outcome]:
    """Log every run dir ``paths`` name (:func:`run_dirs`) to ``uri`` (default: the store
    each run's record names); one :class:`Outcome` per run dir, in order."""
    session = CatchUp(uri, experiment, wait_s)
    out = []
    for run_dir in run_dirs(paths):
        seen = run_dir.resolve() in session.done
        outcome = session.run(run_dir)
        if not seen:
            out.append(outcome)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``saleval-catch-up``."""
    if not interactive():  # MLflow's artifact bars would keep every redraw in a file
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    parser = argparse.ArgumentParser(
        prog="saleval-catch-up",
        description=(
            "Log finished saleval run dirs (run, -m sweep or saleval-run dirs) to a tracking "
            "store afterwards: what an outage kept from it, or all of it into another store. "
            "Idempotent. docs/tracking.md, 'When the tracking server fails'."
        ),
    )
    parser.add_argument("paths", nargs="+", help="run dirs, -m sweep dirs, saleval-run dirs")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="the store to log to (default: MLFLOW_TRACKING_URI, else the one each run's "
        "run.json names); never with a password in it: MLFLOW_TRACKING_USERNAME/PASSWORD",
    )
    parser.add_argument("--experiment", default=None, help="for runs new to the store")
    parser.add_argument(
        "--wait-s", type=float, default=None, help="how long to wait for the store (15 s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    uri = args.tracking_uri or os.environ.get(tracking_health.URI_ENV) or None
    try:
        if uri is not None:
            tracking_health.check_uri(uri)
        outcomes = catch_up(args.paths, uri, args.experiment, args.wait_s)
    except UserError as err:
        print(f"saleval-catch-up: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        return 2
    printed = set()
    for outcome in outcomes:
        if outcome.line not in printed:
            print(outcome.line, file=sys.stdout if outcome.ok else sys.stderr, flush=True)
            printed.add(outcome.line)
    return 0 if all(o.ok for o in outcomes) else 1
