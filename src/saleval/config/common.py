"""Schemas of the groups every stage composes: ``paths`` and ``tracking``."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class PathsConfig:
    """``conf/paths``: where the project, the shared data and the outputs live."""

    root_dir: str = "${saleval.root:}"
    data_root: str = "${saleval.data_root:}"
    #: <root_dir>/outputs (saleval.paths.outputs_under, the one place that default is stated)
    output_root: str = "${saleval.outputs:${paths.root_dir}}"


@dataclass
class TrackingConfig:
    """``conf/tracking``: the MLflow store (``MLFLOW_TRACKING_URI`` wins over ``uri``)."""

    uri: str = "sqlite:///${paths.output_root}/mlflow.db"
    artifact_root: str | None = "${paths.output_root}/mlartifacts"
    experiment: str | None = None  # null: saleval/<dataset name>
    run_name: str | None = None  # null: what ran (stage · dataset · model · methods)
    log_model: bool = True  # train: log the classifier as an MLflow model (transformers)
    # how long a stage waits, before any work, for a tracking server (or database) to answer
    # (docs/tracking.md, "When the tracking server fails"); a run that has started keeps
    # MLflow's own retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES, ..._TIMEOUT)
    wait_s: float = 15.0


@dataclass
class KGridConfig:
    """``conf/kgrid``: the crowd study's k-grid (Lu et al. 2024: k = 5, 10, 20, 30, 40), shared by tasks and metrics."""

    name: str = MISSING
    ks: list[int] = MISSING
