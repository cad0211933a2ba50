"""The MLflow client and store every stage uses (the user's view: ``docs/tracking.md``).

* Store: ``tracking.uri`` from config (default ``sqlite:///<root>/outputs/mlflow.db``);
  ``MLFLOW_TRACKING_URI`` in the environment wins so a lab can point every stage
  at its tracking server without touching configs. The URI actually used is what
  the run's ``tracking.uri`` param and ``run.json`` record (:func:`tracking_uri`,
  :func:`setup`).
* One experiment per dataset (``saleval/<dataset>``), tagged as a machine-learning
  experiment (:data:`EXPERIMENT_KIND`) so the UI lists its runs side by side.
* What is logged, the same way everywhere: params and metrics in batches under the keys
  of :mod:`saleval.pipeline.run_naming`, files, the rows a run read, the trained model,
  and one nested child run per method (:func:`log_method_rows`) whose keys are the same
  for every method, so the runs table and the compare view put methods in rows.

The rest of the MLflow side is one module per concept: run names, params and keys
(:mod:`~saleval.pipeline.run_naming`), links and saved views
(:mod:`~saleval.pipeline.views`), runs whose process died
(:mod:`~saleval.pipeline.dead_runs`), a stage run's own lifecycle
(:mod:`~saleval.pipeline.stage_tracking`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from saleval.pipeline.run_naming import METHOD, SEP, flatten, metric_key, param_key

try:
    import fcntl
except ImportError:  # Windows: no multirun store lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_MAX_PARAM_LEN = 6000
_BATCH = 100

#: The experiment tag MLflow 3's UI reads to tell a machine-learning experiment from a
#: GenAI one (``mlflow.experimentKind``); newer UIs decide by the ``workflowType`` of
#: the page instead, which :func:`saleval.pipeline.views.ui_url` sets.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def tracking_uri(configured: str | None) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if not configured:
        raise ValueError("tracking.uri is empty and MLFLOW_TRACKING_URI is not set")
    return configured


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


def log_params(params: Mapping[str, Any]) -> None:
    """Log (flattened) params in batches, truncating values MLflow would refuse."""
    items = [(param_key(k), str(v)[:_MAX_PARAM_LEN]) for k, v in flatten(params).items()]
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
    items = list(clean.items())
    for i in range(0, len(items), _BATCH):
        mlflow.log_metrics(dict(items[i : i + _BATCH]), step=step, **kwargs)


def log_files(paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir():
            mlflow.log_artifacts(str(p), artifact_path=(artifact_path or "") + p.name)
        elif p.is_file():
            mlflow.log_artifact(str(p), artifact_path=artifact_path)


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
    parent = mlflow.active_run()
    if parent is None:
        return {}
    if rows[key].duplicated().any():
        dup = sorted(rows.loc[rows[key].duplicated(), key].astype(str))
        raise ValueError(f"log_method_rows({stage}): {key}s {dup} have more than one row")
    client = MlflowClient()
    experiment_id = parent.info.experiment_id
    values = rows.drop(columns=[key]).select_dtypes(include="number")
    now = int(time.time() * 1000)
    ids: dict[str, str] = {}
    for i, method in enumerate(rows[key].astype(str)):
        run_tags = {
            **(tags or {}),
            "stage": stage,
            key: method,
            "mlflow.parentRunId": parent.info.run_id,
        }
        child = client.create_run(experiment_id, tags=run_tags, run_name=f"{method}{SEP}{stage}")
        row = values.iloc[i]
        metrics = [
            Metric(metric_key(str(k)), float(v) if _finite(v) else math.nan, now, 0)
            for k, v in row.items()
        ]
        own = (settings or {}).get(method, {})
        run_params = [
            Param(param_key(k), str(v)[:_MAX_PARAM_LEN])
            for k, v in {**own, **(params or {}), key: method}.items()
        ]
        for j in range(0, max(len(metrics), 1), _BATCH):
            client.log_batch(
                child.info.run_id,
                metrics=metrics[j : j + _BATCH],
                params=run_params if j == 0 else (),
            )
        client.set_terminated(child.info.run_id)
        ids[method] = child.info.run_id
    if table:
        mlflow.log_table(rows.reset_index(drop=True), artifact_file=f"tables/{table}.json")
    return ids


def method_rows(run_id: str, client: MlflowClient | None = None) -> pd.DataFrame:
    """The per-method child runs of a stage run as a table: ``method``, ``run_id`` and a
    column per metric key (what :func:`log_method_rows` logged), one row per method."""
    client = client or MlflowClient()
    run = client.get_run(run_id)
    children = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
        max_results=10_000,
    )
    records = [
        {"method": c.data.tags[METHOD], "run_id": c.info.run_id, **c.data.metrics}
        for c in children
        if METHOD in c.data.tags
    ]
    if not records:
        return pd.DataFrame(columns=["method", "run_id"])
    return pd.DataFrame(records).sort_values("method").reset_index(drop=True)


def log_dataset(df: pd.DataFrame, name: str, context: str, targets: str | None = None) -> None:
    """The rows a run read (a dataset split, the explained samples) as a run input:
    name, digest, schema and size, not the rows themselves."""
    columns = [c for c in ("sample_id", "text", "label") if c in df.columns]
    from mlflow.data.pandas_dataset import from_pandas

    with warnings.catch_warnings():  # its hint that int columns cannot hold NaN: not ours
        warnings.filterwarnings("ignore", message=".*integer column", category=UserWarning)
        dataset = from_pandas(
            df[columns].reset_index(drop=True),
            name=name,
            targets=targets if targets in columns else None,
        )
        for attempt in range(3):
            try:
                mlflow.log_input(dataset, context=context)  # the schema is inferred here
                return
            except mlflow.exceptions.MlflowException as err:
                # the jobs of a sweep log the same split at once: the store looks for the
                # dataset, then inserts it, and the second insert breaks its unique key;
                # the row is there now, and logging again links it
                if attempt == 2 or not _DUPLICATE.search(str(err)):
                    raise
                time.sleep(0.5 * (attempt + 1))


#: a tracking store's unique-key error (PostgreSQL, SQLite, MySQL), as its server relays it
_DUPLICATE = re.compile(r"UniqueViolation|duplicate key|UNIQUE constraint failed|Duplicate entry")


def _pinned(packages: Sequence[str]) -> list[str]:
    out = []
    for name in packages:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def log_hf_model(model: Any, tokenizer: Any, name: str = "model") -> str:
    """The classifier as an MLflow model (the ``transformers`` flavor: loads as a
    text-classification pipeline, or through ``mlflow.pyfunc``); returns its model id.

    The requirements are pinned from the installed packages, which spares MLflow
    inferring them by loading the model again in a subprocess.
    """
    flavor_log = logging.getLogger("mlflow.transformers")
    level = flavor_log.level
    flavor_log.setLevel(logging.ERROR)  # offline it warns that no hub model card was found
    try:
        with warnings.catch_warnings():  # MLflow's own note on its internal type hints
            warnings.filterwarnings("ignore", message=".*Any type hint", category=UserWarning)
            info = mlflow.transformers.log_model(
                transformers_model={"model": model, "tokenizer": tokenizer},
                name=name,
                task="text-classification",
                pip_requirements=_pinned(["torch", "transformers", "tokenizers"]),
            )
    finally:
        flavor_log.setLevel(level)
    mlflow.set_tag("model_uri", info.model_uri)
    return str(info.model_id)


def download_run(run_id: str, target: Path) -> None:
    """A run's artifacts into ``target``; a train run's logged MLflow model (tag
    ``model_uri``) becomes ``target/model`` as ``save_pretrained`` lays it out."""
    mlflow.artifacts.download_artifacts(run_id=run_id, dst_path=str(target))
    uri = MlflowClient().get_run(run_id).data.tags.get("model_uri")
    if not uri or Path(target, "model", "config.json").is_file():
        return
    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=str(target / "_mlflow_model")
        )
    )
    out = target / "model"
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("model", "components/tokenizer"):
        if (local / sub).is_dir():
            shutil.copytree(local / sub, out, dirs_exist_ok=True)
    shutil.rmtree(target / "_mlflow_model", ignore_errors=True)


def find_runs(experiment: str, filter_string: str) -> list[Any]:
    """Runs of ``experiment`` matching an MLflow search filter, newest first."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    if exp is None:
        return []
    return MlflowClient().search_runs(
        [exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"]
    )
