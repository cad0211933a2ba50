"""MLflow as the comparison surface (docs/tracking.md), read back through the MLflow client:
per-method child runs, run names, params, the tracking URI used, the logged model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from saleval.modeling.models import build_model, load_tokenizer, load_trained
from saleval.pipeline import views
from saleval.pipeline.records import run_naming
from saleval.pipeline.tracker import tracking, tracking_models, tracking_reads
from saleval.testing import explain_frames, make_explain_run
from tests.conftest import compose_config


def test_method_rows_are_child_runs_with_one_set_of_keys(tmp_path: Path, mlflow_uri: str) -> None:
    tracking.setup(None, "rows", str(tmp_path / "artifacts"))
    rows = pd.DataFrame(
        {
            "method": ["lime", "random"],
            "human_score": [40.0, 0.0],
            "p_vs_random": [0.01, math.nan],  # the baseline has none: NaN, the same keys
            "aopc_most": [0.3, 0.1],
        }
    )
    with mlflow.start_run(run_name="score · x") as parent:
        ids = tracking.log_method_rows(
            rows, "score", table="scores", tags={"dataset": "x"}, params={"dataset": "x"}
        )
    client = MlflowClient()
    assert set(ids) == {"lime", "random"}
    back = tracking_reads.method_rows(parent.info.run_id).set_index("method")
    assert back.loc["lime", "human_score"] == 40.0 and back.loc["random", "aopc_most"] == 0.1
    assert math.isnan(back.loc["random", "p_vs_random"])
    lime = client.get_run(ids["lime"])
    assert lime.info.run_name == "lime · score"
    assert lime.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert lime.data.tags["method"] == "lime" and lime.data.tags["stage"] == "score"
    assert lime.data.params == {"method": "lime", "dataset": "x"}
    assert set(lime.data.metrics) == {"human_score", "p_vs_random", "aopc_most"}
    assert set(client.get_run(ids["random"]).data.metrics) == set(lime.data.metrics)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "tables")}
    assert arts == {"tables/scores.json"}
    twice = pd.concat([rows, rows.iloc[:1]])
    with (
        pytest.raises(ValueError, match=r"methods \['lime'\] have more than one row"),
        mlflow.start_run(),
    ):
        tracking.log_method_rows(twice, "score")


def test_stage_records_the_store_it_used_and_names_the_experiment_kind(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """MLFLOW_TRACKING_URI wins over tracking.uri: the run's param and config.yaml say so."""
    preds, attrs = explain_frames(3, ["a", "b", "c", "d"], methods=["random", "lime"])
    run_dir = make_explain_run(tmp_path / "explain", preds, attrs)
    info = json.loads((run_dir / "run.json").read_text())
    run = MlflowClient().get_run(info["run_id"])
    assert run.data.params["tracking.uri"] == mlflow_uri == info["tracking_uri"]
    assert OmegaConf.load(run_dir / "config.yaml").tracking.uri == mlflow_uri
    default = compose_config("explain", ["inputs.model=x"]).tracking.uri
    assert default != mlflow_uri  # the config alone would have named another store
    assert run.data.params["dataset"] == "ag_news" and "model" not in run.data.params
    assert not {"paths.output_root", "hydra.run.dir", "run_dir"} & set(run.data.params)
    assert run.info.run_name == "explain · ag_news"
    exp = MlflowClient().get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    url = views.ui_url(mlflow_uri, exp.experiment_id)
    assert url.endswith(f"#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning")


