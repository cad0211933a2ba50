"""Sweeps on a real SLURM cluster of one node (docs/scale-out.md, *On SLURM*).

The module starts ``slurmctld``, ``slurmd`` and ``munged`` on this machine
(:class:`saleval.scaleout.slurm_local.LocalCluster`: its own ``slurm.conf`` in a temp dir,
free loopback ports) and submits through the real ``sbatch``/``srun``: a train sweep of two
jobs, one of them cancelled with ``scancel`` mid-training and rerun alone; a ``saleval-run``
sweep over two datasets; explain as a two-task ``srun`` step. The node is small (4000 MB),
so the launcher's defaults must be refused in one line. Needs root and the Debian packages
``slurm-wlm`` and ``munge`` (``.ci/run`` installs them); elsewhere the tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from saleval.pipeline import dead_runs, slurm_state, tables
from saleval.scaleout.slurm_local import LocalCluster, missing
from tests.scaleout_support import BIN, TINY_JOB, launch, require, runs_of, subprocess_env

pytestmark = pytest.mark.slow

#: what the node offers: smaller than the launcher's defaults, as a laptop or a small VM
NODE_MB = 4000
#: resources that fit it
SMALL = [
    "hydra/launcher=slurm",
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.timeout_min=30",
]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A one-node cluster for this module; its jobs and daemons end with it."""
    require(missing())
    cluster = LocalCluster(tmp_path_factory.mktemp("slurm"), memory_mb=NODE_MB)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _env(cluster: LocalCluster, uri: str, **extra: str) -> dict[str, str]:
    return subprocess_env(uri, **cluster.env(), **extra)


def _by_job(client: MlflowClient, sweep: Path, stage: str) -> dict[str, list]:
    """The ``stage`` runs of ``sweep`` by ``sweep.job``, oldest first."""
    out: dict[str, list] = {}
    for r in runs_of(client, f"tags.sweep = '{sweep}' and tags.stage = '{stage}'"):
        out.setdefault(r.data.tags["sweep.job"], []).append(r)
    return {k: sorted(v, key=lambda r: r.info.start_time) for k, v in out.items()}


