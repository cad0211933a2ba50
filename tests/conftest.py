"""Shared fixtures: composed configs shrunk for tests, a private MLflow store, a tiny model.

Nothing here touches the network: the tiny BERT is random, built from a config with
the embedded tokenizer, and data comes from ../shared/data or is made in the test.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import paths
from saleval.config.keys import check_keys
from saleval.pipeline.compose import register_configs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# every test computes its methods; the reuse test turns reuse on for itself
os.environ.setdefault("SALEVAL_METHOD_REUSE", "0")

DATA_ROOT = paths.default_data_root()


def tiny_model_cfg(**config: Any) -> dict[str, Any]:
    """``conf/model/tiny.yaml`` (the random 2-layer BERT with the embedded tokenizer) as a
    plain dict, its ``config`` (BertConfig's sizes) updated with ``config``: the one place
    the tests take the tiny model from, so its sizes are written in that file alone.

    >>> tiny_model_cfg(initializer_range=0.3)["config"]["num_hidden_layers"]
    2
    """
    node = OmegaConf.to_container(OmegaConf.load(paths.conf_dir() / "model" / "tiny.yaml"))
    assert isinstance(node, dict)
    node["config"] = {**node["config"], **config}
    return node


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite MLflow store for the whole session (creating one costs seconds)."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    uri = f"sqlite:///{db}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.fixture
def keep_mlflow_store() -> Iterator[None]:
    """Leave MLflow pointed where the test found it. A stage (and a catch-up) points MLflow's
    client at the store it uses, and MLflow copies that into ``MLFLOW_TRACKING_URI``; a test
    that used another store (a server it then stops) must not hand it to the next test."""
    from mlflow.tracking._tracking_service import utils

    saved, env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    yield
    utils._tracking_uri = saved
    if env is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = env


def compose_config(
    config_name: str, overrides: Sequence[str] = (), run_dir: Path | None = None
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` like Hydra would, with a test run dir."""
    register_configs(overrides, config_name)  # as the CLI: metric plugins register first
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides))
    check_keys(cfg)  # as the console scripts do: a key added with `+` is refused
    if run_dir is not None:
        with open_dict(cfg):
            cfg.run_dir = str(run_dir)
            cfg.tracking.artifact_root = str(run_dir.parent / "mlartifacts")
    return cfg


@pytest.fixture
def make_cfg(tmp_path: Path, mlflow_uri: str) -> Callable[..., DictConfig]:
    """``make_cfg("train", ["model=tiny"], name="train")`` → config whose run dir is in tmp."""

    def _make(
        config_name: str, overrides: Sequence[str] = (), name: str | None = None
    ) -> DictConfig:
        return compose_config(config_name, overrides, tmp_path / (name or config_name))

    return _make


TINY_TRAIN = [
    "model=tiny",
    "trainer=smoke",
    "dataset=ag_news",
    "dataset.max_train=160",
    "dataset.max_validation=64",
    "dataset.max_test=64",
    "tracking.log_model=false",
    "trainer.max_epochs=3",
    "trainer.early_stopping.patience=3",
]


@pytest.fixture(scope="session")
def tiny_train_run(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    """A real ``saleval-train`` run dir (tiny BERT, 160 AG News texts), shared by the session.

    Later stages take it as ``inputs.model=<this dir>``.
    """
    from saleval.stages import train

    run_dir = tmp_path_factory.mktemp("tiny_train") / "run"
    train.run(compose_config("train", TINY_TRAIN, run_dir))
    return run_dir


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random classifier of every family saleval supports, with a fast tokenizer
    trained here on SST-2 sentences (:mod:`saleval.testing.families`), built once per
    session: ``{family: save_pretrained dir}``."""
    import pandas as pd

    from saleval.testing.families import FAMILIES, build_checkpoint

    corpus = pd.read_csv(DATA_ROOT / "sst2" / "train.tsv", sep="\t")["text"].head(2000)
    root = tmp_path_factory.mktemp("families")
    return {f: build_checkpoint(f, root / f"my-{f}", corpus.tolist()) for f in FAMILIES}


@dataclass
class FinishedPipeline:
    """A finished ``saleval-run profile=smoke``: what it returned and printed."""

    summary: dict[str, Any]
    dirs: dict[str, Path]  # stage → run dir
    out: str  # its stdout


@pytest.fixture(scope="session")
def smoke_pipeline(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> FinishedPipeline:
    """Every stage of ``profile=smoke`` run once for the session (tiny BERT, simulated crowd),
    into the session's MLflow store; the pipeline test and the MLflow UI test read it."""
    from saleval.stages import run as pipeline

    root = tmp_path_factory.mktemp("smoke_pipeline")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = pipeline.run(compose_config("run", ["profile=smoke"], root / "run1"))
    dirs = {k: Path(v["run_dir"]) for k, v in summary["stages"].items()}
    return FinishedPipeline(summary, dirs, out.getvalue())