def test_classifier_is_an_mlflow_model_that_downloads_as_a_checkpoint(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """Offline: the transformers flavor of the tiny random BERT, then runs:/ → model/."""
    cfg = compose_config("train", ["model=tiny"])
    model = build_model(cfg.model, ["a", "b", "c", "d"], seed=0).eval()
    tokenizer = load_tokenizer(cfg.model)
    tracking.setup(None, "models", str(tmp_path / "artifacts"))
    with mlflow.start_run() as run:
        model_id = tracking_models.log_hf_model(model, tokenizer)
    logged = MlflowClient().get_logged_model(model_id)
    assert logged.source_run_id == run.info.run_id
    target = tmp_path / "download"
    tracking_reads.download_run(run.info.run_id, target)
    again, tok = load_trained(target)
    batch = tok(["the market rallied after strong earnings"], return_tensors="pt")
    with torch.no_grad():
        want = model(**tokenizer(["the market rallied after strong earnings"], return_tensors="pt"))
        got = again(**batch)
    torch.testing.assert_close(got.logits, want.logits)
    assert again.config.id2label == model.config.id2label


#: the dataset keys that tell two runs on one dataset apart; the rest of the node says
#: how the files are read and described (the run's config.yaml has it)
DATASET_PARAMS = {
    "dataset.files.train",
    "dataset.files.validation",
    "dataset.files.test",
    "dataset.files.all",
    "dataset.split_fractions.validation",
    "dataset.split_fractions.test",
    "dataset.seed",
    "dataset.max_train",
    "dataset.max_validation",
    "dataset.max_test",
}


def test_shortcut_params_are_what_runs_are_compared_by() -> None:
    """The shortcut stage's 34 method configurations are its ``methods`` and its child
    runs, not 208 ``method.*`` params on the stage run; the dataset is its name and sizes."""
    cfg = compose_config("shortcut", ["shortcut=tic"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    params = run_naming.stage_params("shortcut", resolved, "sqlite:///x.db")
    assert not [k for k in params if k.startswith("method")]
    assert {k for k in params if k.startswith("dataset")} == DATASET_PARAMS
    assert not [k for k in params if k.endswith("_target_") or k.startswith("model.name")]
    assert params["shortcut.kind"] == "tic" and params["shortcut.unit"] == "word"
    assert params["explain.n_samples"] == 50 and params["explain.budget"]
    assert params["model.max_length"] == 256 and params["trainer.optimizer.lr"] == 5e-5
    assert "original_cache" not in params  # where the original model is cached
    assert len(params) < 70  # it was 286
    # each configuration's settings belong to its child run, with keys shared across them
    settings = run_naming.method_settings(resolved["method"])
    assert len(settings) == len(resolved["method"]) > 30
    assert settings["ig_zero_100_logits"] == {
        "method.baseline": "zero",
        "method.n_steps": 100,
        "method.method": "gausslegendre",
        "method.internal_batch_size": 100,
        "method.output": "logits",
        "method.batch_size": 4,
    }


def test_method_settings_are_params_of_the_method_child_runs(
    tmp_path: Path, mlflow_uri: str
) -> None:
    tracking.setup(None, "settings", str(tmp_path / "artifacts"))
    rows = pd.DataFrame({"method": ["lime_20", "occlusion"], "seconds": [1.0, 2.0]})
    group = {"lime_20": {"_target_": "x.Lime", "num_samples": 20}, "occlusion": "occlusion"}
    with mlflow.start_run():
        ids = tracking.log_method_rows(
            rows, "explain", params={"dataset": "x"}, settings=run_naming.method_settings(group)
        )
    client = MlflowClient()
    assert client.get_run(ids["lime_20"]).data.params == {
        "method": "lime_20",
        "dataset": "x",
        "method.num_samples": "20",
    }
    assert client.get_run(ids["occlusion"]).data.params == {"method": "occlusion", "dataset": "x"}


def test_metric_keys_follow_one_style() -> None:
    for name in ("seconds.lime", "aopc_most/lime/k10", "filter/min seconds/workers"):
        assert "/" not in run_naming.metric_key(name) and "." not in run_naming.metric_key(name)
    assert run_naming.metric_at_k("comprehensiveness@0.2") == run_naming.metric_at_k(
        "comprehensiveness", "0.2"
    )
