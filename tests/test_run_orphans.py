"""A pipeline killed with ``kill -9`` leaves its MLflow runs RUNNING; a resume in the
same run dir ends them as KILLED and touches no other run."""

from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from saleval.stages.run import mark_orphans_killed


def test_resume_marks_the_orphaned_runs_of_its_run_dir_killed(
    tmp_path: Path, mlflow_uri: str
) -> None:
    client = MlflowClient()
    exp = mlflow.set_experiment("orphans").experiment_id
    out = tmp_path / "pipeline"

    def running(run_dir: Path) -> str:
        return client.create_run(exp, tags={"run_dir": str(run_dir)}).info.run_id

    parent, stage = running(out), running(out / "explain")
    other = running(tmp_path / "pipeline-2" / "explain")  # another pipeline's: left alone
    done = running(out / "train")
    client.set_terminated(done, status="FINISHED")
    assert sorted(mark_orphans_killed(out)) == sorted([parent, stage])
    status = {r: client.get_run(r).info.status for r in (parent, stage, other, done)}
    assert status == {parent: "KILLED", stage: "KILLED", other: "RUNNING", done: "FINISHED"}
    assert mark_orphans_killed(out) == []  # idempotent