def test_defaults_a_small_node_cannot_satisfy_fail_in_one_line(
    slurm: LocalCluster, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = launch(
        [BIN / "saleval-train", "-m", "hydra/launcher=slurm", *TINY_JOB,
         f"paths.output_root={tmp_path}", f"hydra.sweep.dir={sweep}", "seed=1,2"],
        _env(slurm, uri), tmp_path, timeout=120, expect=2,
    )  # fmt: skip
    lines = [line for line in done.output.splitlines() if line.startswith("saleval-train:")]
    assert len(lines) == 1, done.tail()
    line = lines[0]
    # every default that does not fit, and the value that does
    assert "partition 'debug' cannot run these jobs" in line
    assert "hydra.launcher.mem_gb=3 or less" in line  # 32 GB asked, 4000 MB there
    assert "hydra.launcher.gpus_per_node=0" in line
    assert "hydra.launcher.timeout_min=60 or less" in line  # 240 asked, the partition's 60
    if (os.cpu_count() or 1) < 8:
        assert f"hydra.launcher.cpus_per_task={os.cpu_count()} or less" in line
    assert "Traceback" not in done.output
    # nothing was submitted
    assert not (sweep / ".submitit").exists()
    queue = subprocess.run(["squeue", "-h"], env=slurm_env(slurm), capture_output=True, text=True)
    assert queue.stdout.strip() == ""


def slurm_env(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env()}


def _wait_running(run_json: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(run_json.read_text()).get("status") == "RUNNING":
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{run_json} never said RUNNING")


def test_train_sweep_a_cancelled_job_is_killed_and_a_resubmission_reruns_it_alone(
    slurm: LocalCluster, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = _env(slurm, uri)
    base = [o for o in TINY_JOB if not o.startswith(("trainer.max_epochs", "dataset.max_train"))]
    # job 1 trains long enough to be cancelled mid-training
    command = [BIN / "saleval-train", "-m", *SMALL, *base, "dataset.max_train=160",
               "trainer.early_stopping.patience=100", f"paths.output_root={tmp_path}",
               f"hydra.sweep.dir={sweep}", "trainer.max_epochs=1,30"]  # fmt: skip
    proc = subprocess.Popen(
        [str(a) for a in command], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait_running(sweep / "1" / "run.json")
        time.sleep(3)  # into its epochs
        (task_dir,) = (sweep / ".submitit").glob("*_1")
        subprocess.run(["scancel", task_dir.name], env=slurm_env(slurm), check=True)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out[-4000:]
    (line,) = [x for x in out.splitlines() if x.startswith("saleval-train:")]
    assert "job 1 (" in line and f"ended CANCELLED (SLURM job {task_dir.name})" in line
    assert f"the same command with hydra.sweep.dir={sweep}" in line

    info0 = json.loads((sweep / "0" / "run.json").read_text())
    killed = json.loads((sweep / "1" / "run.json").read_text())
    assert (info0["status"], killed["status"]) == ("FINISHED", "KILLED")
    assert "Stopped" in killed["error"]  # the job's SIGTERM, not a failure of the stage
    client = MlflowClient(tracking_uri=uri)
    first = _by_job(client, sweep, "train")
    assert [r.info.status for r in first["0"]] == ["FINISHED"]
    assert [r.info.status for r in first["1"]] == ["KILLED"]
    k = first["1"][0]
    assert k.info.run_id == killed["run_id"] and k.info.end_time
    assert "test_accuracy" not in k.data.metrics  # stopped before its test
    assert "trainer.max_epochs=30" in k.data.tags["sweep.overrides"]
    assert k.data.tags["slurm_job_id"] != first["0"][0].data.tags["slurm_job_id"]

    # the same command into the same sweep dir: job 0 is reused, job 1 runs again
    again = launch(command, env, tmp_path, timeout=300)
    assert f"#0 : finished already in {sweep / '0'}" in again.output
    second = _by_job(client, sweep, "train")
    assert [r.info.run_id for r in second["0"]] == [info0["run_id"]]
    assert [r.info.status for r in second["1"]] == ["KILLED", "FINISHED"]
    rerun = json.loads((sweep / "1" / "run.json").read_text())
    assert rerun["status"] == "FINISHED" and rerun["run_id"] == second["1"][1].info.run_id
    assert json.loads((sweep / "1" / "metrics.json").read_text())["n_train"] == 160
    assert "test_accuracy" in second["1"][1].data.metrics


def test_the_next_stage_ends_a_run_whose_slurm_job_is_over(
    slurm: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job killed outright (``scancel -s KILL``, its node lost) leaves its run RUNNING;
    whichever machine starts a stage next asks SLURM and ends it, the run dir too."""
    for k, v in slurm.env().items():
        monkeypatch.setenv(k, v)

    def sbatch() -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", "--mem=100M", f"--output={tmp_path}/%j.out", "--wrap", "sleep 120"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip().split(";")[0]

    dead, alive = sbatch(), sbatch()
    subprocess.run(["scancel", "-s", "KILL", dead], check=True)
    deadline = time.monotonic() + 60
    while slurm_state.job_states([dead]).get(dead) in slurm_state.ACTIVE:
        assert time.monotonic() < deadline, "the cancelled job never ended"
        time.sleep(0.3)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("slurm-jobs")
    run_ids = {}
    for name, job in (("dead", dead), ("alive", alive)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        tags = {"slurm_job_id": job, "slurm_cluster": "saleval-local", "host": "node-elsewhere",
                "pid": "1", "run_dir": str(run_dir)}  # fmt: skip
        run_ids[name] = client.create_run(exp, tags=tags).info.run_id
        (run_dir / "run.json").write_text(
            json.dumps({"run_id": run_ids[name], "status": "RUNNING"})
        )
    try:
        assert dead_runs.end_dead_runs(client) == [run_ids["dead"]]
    finally:
        subprocess.run(["scancel", alive], check=False)
    assert client.get_run(run_ids["dead"]).info.status == "KILLED"
    assert client.get_run(run_ids["alive"]).info.status == "RUNNING"
    assert json.loads((tmp_path / "dead" / "run.json").read_text())["status"] == "KILLED"


def test_pipeline_sweep_over_two_datasets_runs_as_two_slurm_jobs(
    slurm: LocalCluster, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    launch(
        [BIN / "saleval-run", "-m", *SMALL, "profile=smoke", f"paths.output_root={tmp_path}",
         f"hydra.sweep.dir={sweep}", "profile.dataset=ag_news,sst2"],
        _env(slurm, uri), tmp_path, timeout=420,
    )  # fmt: skip
    client = MlflowClient(tracking_uri=uri)
    jobs = {}
    for job, dataset in (("0", "ag_news"), ("1", "sst2")):
        pipeline = json.loads((sweep / job / "pipeline.json").read_text())
        assert set(pipeline["stages"]) >= {"train", "explain", "score", "metrics", "compare"}
        comparison = tables.COMPARISON.read(sweep / job / "compare")
        assert len(comparison) > 0 and comparison["method"].nunique() > 1
        runs = runs_of(client, f"tags.sweep = '{sweep}' and tags.`sweep.job` = '{job}'")
        stages = {r.data.tags["stage"]: r for r in runs}
        assert set(pipeline["stages"]) <= set(stages)
        for r in stages.values():
            assert r.info.status == "FINISHED"
            assert r.data.tags["dataset"] == dataset
            assert r.data.tags["run_dir"].startswith(str(sweep / job))
        assert (
            stages["compare"].info.run_id
            == json.loads((sweep / job / "compare" / "run.json").read_text())["run_id"]
        )
        jobs[job] = {r.data.tags["slurm_job_id"] for r in stages.values()}
    # each pipeline ran in one SLURM job of its own
    assert len(jobs["0"]) == len(jobs["1"]) == 1 and jobs["0"] != jobs["1"]


def test_explain_as_a_two_task_srun_step_writes_the_single_process_tables(
    slurm: LocalCluster, tiny_train_run: Path, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = _env(slurm, uri, PYTHONPATH=str(REPO))
    common = [f"inputs.model={tiny_train_run}", "dataset=ag_news", "dataset.max_train=160",
              "dataset.max_validation=64", "dataset.max_test=64", "data.n_samples=6",
              "batch_size=2", "method=[random,vanilla_gradient,lime,occlusion]",
              "method.lime.num_samples=16", "progress=false", f"paths.output_root={tmp_path}"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    launch([BIN / "saleval-explain", *common, "trainer=cpu", f"hydra.run.dir={one}"],
           env, tmp_path, timeout=240)  # fmt: skip
    # Lightning's SLURM environment takes the ranks srun started (tasks per node, not --ntasks)
    launch(
        ["srun", "-N", "1", "--ntasks-per-node=2", "--cpus-per-task=1", "--mem=1G",
         BIN / "saleval-explain", *common, "trainer=ddp_cpu", f"hydra.run.dir={two}",
         "+method.pid._target_=tests.test_attribution_ddp.ProcessId", "+method.pid.batch_size=1"],
        env, tmp_path, timeout=300,
    )  # fmt: skip
    pred1, pred2 = tables.PREDICTIONS.read(one), tables.PREDICTIONS.read(two)
    attr1, attr2 = tables.ATTRIBUTIONS.read(one), tables.ATTRIBUTIONS.read(two)
    pids = attr2.loc[attr2.method == "pid", "score"].unique()
    assert len(pids) == 2  # both srun tasks explained a share
    attr2 = attr2[attr2.method != "pid"].reset_index(drop=True)
    assert set(attr1["method"]) == {"random", "vanilla_gradient", "lime", "occlusion"}
    probs = [c for c in pred1.columns if c.startswith("prob_")]
    pd.testing.assert_frame_equal(pred1.drop(columns=probs), pred2.drop(columns=probs))
    np.testing.assert_allclose(pred1[probs], pred2[probs], rtol=1e-5, atol=1e-7)
    pd.testing.assert_frame_equal(attr1.drop(columns="score"), attr2.drop(columns="score"))
    np.testing.assert_allclose(attr1["score"], attr2["score"], rtol=1e-4, atol=1e-7)
    # rank 0 alone wrote and logged: one FINISHED run for the step, tagged with its job
    client = MlflowClient(tracking_uri=uri)
    (run,) = runs_of(client, f"tags.run_dir = '{two}'")
    assert run.info.status == "FINISHED" and run.data.tags["slurm_job_id"]
    assert run.info.run_id == json.loads((two / "run.json").read_text())["run_id"]
    assert not (tmp_path / "explain").exists()  # rank 1 made no run dir of its own
