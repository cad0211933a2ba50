"""The MLflow client and store every stage uses (the user's view: ``docs/tracking.md``).

* Store: ``tracking.uri`` from config (default ``sqlite:///<root>/outputs/mlflow.db``);
  ``MLFLOW_TRACKING_URI`` in the environment wins so a lab can point every stage
  at its tracking server without touching configs. The URI actually used is what
  the run's ``tracking.uri`` param and ``run.json`` record (:func:`tracking_uri`,
  :func:`setup`).
* One experiment per dataset (``saleval/<dataset>``), tagged as a machine-learning
  experiment (:data:`EXPERIMENT_KIND`) so the UI lists its runs side by side.
* What is logged, the same way everywhere: params and metrics in batches under the keys
  of :mod:`saleval.pipeline.records.run_naming`, files, the rows a run read, the trained model,
  and one nested child run per method (:func:`log_method_rows`) whose keys are the same
  for every method, so the runs table and the compare view put methods in rows.

The rest of the MLflow side is one module per concept: run names, params and keys
(:mod:`~saleval.pipeline.records.run_naming`), links and saved views
(:mod:`~saleval.pipeline.views`), runs whose process died
(:mod:`~saleval.pipeline.records.dead_runs`), a stage run's own lifecycle
(:mod:`~saleval.pipeline.tracker.stage_tracking`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from saleval.errors import UserError
from saleval.pipeline.records.jsonfiles import plain
from saleval.pipeline.records.run_naming import METHOD, SEP, flatten, metric_key, param_key
from saleval.pipeline.tracker import tracking_health, tracking_journal, tracking_models
from saleval.pipeline.tracker.tracking_journal import Target, applies, send
from saleval.pipeline.tracker.tracking_reads import PARENT_TAG, children

try:
    import fcntl
except ImportError:  # Windows: no multirun store lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: the modules whose senders a replayed journal needs besides this one's (the dataset and
#: model ops: :mod:`saleval.pipeline.tracker.tracking_models`), loaded with it
SENDERS = (tracking_models,)

_MAX_PARAM_LEN = 6000
_BATCH = 100

#: The experiment tag MLflow 3's UI reads to tell a machine-learning experiment from a
#: GenAI one (``mlflow.experimentKind``); newer UIs decide by the ``workflowType`` of
#: the page instead, which :func:`saleval.pipeline.views.ui_url` sets.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def tracking_uri(configured: str | None) -> str:
    """The store a run uses: ``MLFLOW_TRACKING_URI`` when set, else ``tracking.uri``; one
    holding a password is refused (:func:`saleval.pipeline.tracker.tracking_health.check_uri`):
    it would be written into every run dir and MLflow."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    uri = env or configured
    if not uri:
        raise ValueError("tracking.uri is empty and MLFLOW_TRACKING_URI is not set")
    tracking_health.check_uri(uri)
    return uri


