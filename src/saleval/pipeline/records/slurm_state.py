"""What SLURM says about jobs, read with ``squeue`` (no accounting database needed).

Used on both sides of a sweep: the launcher waits on its jobs with it, and every stage,
when it starts, ends as KILLED the MLflow runs whose SLURM job is over
(:func:`saleval.pipeline.records.dead_runs.end_dead_runs`). Imports nothing of saleval.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

#: states in which a job's processes may still run (``squeue --states=all`` spells them so)
ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
     "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
)  # fmt: skip
#: a job SLURM no longer knows: ended longer ago than the cluster's ``MinJobAge``
GONE = "GONE"


def job_tags() -> dict[str, str]:
    """``slurm_job_id`` and ``slurm_cluster`` of this process's job ({} outside SLURM): a
    run tagged with them can be told dead from any machine of the cluster. A task of a job
    array is named as ``squeue``, ``scancel`` and the launcher's error line name it,
    ``<array job>_<task>`` (its own ``SLURM_JOB_ID`` is a number no user sees)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        job = f"{array}_{task}"
    return {"slurm_job_id": job, "slurm_cluster": os.environ.get("SLURM_CLUSTER_NAME", "")}


def available() -> bool:
    """Whether this machine is a SLURM client (``squeue`` on PATH)."""
    return shutil.which("squeue") is not None


def job_states(job_ids: Iterable[str], timeout: float = 30) -> dict[str, str]:
    """Job id → state (``RUNNING``, ``CANCELLED``, ``PREEMPTED``, ... or :data:`GONE`).

    Ids may be plain (``123``) or array tasks (``123_4``); both spellings of an array task
    are answered. Empty when ``squeue`` is missing or the controller does not answer within
    ``timeout`` seconds a call (then nothing can be told).
    """
    ids = sorted({str(j) for j in job_ids if str(j)})
    if not ids or not available():
        return {}
    out: dict[str, str] = {}
    for jid in ids:  # one call per id: squeue fails whole when one id is unknown
        try:
            res = subprocess.run(
                ["squeue", "-h", "--states=all", "-o", "%A|%i|%T", "-j", jid],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                out[jid] = GONE
                continue
            return {}  # no controller: tell nothing
        lines = [line.split("|") for line in res.stdout.split() if line.count("|") == 2]
        state = next((s for a, i, s in lines if jid in (a, i)), None)
        out[jid] = (state or GONE).split()[0].rstrip("+")
    return out


def cluster_name() -> str | None:
    """The cluster this machine's SLURM client talks to (``scontrol show config``)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        res = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in res.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return None
