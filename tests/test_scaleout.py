"""Scale-out (docs/scale-out.md): launcher configs, and a stage logging through an MLflow
server on SQLite (the page's first try without a database).

The end-to-end test runs the console script as a subprocess, the way a user or a cluster
node does, with every output, store and artifact in ``tmp_path``. The only network is
loopback. The page itself, section by section, is walked by ``tests/test_scaleout_page.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hydra.utils import get_class
from mlflow.tracking import MlflowClient

from saleval.pipeline.tracker.tracking_reads import method_rows
from tests.conftest import DATA_ROOT
from tests.scaleout_support import NO_JOB_RUNNER, clean_env, hydra_config, wait_healthy

BIN = Path(sys.executable).parent  # the venv's console scripts sit next to its python


# pytest resets warning filters per test; stage.py silences this one outside tests
@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated:UserWarning")
def test_launcher_configs_compose_with_our_hydra_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SALEVAL_JOBS", "3")
    joblib = hydra_config(["hydra/launcher=joblib"]).hydra.launcher
    assert joblib.n_jobs == 3  # an int, as joblib needs
    assert get_class(joblib._target_).__name__ == "JoblibLauncher"

    cfg = hydra_config(
        ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", f"paths.output_root={tmp_path}"]
    )
    slurm = cfg.hydra.launcher
    assert get_class(slurm._target_).__name__ == "SlurmLauncher"
    assert (slurm.partition, slurm.gpus_per_node, slurm.tasks_per_node) == ("gpu", 1, 1)
    assert slurm.timeout_min > 0 and slurm.cpus_per_task > 0 and slurm.mem_gb > 0
    assert slurm.array_parallelism > 0
    assert "qos" in slurm  # the plugin's other fields stay settable
    # Submitit's pickles and logs sit inside our sweep dir, itself under paths.output_root
    assert slurm.submitit_folder.startswith(f"{cfg.hydra.sweep.dir}/.submitit/")
    assert cfg.hydra.sweep.dir.startswith(f"{tmp_path}/train/multirun/")


def _run(args: Sequence[str], env: dict[str, str], cwd: Path, timeout: float) -> int:
    """Run a console script; on failure show its output. Returns the process id it ran as."""
    proc = subprocess.Popen(
        [str(a) for a in args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{args[0]} ran over {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}:\n{out[-4000:]}"
    return proc.pid


SERVER_NAME = "saleval-tracking"  # a hostname the nodes would use for the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real ``mlflow server`` on loopback: SQLite backend, artifacts proxied to a tmp dir.

    Yields its URL and its artifact destination; always stops it (and the uvicorn worker
    it starts, hence its own process group).
    """
    where = tmp_path / "server"
    where.mkdir()
    artifacts = where / "artifacts"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = where / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{where / 'db.sqlite'}",
                "--artifacts-destination",
                str(artifacts),
                "--serve-artifacts",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                # as the README's command: clients on other machines name the server's host
                "--allowed-hosts",
                f"127.0.0.1:{port},{SERVER_NAME}:{port}",
            ],
            cwd=where,
            env=clean_env() | NO_JOB_RUNNER,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(url, proc, log)
        yield url, artifacts
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
def test_stage_logs_params_metrics_tags_and_artifacts_through_a_tracking_server(
    tmp_path: Path, mlflow_server: tuple[str, Path]
) -> None:
    url, artifacts = mlflow_server
    out = tmp_path / "outputs"
    work = tmp_path / "cwd"
    work.mkdir()
    published = DATA_ROOT / "published" / "lu2024" / "AGNEWS.csv"
    # the cheapest stage with tables, plots, params and metrics: score the published results
    _run(
        [
            BIN / "saleval-score",
            "crowd=lu2024",
            f"crowd.path={published}",
            "dataset=ag_news",
            "scoring.bootstrap.n=50",
            "scoring.test_resamples=99",
            f"paths.output_root={out}",
        ],
        clean_env(url),
        work,
        timeout=120,
    )
    (run_dir,) = (p.parent for p in (out / "score").glob("*/*/run.json"))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["tracking_uri"] == url

    client = MlflowClient(tracking_uri=url)
    run = client.get_run(info["run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "saleval/ag_news"
    assert run.data.tags["stage"] == "score"
    assert run.data.tags["run_dir"] == str(run_dir)
    assert run.data.params["seed"] == "42"
    assert run.data.params["source.path"] == str(published)
    assert "integrated_gradients" in set(method_rows(run.info.run_id, client)["method"])
    assert "stage_seconds" in run.data.metrics

    # artifacts went through the server's proxy into its destination, not to a local store
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    listed = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert listed >= {"scores.csv", "accuracy.csv", "accuracy_vs_k.png", "config.yaml", "run.json"}
    (stored,) = artifacts.rglob("scores.csv")
    assert run.info.run_id in stored.parts
    assert stored.read_bytes() == (run_dir / "scores.csv").read_bytes()
    fetched = client.download_artifacts(run.info.run_id, "scores.csv", str(tmp_path))
    assert Path(fetched).read_bytes() == stored.read_bytes()
    assert not (out / "mlflow.db").exists()  # the default store the config would have used
    assert not (out / "mlartifacts").exists()
    assert not any(work.iterdir())  # no ./mlruns or ./mlartifacts beside the stage

    # --allowed-hosts: the server answers clients naming it by an allowed hostname only
    def status(host: str) -> int:
        req = urllib.request.Request(
            f"{url}/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code

    port = url.rsplit(":", 1)[1]
    assert status(f"{SERVER_NAME}:{port}") == 200
    assert status(f"elsewhere:{port}") == 403
