"""Runs whose process died, marked KILLED (the user's view: docs/tracking.md, *Runs that die*).

A process killed outright (``kill -9``, a crash, a reboot) cannot end its MLflow run, so
every run is tagged with its ``host``, ``pid`` and the pid's start time
(:func:`process_tags`), and every stage, when it starts, ends as KILLED the RUNNING runs
of its host whose process is gone (:func:`end_dead_runs`). :func:`mark_killed` is the
one way saleval ends a dead run; ``saleval-run``'s resume uses it too. A run inside a
SLURM job is also tagged with the job, and ends as KILLED once the job is over, seen
from any node of the cluster (docs/scale-out.md#when-a-job-dies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from saleval.pipeline.records import slurm_state
from saleval.pipeline.records.run_record import RunRecord
from saleval.pipeline.tracker.tracking_health import redact

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
        **slurm_state.job_tags(),  # in a SLURM job: its id, so any node can tell it ended
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


@contextlib.contextmanager
def killed_when_stopped() -> Iterator[None]:
    """End the active run as KILLED when the block is stopped from outside (Ctrl-C, a
    SIGTERM turned into :class:`saleval.errors.Stopped`), as a stage run is; MLflow's own
    ``with start_run()`` would say FAILED."""
    try:
        yield
    except BaseException as err:
        if not isinstance(err, Exception) and mlflow.active_run() is not None:
            mlflow.end_run(status="KILLED")
        raise


def mark_killed(client: MlflowClient, runs: Sequence[Any], why: str) -> list[str]:
    """End ``runs`` (RUNNING MLflow runs whose process is known dead) as KILLED, now,
    and say so in one warning line naming each; their ``run.json`` says KILLED too when it
    still said RUNNING (a run that recorded its own end keeps it: FAILED, or FINISHED when
    only its logging was cut short, which ``saleval-catch-up`` completes).
    Returns their ids. The one way saleval ends a dead run (:func:`end_dead_runs`,
    ``saleval-run``'s resume)."""
    ids = []
    for r in runs:
        client.set_terminated(r.info.run_id, status="KILLED")
        ids.append(r.info.run_id)
        run_dir = Path(r.data.tags.get("run_dir") or "/nonexistent")
        try:
            record = RunRecord.read(run_dir)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if record.run_id != r.info.run_id:
            continue
        if record.status == "RUNNING":
            dataclasses.replace(record, status="KILLED").write(run_dir)
        elif record.finished:  # its work is done; its end never reached here
            log.warning(
                "%s finished, but the tracking store missed its end: saleval-catch-up %s "
                "logs what it lacks and ends it as FINISHED", run_dir, run_dir,
            )  # fmt: skip
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
        log.warning("could not look for runs whose process died: %s", redact(str(err)))
        return []
    dead = [
        r
        for r in running
        if (r.data.tags.get("pid") or "").isdigit()
        and not process_alive(int(r.data.tags["pid"]), r.data.tags.get("pid_start"))
    ]
    return _end_ended_slurm_jobs(client, exps) + mark_killed(
        client, dead, "whose process on this host is gone"
    )


def _end_ended_slurm_jobs(client: MlflowClient, exps: list[str]) -> list[str]:
    """Mark KILLED the RUNNING runs whose SLURM job is over (cancelled, preempted, timed
    out, killed with its node), from whichever node ran them: ``squeue`` sees every job of
    its cluster. Only runs of the cluster this machine's client talks to count (a store
    shared by two clusters); where there is no SLURM client, nothing is done."""
    if not slurm_state.available():
        return []
    try:
        running = client.search_runs(
            exps,
            filter_string="attributes.status = 'RUNNING' and tags.slurm_job_id LIKE '%'",
            max_results=10_000,
        )
    except mlflow.exceptions.MlflowException as err:
        log.warning("could not look for runs whose SLURM job ended: %s", redact(str(err)))
        return []
    if not running:
        return []
    here = slurm_state.cluster_name()
    mine = [r for r in running if here is None or r.data.tags.get("slurm_cluster") in ("", here)]
    states = slurm_state.job_states(r.data.tags["slurm_job_id"] for r in mine)
    ended = [
        r
        for r in mine
        if states.get(r.data.tags["slurm_job_id"], "RUNNING") not in slurm_state.ACTIVE
    ]
    why = (
        "whose SLURM job is over ("
        + ", ".join(
            sorted(
                {
                    f"{r.data.tags['slurm_job_id']} {states[r.data.tags['slurm_job_id']]}"
                    for r in ended
                }
            )
        )
        + ")"
    )
    return mark_killed(client, ended, why)
