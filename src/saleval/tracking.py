"""MLflow conventions shared by every stage.

* Store: ``tracking.uri`` from config (default ``sqlite:///<root>/outputs/mlflow.db``);
  ``MLFLOW_TRACKING_URI`` in the environment wins so a lab can point every stage
  at its tracking server without touching configs.
* One experiment per dataset (``saleval/<dataset>``) so the MLflow UI lists human
  and automated runs of one dataset side by side.
* Tags on every run: ``stage``, ``dataset``, ``model``, ``parent.<input>`` = the
  run id of each input run, ``run_dir``, ``fingerprint``, ``host`` and ``simulated``
  where it applies; jobs of a ``-m`` multirun add ``sweep``, ``sweep.job`` and
  ``sweep.overrides``. Inside ``saleval-run`` each stage is a nested child of the
  pipeline's parent run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

try:
    import fcntl
except ImportError:  # Windows: no multirun store lock
    fcntl = None  # type: ignore[assignment]

_MAX_PARAM_LEN = 6000
_BATCH = 100


def tracking_uri(configured: str | None) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if not configured:
        raise ValueError("tracking.uri is empty and MLFLOW_TRACKING_URI is not set")
    return configured


def _is_local(uri: str) -> bool:
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
    """Point MLflow at the store, make the experiment exist and active; returns its id."""
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
            if artifact_root and _is_local(uri):
                location = Path(artifact_root, experiment.replace("/", "_")).resolve().as_uri()
            try:
                experiment_id = client.create_experiment(experiment, artifact_location=location)
            except mlflow.exceptions.MlflowException:  # created concurrently by a sibling job
                exp = client.get_experiment_by_name(experiment)
                assert exp is not None
                experiment_id = exp.experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def log_params(params: Mapping[str, Any]) -> None:
    """Log (flattened) params in batches, truncating values MLflow would refuse."""
    items = [(param_key(k), str(v)[:_MAX_PARAM_LEN]) for k, v in flatten(params).items()]
    for i in range(0, len(items), _BATCH):
        mlflow.log_params(dict(items[i : i + _BATCH]))


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    clean = {_metric_key(k): float(v) for k, v in metrics.items() if v is not None}
    items = list(clean.items())
    for i in range(0, len(items), _BATCH):
        mlflow.log_metrics(dict(items[i : i + _BATCH]), step=step)


def _metric_key(name: str) -> str:
    """MLflow keys allow alphanumerics, _-./ and spaces; map anything else to '_'."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


def log_files(paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir():
            mlflow.log_artifacts(str(p), artifact_path=(artifact_path or "") + p.name)
        elif p.is_file():
            mlflow.log_artifact(str(p), artifact_path=artifact_path)


def find_runs(experiment: str, filter_string: str) -> list[Any]:
    """Runs of ``experiment`` matching an MLflow search filter, newest first."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    if exp is None:
        return []
    return MlflowClient().search_runs(
        [exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"]
    )


def param_key(name: str) -> str:
    """A param key MLflow accepts, whatever a config key holds (label names become keys
    under ``dataset.label_descriptions``: ``&``, ``(``, ``'``, ``?``, HTML...).

    MLflow keys allow ASCII letters, digits, ``_-./`` and spaces; a key with anything
    else has it replaced by ``_`` and gets a short hash of the original, so two labels
    that differ only there stay two params.

    >>> param_key("dataset.label_descriptions.Sci/Tech")
    'dataset.label_descriptions.Sci/Tech'
    >>> param_key("dataset.label_descriptions.R&D (new)?")
    'dataset.label_descriptions.R_D _new__-c931b83f'
    """
    clean = "".join(c if (c.isascii() and c.isalnum()) or c in "_-./ " else "_" for c in name)
    if clean == name and len(name) <= _MAX_KEY_LEN:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "backslashreplace")).hexdigest()[:8]
    return f"{clean[: _MAX_KEY_LEN - 9]}-{digest}"


_MAX_KEY_LEN = 250
