"""Runs that die stay marked dead (issue #28 item 2): a stage killed with ``kill -9``
leaves its MLflow run RUNNING; the next stage started on the same store, on the same
host, finds it by its ``host``/``pid``/``pid_start`` tags and ends it as KILLED. Runs
of other hosts, and of processes still alive, are left alone."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval.pipeline.records import dead_runs
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from saleval.testing.load_servers import free_port, start_cli_server, stop, wait_healthy
from tests.annotate_support import TOKEN


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_this_hosts_runs_with_a_gone_process_are_ended(
    tmp_path: Path, mlflow_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = MlflowClient()
    exp = mlflow.set_experiment("dead-runs").experiment_id
    me = dead_runs.process_tags()
    assert me["host"] == socket.gethostname() and me["pid"] == str(os.getpid())
    assert me["pid_start"].isdigit()  # /proc is there on the machines the tests run on
    dead_pid = str(_dead_pid())

    def running(name: str, **tags: str) -> str:
        return client.create_run(exp, tags=tags, run_name=name).info.run_id

    run_dir = tmp_path / "killed-run"
    run_dir.mkdir()
    dead = running("dead", **{**me, "pid": dead_pid, "pid_start": "1", "run_dir": str(run_dir)})
    (run_dir / "run.json").write_text(json.dumps({"run_id": dead, "status": "RUNNING"}))
    reused = running("reused", **{**me, "pid_start": str(int(me["pid_start"]) - 1)})
    alive = running("alive", **me)
    elsewhere = running("elsewhere", **{**me, "host": "another-host", "pid": dead_pid})
    untagged = running("untagged", host=me["host"])  # an older run: no pid, left alone

    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.records.dead_runs"):
        ended = dead_runs.end_dead_runs()
    assert sorted(ended) == sorted([dead, reused])
    status = {r: client.get_run(r).info for r in (dead, reused, alive, elsewhere, untagged)}
    assert {r: i.status for r, i in status.items()} == {
        dead: "KILLED",
        reused: "KILLED",  # the pid lives, but it is another process now
        alive: "RUNNING",
        elsewhere: "RUNNING",
        untagged: "RUNNING",
    }
    assert status[dead].end_time is not None and status[reused].end_time is not None
    assert json.loads((run_dir / "run.json").read_text())["status"] == "KILLED"
    lines = [r.getMessage() for r in caplog.records if "marked KILLED" in r.getMessage()]
    assert len(lines) == 1 and dead in lines[0] and reused in lines[0]
    assert f"pid {dead_pid}" in lines[0]
    assert dead_runs.end_dead_runs() == []  # idempotent
    for r in (alive, elsewhere, untagged):
        client.set_terminated(r)


def test_a_stage_killed_with_sigkill_is_marked_killed_by_the_next_stage(
    tmp_path: Path,
    mlflow_uri: str,
    make_cfg: Callable[..., DictConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)
    db = tmp_path / "annotations.sqlite"
    port = free_port()
    (tmp_path / "serve").mkdir()
    proc = start_cli_server(tasks_dir, db, port, TOKEN, tmp_path / "serve")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        client = MlflowClient()
        exps = [e.experiment_id for e in client.search_experiments()]
        mine = client.search_runs(exps, filter_string=f"tags.pid = '{proc.pid}'")
        assert [r.info.status for r in mine] == ["RUNNING"]
        assert mine[0].data.tags["stage"] == "annotate"
        assert mine[0].data.tags["host"] == socket.gethostname()
    finally:
        stop(proc, signal.SIGKILL)  # kill -9 mid-run: no chance to end its run
    assert proc.returncode == -signal.SIGKILL
    killed = mine[0].info.run_id
    assert client.get_run(killed).info.status == "RUNNING"  # what the issue found

    export = [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}"]
    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.records.dead_runs"):
        out = annotate_stage.run(make_cfg("annotate", export))  # any stage on the same store
    info = client.get_run(killed).info
    assert info.status == "KILLED" and info.end_time is not None
    assert any(killed in r.getMessage() for r in caplog.records)
    assert client.get_run(out["run_id"]).data.tags["pid"] == str(os.getpid())
    run_json = json.loads((tmp_path / "serve" / "run.json").read_text())
    assert run_json["status"] == "KILLED"
