"""The main job end to end: ``saleval-run profile=smoke`` chains every stage, then resumes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from saleval.pipeline import tables
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.stages import run as pipeline
from tests.conftest import FinishedPipeline, compose_config

STAGES = ["train", "explain", "tasks", "simulate", "import", "score", "metrics", "compare"]


@pytest.mark.slow
def test_smoke_profile_runs_every_stage_then_reuses_them(
    tmp_path: Path, smoke_pipeline: FinishedPipeline
) -> None:
    summary, dirs = smoke_pipeline.summary, smoke_pipeline.dirs
    assert list(summary["stages"]) == STAGES
    assert not any(s["reused"] for s in summary["stages"].values())

    # every stage wrote its contract files
    assert (dirs["train"] / "model" / "config.json").is_file()
    attributions = tables.ATTRIBUTIONS.read(dirs["explain"])
    assert attributions["method"].nunique() == 9
    tasks = tables.TASKS.read(dirs["tasks"])
    answers = tables.ANSWERS.read(dirs["simulate"])
    assert set(answers["task_id"]) <= set(tasks["task_id"])
    assert tables.REJECTS.read(dirs["import"]).empty
    scores = tables.SCORES.read(dirs["score"])
    assert set(scores["method"]) == set(attributions["method"])
    metrics = tables.METRICS.read(dirs["metrics"])
    assert {"comprehensiveness", "sufficiency", "aopc_most", "switching_point"} <= set(
        metrics["metric"]
    )
    comparison = tables.COMPARISON.read(dirs["compare"])
    assert set(comparison["method"]) == set(scores["method"])

    # MLflow: one parent run, every stage a child, chained by parent tags, simulated marked
    client = MlflowClient()
    parent_id = summary["parent_run_id"]
    infos = {s: json.loads((dirs[s] / "run.json").read_text()) for s in STAGES}
    for stage in STAGES:
        run = client.get_run(infos[stage]["run_id"])
        assert run.data.tags["stage"] == stage
        assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert (
        client.get_run(infos["explain"]["run_id"]).data.tags["parent.model"]
        == infos["train"]["run_id"]
    )
    assert (
        client.get_run(infos["compare"]["run_id"]).data.tags["parent.score"]
        == infos["score"]["run_id"]
    )
    for stage in ("simulate", "import", "score", "compare"):
        assert client.get_run(infos[stage]["run_id"]).data.tags.get("simulated") == "true", stage
    out = smoke_pipeline.out
    assert "SIMULATED" in out and "mlflow ui --backend-store-uri" in out
    assert "runs?workflowType=machine_learning" in out  # the UI opens on the runs table

    # MLflow as the comparison surface (docs/tracking.md)
    runs = {s: client.get_run(infos[s]["run_id"]) for s in STAGES}
    assert runs["explain"].info.run_name == "explain · ag_news · tiny · 9 methods"
    assert runs["score"].info.run_name == "score · ag_news · tiny · 9 methods · SIMULATED"
    assert runs["train"].info.run_name == "train · ag_news · tiny"
    for stage, run in runs.items():
        assert (run.data.params["dataset"], run.data.params["model"]) == ("ag_news", "tiny")
        if stage != "train":
            assert set(run.data.params["methods"].split(",")) == set(scores["method"]), stage
    # params: what runs are compared by; a method's settings are its child run's params
    for stage, run in runs.items():
        odd = [
            k for k in run.data.params if k.startswith(("method.", "dataset.label", "model.name"))
        ]
        assert not odd and not [k for k in run.data.params if k.endswith("_target_")], stage
    assert runs["train"].data.params["dataset.max_train"] == "320"
    lime = method_rows(infos["explain"]["run_id"]).set_index("method").loc["lime", "run_id"]
    assert client.get_run(lime).data.params["method.num_samples"] == "64"
    # methods in rows: one child run per method, the same metric keys in each
    for stage in ("explain", "score", "metrics", "compare"):
        rows = method_rows(infos[stage]["run_id"])
        assert sorted(rows["method"]) == sorted(scores["method"]), stage
        keys = {frozenset(client.get_run(r).data.metrics) for r in rows["run_id"]}
        assert len(keys) == 1, stage
    compared = method_rows(infos["compare"]["run_id"]).set_index("method")
    assert {"human_score", "human_rank", "aopc_most", "comprehensiveness_kgrid"} <= set(compared)
    measured = method_rows(infos["metrics"]["run_id"])
    assert {"comprehensiveness_k5", "sufficiency_k2", "aopc_most"} <= set(measured)
    assert compared["human_score"].to_dict() == pytest.approx(
        comparison.set_index("method")["human_score"].to_dict()
    )
    # one key style in every run of the experiment, stage runs of a sane width
    exp = runs["compare"].info.experiment_id
    for run in client.search_runs([exp], max_results=1000):
        bad = [k for k in run.data.metrics if not re.fullmatch(r"[0-9A-Za-z_]+", k)]
        assert not bad, (run.info.run_name, bad)
    assert max(len(r.data.metrics) for r in runs.values()) < 60

    # resumable: the same config again reuses every finished stage
    again = pipeline.run(compose_config("run", ["profile=smoke"], tmp_path / "run2"))
    assert all(s["reused"] for s in again["stages"].values())
    assert {k: v["run_dir"] for k, v in again["stages"].items()} == {
        k: str(v) for k, v in dirs.items()
    }

    # changing one stage's config reruns it and everything downstream, not upstream
    third = pipeline.run(
        compose_config(
            "run",
            [
                "profile=smoke",
                "profile.stages.score=['scoring.bootstrap.n=50','scoring.test_resamples=99']",
                "profile.stages_to_run=[train,explain,tasks,simulate,import,score]",
            ],
            tmp_path / "run3",
        )
    )
    reused = {k: v["reused"] for k, v in third["stages"].items()}
    assert reused == {
        "train": True,
        "explain": True,
        "tasks": True,
        "simulate": True,
        "import": True,
        "score": False,
    }
    assert not pd.read_csv(Path(third["stages"]["score"]["run_dir"]) / "scores.csv").empty

    # real answers swapped in as a plain file: import and everything after it rerun
    answers_file = tmp_path / "platform_answers.csv"
    swapped = answers.copy()
    swapped.loc[0, "answer"] = "I don't know"
    tables.ANSWERS.write(swapped, tmp_path).rename(answers_file)
    fourth = pipeline.run(
        compose_config(
            "run",
            [
                "profile=smoke",
                "profile.stages_to_run=[import,score]",
                f"+inputs.tasks={dirs['tasks']}",
                f"+inputs.simulate={answers_file}",
            ],
            tmp_path / "run4",
        )
    )
    assert {k: v["reused"] for k, v in fourth["stages"].items()} == {
        "import": False,
        "score": False,
    }