def is_local(uri: str) -> bool:
    return uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock next to a SQLite store while MLflow opens it and the experiment.

    MLflow creates the tables of a new SQLite file when a process first opens it, without
    a lock across processes (``SqlAlchemyStore.__init__``): two jobs of a joblib multirun
    starting on a fresh store race, and one fails ("duplicate column name"). Later writes
    are safe: MLflow sets SQLite's ``busy_timeout`` (20 s) on every session. Other stores
    need no lock.
    """
    if fcntl is None or not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    with open(db.with_name(db.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def setup(uri: str | None, experiment: str, artifact_root: str | None = None) -> str:
    """Point MLflow at the store, make the experiment exist and active; returns its id.

    The experiment is tagged :data:`EXPERIMENT_KIND` (once), so the UI treats it as a
    machine-learning experiment whose page is its runs, not the GenAI traces.
    """
    uri = tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    with _store_lock(uri):
        client = MlflowClient()
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            experiment_id = exp.experiment_id
        else:
            location = None
            if artifact_root and is_local(uri):
                location = Path(artifact_root, experiment.replace("/", "_")).resolve().as_uri()
            try:
                experiment_id = client.create_experiment(experiment, artifact_location=location)
            except mlflow.exceptions.MlflowException:  # created concurrently by a sibling job
                exp = client.get_experiment_by_name(experiment)
                assert exp is not None
                experiment_id = exp.experiment_id
        key, kind = EXPERIMENT_KIND
        if exp is None or exp.tags.get(key) != kind:
            client.set_experiment_tag(experiment_id, key, kind)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def start_run(
    run_dir: Path,
    uri: str,
    experiment: str,
    run_name: str,
    tags: Mapping[str, str],
    nested: bool = False,
    fresh: bool = True,
) -> tracking_journal.Journal:
    """Start a saleval run (nested under the active run when ``nested``) and its journal in
    ``run_dir`` (:mod:`saleval.pipeline.tracker.tracking_journal`): from here on, what it logs is
    kept in the run dir as well, so a store that fails later loses nothing."""
    outer = mlflow.active_run() if nested else None
    run = mlflow.start_run(run_name=run_name, nested=nested, tags=dict(tags))
    start = {
        "run_id": run.info.run_id,
        "experiment": experiment,
        "run_name": run_name,
        "tags": dict(tags),
        "uri": tracking_health.redact(uri),
        "nested_in": None if outer is None else outer.info.run_id,
        "nested_in_dir": None if outer is None else outer.data.tags.get("run_dir"),
    }
    target = Target(run.info.run_id, run.info.experiment_id, Path(run_dir), run_name=run_name)
    return tracking_journal.open_journal(Path(run_dir), uri, target, start, fresh)


def end_run(journal: tracking_journal.Journal, status: str) -> None:
    """End the journal's run (the active one) with ``status``. When its store failed
    earlier (see :func:`recover`), the run is left to ``saleval-catch-up`` and only this
    process lets go of it."""
    op = {"op": "end", "status": status}
    try:
        journal.write(op)
    except OSError as err:  # a full disk: the store still hears of the end
        log.warning("%s: the run's end could not be journaled: %s", journal.path, err)
    try:
        if journal.lost is not None:
            with tracking_health.quick_requests(3), contextlib.suppress(Exception):
                mlflow.end_run(status=status)  # leaves MLflow's stack; the store may be down
            return
        try:
            mlflow.end_run(status=status)
        except Exception as err:
            cause = tracking_health.store_failure(err)
            if cause is None:
                raise
            journal.lose(cause, op)
            return
        journal.sent = journal.ops
    finally:
        tracking_journal.close_journal(journal)


def recover(journal: tracking_journal.Journal, wait_s: float | None = None) -> bool:
    """Send what a journal's run could not, if its store answers again within ``wait_s``
    seconds; True when everything written so far has been sent."""
    tracking_health.forget_checks()
    try:
        tracking_health.check_store(journal.uri, wait_s)
        replay(journal)
    except Exception as err:  # whatever stops it, the run's work is done: saleval-catch-up
        cause = tracking_health.store_failure(err)
        journal.lost = cause or journal.lost
        text = " ".join(str(err).split())[:300]
        if cause or isinstance(err, UserError):  # still down: the run's last line says so
            log.debug("the tracking store is still unavailable: %s", text)
        else:
            log.warning("sending what the tracking store missed failed: %s", text)
        return False
    return True


def keep_direct_metrics(journal: tracking_journal.Journal) -> None:
    """Journal the metrics that reached the run without saleval's journal (Lightning's
    per-epoch curves, logged by its callback straight to MLflow), read back from the store
    with their steps and times, so a catch-up into another store has them too. Nothing is
    sent; a store that fails here is left alone (the run's own ops are all kept)."""
    if journal.lost is not None:
        return
    client = MlflowClient()
    run_id = journal.target.run_id
    try:
        known = {
            k for op in tracking_journal.read_ops(journal.run_dir)
            if op.get("op") == "metrics" for k in op["metrics"]
        }  # fmt: skip
        direct = [k for k in client.get_run(run_id).data.metrics if k not in known]
        points: dict[tuple[int, int], dict[str, float]] = {}
        for key in sorted(direct):
            for m in client.get_metric_history(run_id, key):
                points.setdefault((m.step, m.timestamp), {})[key] = m.value
    except Exception as err:
        if tracking_health.store_failure(err) is None:
            raise
        return
    for (step, when), values in sorted(points.items()):
        journal.write({"op": "metrics", "metrics": values, "step": step, "time": when,
                       "model_id": None})  # fmt: skip
    journal.sent = journal.ops  # they are in the store already


def replay(journal: tracking_journal.Journal) -> None:
    """Send the journal's ops the store has not taken yet (its run is the active one), as a
    catch-up does; the first failure stops it where it is."""
    ops = tracking_journal.read_ops(journal.run_dir)
    target = dataclasses.replace(journal.target, replay=True)
    for op in ops[journal.sent :]:
        tracking_journal.apply(op, target)
        journal.sent += 1
    journal.lost = None


def log_params(params: Mapping[str, Any]) -> None:
    """Log (flattened) params in batches, truncating values MLflow would refuse."""
    items = {param_key(k): str(v)[:_MAX_PARAM_LEN] for k, v in flatten(params).items()}
    send({"op": "params", "params": items})


@applies("params")
def _send_params(op: dict[str, Any], target: Target) -> None:
    items = list(op["params"].items())
    for i in range(0, len(items), _BATCH):
        mlflow.log_params(dict(items[i : i + _BATCH]))


def _finite(v: Any) -> bool:
    try:
        return v is not None and not isinstance(v, bool | str) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def log_metrics(metrics: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
    """Log values under :func:`metric_key` names (None is skipped; ``kwargs``: MLflow's
    ``model_id``/``dataset``, which link them to a logged model and a dataset)."""
    clean = {metric_key(k): float(v) for k, v in metrics.items() if v is not None}
    op = {
        "op": "metrics",
        "metrics": clean,
        "step": step,
        "time": int(time.time() * 1000),
        "model_id": kwargs.pop("model_id", None),
    }
    if kwargs:  # a dataset object: sent as it is (a catch-up sends the values without it)
        send(op, lambda: _send_metrics(op, Target("", ""), **kwargs))
    else:
        send(op)


@applies("metrics")
def _send_metrics(op: dict[str, Any], target: Target, **kwargs: Any) -> None:
    model_id = op.get("model_id")
    if model_id is not None:  # the model as the target store knows it
        model_id = target.models.get(model_id) or target.models.get("*") or model_id
    items = list(op["metrics"].items())
    for i in range(0, len(items), _BATCH):
        mlflow.log_metrics(
            dict(items[i : i + _BATCH]), step=op.get("step"), timestamp=op.get("time"),
            model_id=model_id, **kwargs,
        )  # fmt: skip


def set_tags(tags: Mapping[str, Any]) -> None:
    """Tag the active run."""
    send({"op": "tags", "tags": {str(k): str(v) for k, v in tags.items()}})


@applies("tags")
def _send_tags(op: dict[str, Any], target: Target) -> None:
    mlflow.set_tags(op["tags"])


def rename_run(name: str) -> None:
    """Give the active run a new name (it says what ran, learnt as the stage runs)."""
    send({"op": "name", "name": name})


@applies("name")
def _send_name(op: dict[str, Any], target: Target) -> None:
    run = mlflow.active_run()
    assert run is not None
    MlflowClient().update_run(run.info.run_id, name=op["name"])
    target.run_name = op["name"]


def log_files(paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    """Log files and directories (a directory under its own name) to the active run; a path
    that is not there is left out. Inside a run dir they are journaled by their path in it."""
    run = mlflow.active_run()
    journal = tracking_journal.active(run.info.run_id if run is not None else None)
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        where = str(p.resolve())
        if journal is not None and journal.run_dir.resolve() in p.resolve().parents:
            where = str(p.resolve().relative_to(journal.run_dir.resolve()))
        send({"op": "file", "path": where, "artifact_path": artifact_path})


@applies("file")
def _send_file(op: dict[str, Any], target: Target) -> None:
    p = Path(op["path"])
    if not p.is_absolute() and target.run_dir is not None:
        p = target.run_dir / p
    artifact_path = op.get("artifact_path")
    if p.is_dir():
        mlflow.log_artifacts(str(p), artifact_path=(artifact_path or "") + p.name)
    elif p.is_file():
        mlflow.log_artifact(str(p), artifact_path=artifact_path)
    else:
        log.warning("%s is gone: not logged", p)


def log_method_rows(
    rows: pd.DataFrame,
    stage: str,
    table: str | None = None,
    tags: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    key: str = METHOD,
) -> dict[str, str]:
    """One nested child run per method under the active (stage) run; returns their ids.

    ``rows``: one row per method, a ``method`` column and numeric columns, whose names
    become the metric keys (:func:`metric_key`), the same in every child so the UI puts
    methods in rows (an empty cell, e.g. the baseline's test against itself, is NaN).
    Each child is named ``<method> · <stage>`` and carries the tag and param ``method``,
    the tag ``stage``, ``tags`` (dataset, model, simulated...), ``params`` and its own
    ``settings[method]`` as params (:func:`method_settings`). ``table``: the rows also go
    to the stage run as an MLflow table (``tables/<table>.json``), shown in the UI's
    artifact view. ``key``: the column naming the rows when they are not methods (e.g.
    ``design`` for saleval-plan); it takes the place of ``method`` in names and tags.
    """
    if mlflow.active_run() is None:
        return {}
    if rows[key].duplicated().any():
        dup = sorted(rows.loc[rows[key].duplicated(), key].astype(str))
        raise ValueError(f"log_method_rows({stage}): {key}s {dup} have more than one row")
    op = {
        "op": "rows",
        "stage": stage,
        "key": key,
        "names": rows[key].astype(str).tolist(),
        "columns": [str(c) for c in rows.columns],
        "data": plain(rows.to_numpy().tolist()),
        "table": table,
        "tags": dict(tags or {}),
        "params": plain(dict(params or {})),
        "settings": plain(dict(settings or {})),
    }
    ids = send(op, lambda: _send_rows(rows, op, Target("", "")))
    return ids or {}


@applies("rows")
def _send_rows_op(op: dict[str, Any], target: Target) -> dict[str, str]:
    rows = pd.DataFrame(op["data"], columns=op["columns"])
    for c in rows.columns:  # numbers come back as numbers (None as NaN)
        if c != op["key"]:
            converted = pd.to_numeric(rows[c], errors="coerce")
            if converted.notna().sum() == rows[c].notna().sum():
                rows[c] = converted
    return _send_rows(rows, op, target)


def _send_rows(rows: pd.DataFrame, op: Mapping[str, Any], target: Target) -> dict[str, str]:
    """The child runs of :func:`log_method_rows`; catching up (``target.replay``), a child
    made before is completed, not made twice."""
    parent = mlflow.active_run()
    if parent is None:
        return {}
    stage, key, table = op["stage"], op["key"], op.get("table")
    tags, params, settings = op.get("tags") or {}, op.get("params") or {}, op.get("settings") or {}
    client = MlflowClient()
    made: dict[str, Any] = {}
    if target.replay:
        for child in children(client, parent):
            if child.data.tags.get("stage") == stage and key in child.data.tags:
                made[child.data.tags[key]] = child
    values = rows.drop(columns=[key]).select_dtypes(include="number")
    now = int(time.time() * 1000)
    ids: dict[str, str] = {}
    for i, method in enumerate(rows[key].astype(str)):
        old = made.get(method)
        if old is not None and old.info.status == "FINISHED":
            ids[method] = old.info.run_id
            continue
        if old is not None:
            child_id = old.info.run_id
        else:
            child_id = make_child(client, parent, method, stage, {**tags, key: method})
        row = values.iloc[i]
        metrics = [
            Metric(metric_key(str(k)), float(v) if _finite(v) else math.nan, now, 0)
            for k, v in row.items()
        ]
        own = settings.get(method, {})
        run_params = [
            Param(param_key(k), str(v)[:_MAX_PARAM_LEN])
            for k, v in {**own, **params, key: method}.items()
        ]
        if old is not None:  # params are kept once logged: log only the missing ones
            run_params = [p for p in run_params if p.key not in old.data.params]
        for j in range(0, max(len(metrics), 1), _BATCH):
            client.log_batch(
                child_id,
                metrics=metrics[j : j + _BATCH],
                params=run_params if j == 0 else (),
            )
        client.set_terminated(child_id)
        ids[method] = child_id
    if table:
        mlflow.log_table(rows.reset_index(drop=True), artifact_file=f"tables/{table}.json")
    return ids


#: the tag by which MLflow links a child run to its parent (its UI nests it so)
def make_child(
    client: MlflowClient, parent: Any, name: str, stage: str, tags: Mapping[str, str]
) -> str:
    """A child run of the stage run ``parent``, named ``<name> · <stage>`` and tagged
    ``stage`` and ``tags``: the one way saleval makes child runs, for a method's row
    (:func:`log_method_rows`) as for a model a stage trains (:func:`child_run`). Returns
    its id; it is RUNNING until ended."""
    run_tags = {**tags, "stage": stage, PARENT_TAG: parent.info.run_id}
    run = client.create_run(
        parent.info.experiment_id, tags=run_tags, run_name=f"{name}{SEP}{stage}"
    )
    return str(run.info.run_id)


@contextlib.contextmanager
def child_run(name: str, stage: str, tags: Mapping[str, str]) -> Iterator[str | None]:
    """A child run of the active (stage) run (:func:`make_child`), active inside the block,
    so what is logged there goes to it (the per-epoch curves of one of the models a stage
    trains: two models' curves would otherwise interleave under the same keys); ended
    FINISHED, or FAILED when the block raises. Outside a run, nothing is made (None).
    Like Lightning's curves, what is logged inside is not journaled (docs/tracking.md)."""
    parent = mlflow.active_run()
    if parent is None:
        yield None
        return
    child = make_child(MlflowClient(), parent, name, stage, tags)
    with mlflow.start_run(run_id=child, nested=True):
        yield child
