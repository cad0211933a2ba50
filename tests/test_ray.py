"""Sweeps on Ray (docs/scale-out.md, *Ray*): ``hydra/launcher=ray`` started here for the
sweep, and joined to a running cluster (``ray start --head``) with the launcher's default
sizes in its config, which Ray refuses when joining unless the launcher leaves them out.

Needs the ``ray`` extra (``pip install -e '.[ray]'``, part of ``.[dev]``); elsewhere skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from saleval.scaleout.ray import RayLauncher
from tests.scaleout_support import BIN, TINY_JOB, launch, require, runs_of, subprocess_env

pytestmark = pytest.mark.slow


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed: pip install -e '.[ray]' (part of .[dev])"
    return None


#: Ray advertises the machine's interface address, even for 127.0.0.1 (it "resolves"
#: localhost for remote nodes); its single-machine setting keeps every address on
#: loopback, the only network these tests use
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _check_sweep(uri: str, out: Path) -> Path:
    """Both jobs of the one sweep under ``out`` finished, each in its dir and MLflow run."""
    (sweep,) = (out / "train" / "multirun").iterdir()
    client = MlflowClient(tracking_uri=uri)
    runs = runs_of(client, f"tags.sweep = '{sweep}'")
    by_job = {r.data.tags["sweep.job"]: r for r in runs}
    assert sorted(by_job) == ["0", "1"] and len(runs) == 2
    assert {r.data.params["seed"] for r in runs} == {"1", "2"}
    pids = set()
    for job, run in by_job.items():
        info = json.loads((sweep / job / "run.json").read_text())
        assert info["status"] == "FINISHED" and run.info.status == "FINISHED"
        assert run.info.run_id == info["run_id"]
        assert run.data.tags["run_dir"] == str(sweep / job)
        assert "val_accuracy" in run.data.metrics
        assert (sweep / job / "model" / "config.json").is_file()
        pids.add(info["pid"])
    assert len(pids) == 2 and os.getpid() not in pids  # two Ray workers ran them
    return sweep


def test_ray_sweep_started_here(tmp_path: Path) -> None:
    require(_ray_missing())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "outputs"
    done = launch(
        [BIN / "saleval-train", "-m", "hydra/launcher=ray", "hydra.launcher.local.num_cpus=2",
         *TINY_JOB, f"paths.output_root={out}", "seed=1,2"],
        subprocess_env(uri, **LOOPBACK), tmp_path, timeout=300,
    )  # fmt: skip
    sweep = _check_sweep(uri, out)
    assert f"Ray sweep output dir : {sweep} (local)" in done.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: the cluster's token (Ray 2.5x turns token authentication on for ``ray start``): given
#: to the head and the launching shell alike, as docs/scale-out.md says
TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A Ray cluster of one head node started with ``ray start --head --block`` in its own
    process group (stopped by signalling that group: ``ray stop`` would stop every Ray on
    the machine). Its environment has no MLflow variables: the jobs get them from the
    launching shell."""
    require(_ray_missing())
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    env = {
        k: v for k, v in subprocess_env(**LOOPBACK, **TOKEN).items() if not k.startswith("MLFLOW_")
    }
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
         f"--temp-dir={temp}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"ray start exited {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        time.sleep(2)  # the raylet registers after the GCS listens
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):  # a throwaway cluster: no graceful stop
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_sweep_on_a_running_cluster(ray_head: str, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "outputs"
    # the default config sizes the object store: joining must leave it out, not fail
    assert RayLauncher(address=ray_head, local={"object_store_memory": 10**8}).init_args() == {
        "address": ray_head
    }
    done = launch(
        [BIN / "saleval-train", "-m", "hydra/launcher=ray", f"hydra.launcher.address={ray_head}",
         *TINY_JOB, f"paths.output_root={out}", "seed=1,2"],
        subprocess_env(uri, **LOOPBACK, **TOKEN), tmp_path, timeout=300,
    )  # fmt: skip
    assert "object_store_memory must not be provided" not in done.output
    sweep = _check_sweep(uri, out)
    assert f"Ray sweep output dir : {sweep} ({ray_head})" in done.output
