"""What a stage run read and what it trained, logged to MLflow: the rows as a run
input (name, digest, schema, size; never the rows) and the classifier as an MLflow model
(the ``transformers`` flavor). Both go through the run's journal like every other op
(:mod:`saleval.pipeline.tracker.tracking_journal`), so a store that was down gets them later
from ``saleval-catch-up`` (docs/tracking.md).
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from saleval.pipeline.tracker.tracking_journal import Target, applies, send


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
        described = dataset.to_dict()  # the schema is inferred here
    op = {"op": "dataset", "name": name, "dataset": described, "context": context}
    send(op, lambda: _log_input(dataset, context))


def _log_input(dataset: Any, context: str) -> None:
    """``mlflow.log_input``, again after a store's unique-key error: the jobs of a sweep
    log the same split at once, the store looks for the dataset, then inserts it, and the
    second insert breaks its unique key; the row is there then, and logging again links it."""
    for attempt in range(3):
        try:
            mlflow.log_input(dataset, context=context)
            return
        except mlflow.exceptions.MlflowException as err:
            if attempt == 2 or not _DUPLICATE.search(str(err)):
                raise
            time.sleep(0.5 * (attempt + 1))


#: a tracking store's unique-key error (PostgreSQL, SQLite, MySQL), as its server relays it
_DUPLICATE = re.compile(r"UniqueViolation|duplicate key|UNIQUE constraint failed|Duplicate entry")


@applies("dataset")
def _send_dataset(op: dict[str, Any], target: Target) -> None:
    """Catching up: the dataset as the live run described it (name, digest, schema)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    d = op["dataset"]
    entity = Dataset(
        name=d["name"], digest=d["digest"], source_type=d["source_type"], source=d["source"],
        schema=d.get("schema"), profile=d.get("profile"),
    )  # fmt: skip
    run = mlflow.active_run()
    assert run is not None
    MlflowClient().log_inputs(
        run.info.run_id,
        datasets=[DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, op["context"])])],
    )


def _pinned(packages: Sequence[str]) -> list[str]:
    out = []
    for name in packages:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def log_hf_model(model: Any, tokenizer: Any, name: str = "model") -> str | None:
    """The classifier as an MLflow model (the ``transformers`` flavor: loads as a
    text-classification pipeline, or through ``mlflow.pyfunc``); returns its model id
    (None when the store could not take it: the run dir's ``model/`` keeps it, and
    ``saleval-catch-up`` logs it from there).

    The requirements are pinned from the installed packages, which spares MLflow
    inferring them by loading the model again in a subprocess.
    """
    from saleval.modeling.models import MODEL_DIR

    op = {"op": "model", "name": name, "dir": MODEL_DIR}
    model_id = send(op, lambda: _log_model(model, tokenizer, name))
    return None if model_id is None else str(model_id)


@applies("model")
def _send_model(op: dict[str, Any], target: Target) -> str:
    """Catching up: the model saved in the run dir, logged as the live run would have."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if target.run_dir is None:
        raise ValueError("a model is logged from its run dir")
    where = target.run_dir / str(op["dir"])
    model = AutoModelForSequenceClassification.from_pretrained(where)
    model_id = _log_model(model, AutoTokenizer.from_pretrained(where), str(op["name"]))
    target.models["*"] = model_id
    return model_id


def _log_model(model: Any, tokenizer: Any, name: str) -> str:
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
