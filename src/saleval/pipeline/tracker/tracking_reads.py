"""Reading runs back from the tracking store: a run's children (one query for every
caller: the per-method rows, catching up, deleting a run with its children, the saved
views), its per-method rows as a table, its artifacts downloaded (a train run's model
laid out as ``save_pretrained`` does), runs found by a filter.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from saleval.pipeline.records.run_naming import METHOD

PARENT_TAG = "mlflow.parentRunId"


def children_filter(run_id: str) -> str:
    """The search filter for the child runs of ``run_id``: what :func:`children` asks the
    store, and what a saved view of them puts in the UI's search box."""
    return f"tags.`{PARENT_TAG}` = '{run_id}'"


def children(client: MlflowClient, run: Any) -> list[Any]:
    """Every child run of the MLflow run ``run``: the one query for them, so the
    per-method rows, catching up and deleting a run with its children find the same runs."""
    return list(
        client.search_runs(
            [run.info.experiment_id], filter_string=children_filter(run.info.run_id),
            max_results=10_000,
        )
    )  # fmt: skip


def method_rows(run_id: str, client: MlflowClient | None = None) -> pd.DataFrame:
    """The per-method child runs of a stage run as a table: ``method``, ``run_id`` and a
    column per metric key (what :func:`log_method_rows` logged), one row per method."""
    client = client or MlflowClient()
    records = [
        {"method": c.data.tags[METHOD], "run_id": c.info.run_id, **c.data.metrics}
        for c in children(client, client.get_run(run_id))
        if METHOD in c.data.tags
    ]
    if not records:
        return pd.DataFrame(columns=["method", "run_id"])
    return pd.DataFrame(records).sort_values("method").reset_index(drop=True)


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
