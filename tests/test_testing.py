"""saleval.testing: the run dirs it builds are the stages' own, and the load check counts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from saleval.pipeline import tables
from saleval.testing import make_task_run
from saleval.testing.load_workers import LoadResult, WorkerLog
from saleval.testing.runs import TRICKY, study_grid
from saleval.vocab import PROBS


@pytest.mark.parametrize(("n_bundles", "bundle_size"), [(4, 5), (50, 4), (7, 3)])
def test_task_run_has_the_asked_bundles_each_with_s000_once(
    tmp_path: Path, mlflow_uri: str, n_bundles: int, bundle_size: int
) -> None:
    run = make_task_run(tmp_path / "tasks", n_bundles=n_bundles, bundle_size=bundle_size)
    tasks, bundles = tables.TASKS.read(run), tables.BUNDLES.read(run)
    sizes = bundles.groupby("bundle_id").size()
    assert len(sizes) == n_bundles and (sizes == bundle_size).all()
    samples = bundles.merge(tasks, on="task_id")
    assert (samples.groupby("bundle_id")["sample_id"].nunique() == bundle_size).all()
    s000 = samples[samples["sample_id"] == "s000"]
    assert s000.groupby("bundle_id").size().eq(1).all() and len(s000) == n_bundles
    assert s000["display_text"].str.startswith(TRICKY + " ").all()
    n_methods, n_ks, repeats = study_grid(n_bundles)
    assert tasks["method"].nunique() == n_methods and tasks["k"].nunique() == n_ks
    assert bundles["task_id"].value_counts().eq(repeats).all()


def test_task_run_is_a_saleval_tasks_run_of_a_synthetic_explain_run(
    tmp_path: Path, mlflow_uri: str
) -> None:
    run = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3, dataset="imdb")
    info = json.loads((run / "run.json").read_text())
    assert (info["stage"], info["status"]) == ("tasks", "FINISHED")
    explain = Path(info["parent_dirs"]["explain"])
    assert explain == (tmp_path / "tasks.explain").resolve()
    parent = json.loads((explain / "run.json").read_text())
    assert info["parents"]["explain"] == parent["run_id"] and parent["stage"] == "explain"
    for d in (run, explain):
        assert OmegaConf.load(d / "config.yaml").dataset.name == "imdb"
    preds = tables.PREDICTIONS.read(explain)
    assert PROBS.of(preds.columns) == ["prob_negative", "prob_positive"]
    assert {"bundles_wide.csv", "bundles_long.csv", "instructions.md"} <= {
        p.name for p in run.iterdir()
    }
    # the study took the correctly classified samples; the instructions the others
    assert set(tables.TASKS.read(run)["sample_id"]) == {"s000", "s001", "s002"}
    instructions = (run / "instructions.md").read_text()
    assert "# Instructions (imdb)" in instructions and "Example (full text)" in instructions


def _result(sent: dict[str, dict[int, str]], exported: list[tuple[str, int, str]]) -> LoadResult:
    workers = [WorkerLog(w, dict(s)) for w, s in sent.items()]
    frame = pd.DataFrame(
        [(w, f"t{p}", p, a) for w, p, a in exported],
        columns=["worker_id", "task_id", "position", "answer"],
    )
    return LoadResult(workers, frame, seconds=1.0)


def test_load_check_counts_lost_duplicated_altered_and_unexpected() -> None:
    sent = {"w1": {1: "World", 2: "Sports"}, "w2": {1: "Business"}}
    clean = _result(sent, [("w1", 1, "World"), ("w1", 2, "Sports"), ("w2", 1, "Business")])
    assert {k: v for k, v in clean.check().items() if v} == {"sent": 3, "exported": 3}
    bad = _result(
        sent,
        [("w1", 1, "World"), ("w1", 1, "World"), ("w1", 2, "Sci/Tech"), ("w3", 1, "World")],
    )
    got = bad.check()
    assert (got["lost"], got["duplicated"], got["duplicated_tasks"]) == (1, 1, 1)
    assert (got["altered"], got["unexpected"]) == (1, 1)
