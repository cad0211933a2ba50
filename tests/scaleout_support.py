"""Helpers for the scale-out tests (docs/scale-out.md): the launcher configs composed as a
multirun sees them, the environment a console script gets, and, for the tests that run
sweeps on real engines (SLURM, Ray, a PostgreSQL-backed MLflow server; the page walked by
``tests/test_scaleout_page.py``), skipping or failing where a piece is missing.

Those tests need system packages and root. Off CI they skip, naming the command that
installs what is missing; on CI (``CI`` set, as ``.ci/run`` runs) a missing piece fails
instead, so the suite can never pass there by skipping them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval import paths
from saleval.pipeline.compose import register_configs

__all__ = [
    "BIN", "NO_JOB_RUNNER", "Finished", "clean_env", "hydra_config", "launch", "on_ci", "require", "runs_of",
    "subprocess_env",
]  # fmt: skip

BIN = Path(sys.executable).parent  # the venv's console scripts sit next to its python
#: a test's ``mlflow server`` starts no job runner: none of them runs MLflow jobs, and the
#: runner is eight more processes (huey consumers) importing MLflow beside the test, CPU a
#: 2-core host's test needs (issue #54; 2 processes a server, not 10)
NO_JOB_RUNNER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def on_ci() -> bool:
    return bool(os.environ.get("CI"))


def require(missing: str | None) -> None:
    """Skip (off CI) or fail (on CI) with ``missing``, the one-line reason, when not None."""
    if missing is None:
        return
    if on_ci():
        pytest.fail(f"CI must run this test: {missing}")
    pytest.skip(missing)


def clean_env(tracking_uri: str | None = None) -> dict[str, str]:
    """The test process's environment without pytest's marker, MLflow pointed at ``tracking_uri``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def subprocess_env(tracking_uri: str | None = None, **extra: str) -> dict[str, str]:
    """The environment a console script gets: this one, MLflow at ``tracking_uri``, one
    thread per process (two cores run two jobs), and ``extra``."""
    env = clean_env(tracking_uri)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


@dataclass
class Finished:
    """A command that ran: its exit status and its output (stdout and stderr together)."""

    returncode: int
    output: str

    def tail(self) -> str:
        return self.output[-4000:]


def launch(
    args: Sequence[object], env: dict[str, str], cwd: Path, timeout: float, expect: int | None = 0
) -> Finished:
    """Run a command; fail showing its output when it runs over ``timeout`` or exits other
    than ``expect`` (None: any status)."""
    try:
        proc = subprocess.run(
            [str(a) for a in args], env=env, cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        out = err.stdout if isinstance(err.stdout, str) else (err.stdout or b"").decode()
        pytest.fail(f"{args[0]} ran over {timeout} s:\n{out[-4000:]}")
    done = Finished(proc.returncode, proc.stdout)
    if expect is not None:
        assert proc.returncode == expect, f"{args[0]} exited {proc.returncode}:\n{done.tail()}"
    return done


def runs_of(client: MlflowClient, filter_string: str = "") -> list:
    """Every run of every experiment of ``client``'s store that matches ``filter_string``."""
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, filter_string=filter_string, max_results=1000) if exps else []


def hydra_config(overrides: Sequence[str]) -> DictConfig:
    """``conf/train.yaml`` composed with its ``hydra`` node, as a multirun would see it."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, limit_s: float = 90) -> None:
    """Return once the MLflow server at ``url`` answers ``/health``; fail the test, with the
    end of its ``log``, when its process ``proc`` exits or ``limit_s`` passes first."""
    deadline = time.monotonic() + limit_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"mlflow server not healthy after {limit_s:.0f} s:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.3)
