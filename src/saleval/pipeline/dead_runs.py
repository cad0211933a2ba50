"""Runs whose process died, marked KILLED (the user's view: docs/tracking.md, *Runs that die*).

A process killed outright (``kill -9``, a crash, a reboot) cannot end its MLflow run, so
every run is tagged with its ``host``, ``pid`` and the pid's start time
(:func:`process_tags`), and every stage, when it starts, ends as KILLED the RUNNING runs
of its host whose process is gone (:func:`end_dead_runs`). :func:`mark_killed` is the
one way saleval ends a dead run; ``saleval-run``'s resume uses it too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of
    ``/proc/<pid>/stat``); None where there is no such process or no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rpartition(")")[2].split()  # the name in (...) may hold spaces
    return fields[19] if len(fields) > 19 else None


def process_tags() -> dict[str, str]:
    """``host``, ``pid`` and ``pid_start`` of this process, tagged on every run it starts
    so that a later run on the same host can tell whether it is still alive
    (:func:`end_dead_runs`); ``pid_start`` tells a reused pid from the original."""
    return {
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
        "pid_start": _process_start(os.getpid()) or "",
    }


def process_alive(pid: int, started: str | None = None) -> bool:
    """Is the process that tagged a run ``pid`` / ``started`` still running here?

    With ``/proc`` (Linux): the pid must exist and, when ``started`` is known, have
    started at that time (a new process that got the same pid is not the run's).
    Without it: whether a signal could be sent to ``pid``.
    """
    if pid <= 0:
        return False
    if Path("/proc/self/stat").is_file():
        now = _process_start(pid)
        return now is not None and (not started or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_killed(client: MlflowClient, runs: Sequence[Any], why: str) -> list[str]:
    """End ``runs`` (RUNNING MLflow runs whose process is known dead) as KILLED, now,
    and say so in one warning line naming each; their ``run.json`` says KILLED too.
    Returns their ids. The one way saleval ends a dead run (:func:`end_dead_runs`,
    ``saleval-run``'s resume)."""
    ids = []
    for r in runs:
        client.set_terminated(r.info.run_id, status="KILLED")
        ids.append(r.info.run_id)
        run_json = Path(r.data.tags.get("run_dir") or "/nonexistent", "run.json")
        try:
            info = json.loads(run_json.read_text())
        except (OSError, ValueError):
            continue
        if info.get("run_id") == r.info.run_id and info.get("status") == "RUNNING":
            run_json.write_text(json.dumps({**info, "status": "KILLED"}, indent=2))
    if ids:
        named = ", ".join(
            f"{r.info.run_name or r.data.tags.get('stage', '?')} ({r.info.run_id}"
            + (f", pid {r.data.tags['pid']}" if r.data.tags.get("pid") else "")
            + ")"
            for r in runs
        )
        log.warning("%d run(s) %s marked KILLED: %s", len(ids), why, named)
    return ids


def end_dead_runs(client: MlflowClient | None = None) -> list[str]:
    """Mark KILLED every RUNNING run of the store that this host started and whose
    process is gone (``kill -9``, a crash, a reboot): found by the tags of
    :func:`process_tags`. Runs of other hosts are left alone (their processes cannot
    be seen from here), and so are runs without a ``pid`` tag. Every stage calls this
    when it starts (docs/tracking.md#runs-that-die)."""
    client = client or MlflowClient()
    host = socket.gethostname().replace("'", "")
    try:
        exps = [e.experiment_id for e in client.search_experiments()]
        if not exps:
            return []
        running = client.search_runs(
            exps,
            filter_string=f"attributes.status = 'RUNNING' and tags.host = '{host}'",
            max_results=10_000,
        )
    except mlflow.exceptions.MlflowException as err:  # a store that refuses the search
        log.warning("could not look for runs whose process died: %s", err)
        return []
    dead = [
        r
        for r in running
        if (r.data.tags.get("pid") or "").isdigit()
        and not process_alive(int(r.data.tags["pid"]), r.data.tags.get("pid_start"))
    ]
    return mark_killed(client, dead, "whose process on this host is gone")
