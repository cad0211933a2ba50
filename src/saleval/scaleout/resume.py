"""Resubmitting a sweep into its own sweep dir reruns only the jobs that did not finish.

A job of a ``-m`` sweep is finished when its job dir holds what a finished run leaves: a
stage's ``run.json`` with status FINISHED, or a ``saleval-run`` pipeline's
``pipeline.json``, and Hydra's ``.hydra/overrides.yaml`` says it ran the same overrides.
The launchers of :mod:`saleval.scaleout` skip such jobs when the same command is given
again with ``hydra.sweep.dir=<that sweep dir>`` (docs/scale-out.md, *When a job dies*), so
a sweep whose job was cancelled, preempted or crashed is finished by rerunning that job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from saleval.errors import EXIT_USER_ERROR, UserError
from saleval.pipeline.records.run_record import RunRecord

log = logging.getLogger(__name__)

#: the only job sub dir whose path is known before a job composes its config
_JOB_NUM_SUBDIR = "${hydra.job.num}"


class LauncherError(UserError, CompactHydraException):
    """A sweep that cannot run as configured, or whose jobs did not all finish: Hydra
    prints its one line (no traceback) and exits non-zero."""


@contextlib.contextmanager
def one_line_errors(task: str) -> Iterator[None]:
    """A :class:`LauncherError` (or another user error) ends the command with one line on
    stderr and exit status 2, as a stage's user error does (:mod:`saleval.cli`), unless
    ``HYDRA_FULL_ERROR=1``."""
    try:
        yield
    except UserError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"saleval-{task}: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None


class SweepDirError(LauncherError, ValueError):
    """A sweep dir given again that holds jobs of another sweep."""


@dataclass(frozen=True)
class Job:
    """One job of a sweep: its number, its overrides and (when known) its dir."""

    idx: int
    overrides: list[str]
    dir: Path | None


def jobs_of(config: DictConfig, job_overrides: Sequence[Sequence[str]], initial: int) -> list[Job]:
    """The jobs of one launch, numbered as Hydra numbers them."""
    sweep = Path(str(config.hydra.sweep.dir))
    subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False)
    known = isinstance(subdir, dict) and subdir.get("subdir") == _JOB_NUM_SUBDIR
    return [
        Job(initial + i, list(ov), sweep / str(initial + i) if known else None)
        for i, ov in enumerate(job_overrides)
    ]


def _read_overrides(job_dir: Path) -> list[str] | None:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    loaded = OmegaConf.to_container(OmegaConf.load(path))
    return [str(o) for o in loaded] if isinstance(loaded, list) else None


def finished(job: Job) -> bool:
    """Whether ``job`` already ran to the end in its dir (module docstring). A job dir
    that holds a finished job with other overrides is an error: the sweep dir belongs to
    another sweep."""
    if job.dir is None or not job.dir.is_dir():
        return False
    status: Any = None
    if (job.dir / "pipeline.json").is_file():
        status = "FINISHED"
    elif RunRecord.exists(job.dir):
        try:
            status = RunRecord.read(job.dir).status
        except (OSError, ValueError, TypeError, AttributeError):
            status = None
    if status != "FINISHED":
        return False
    ran = _read_overrides(job.dir)
    if ran is not None and sorted(ran) != sorted(job.overrides):
        raise SweepDirError(
            f"hydra.sweep.dir={job.dir.parent} holds job {job.idx} of another sweep "
            f"({' '.join(ran)}, not {' '.join(job.overrides)}): resubmit the same sweep "
            "there, or leave hydra.sweep.dir unset for a new one"
        )
    return True


def split(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """(jobs to run, jobs finished already)."""
    done = [j for j in jobs if finished(j)]
    return [j for j in jobs if j not in done], done


class StoreDownError(LauncherError, RuntimeError):
    """The sweep's tracking store does not answer: nothing was submitted."""


def end_dead_runs(config: Any, before_submit: bool = True) -> None:
    """What every stage does when it starts, done by a launcher before submitting and
    after a job was lost: the sweep's tracking store is checked within ``tracking.wait_s``
    (a store that does not answer, or refuses this client, refuses the sweep in one line,
    before anything is submitted: its jobs could only fail), and a job that died is KILLED
    in MLflow (and its run.json) before it is rerun
    (:func:`saleval.pipeline.records.dead_runs.end_dead_runs`). MLflow's calls here and in the jobs
    give up within the same wait (:func:`saleval.pipeline.tracker.tracking_health.bound_requests`).
    After jobs were lost (``before_submit=False``), a store that does not answer is one
    warning: the lost jobs' line follows."""
    from mlflow.tracking import MlflowClient

    from saleval.pipeline.records import dead_runs
    from saleval.pipeline.tracker import tracking, tracking_health

    uri = tracking.tracking_uri(OmegaConf.select(config, "tracking.uri", default=None))
    wait_s = OmegaConf.select(config, "tracking.wait_s", default=None)
    try:
        tracking_health.check_store(
            uri, wait_s, OmegaConf.select(config, "tracking.experiment", default=None)
        )
    except tracking_health.TrackingError as err:
        if before_submit:
            from saleval.pipeline.records.run_outputs import remove_stub

            root = OmegaConf.select(config, "paths.output_root", default=None)
            remove_stub(Path(str(config.hydra.sweep.dir)), root, ("multirun.yaml",))
            raise StoreDownError(f"{err}; nothing was submitted") from None
        log.warning("could not mark the lost jobs' runs KILLED: %s", err)
        return
    try:
        dead_runs.end_dead_runs(MlflowClient(tracking_uri=uri))
    except Exception as err:  # the store failed after it answered: the jobs say the rest
        log.warning("could not look for dead runs in %s: %s", tracking_health.redact(uri), err)


def reused_return(job: Job, task_name: str) -> Any:
    """Hydra's ``JobReturn`` for a finished job that is not run again."""
    from hydra.core.utils import JobReturn, JobStatus

    return JobReturn(
        overrides=job.overrides,
        working_dir=str(job.dir),
        task_name=task_name,
        status=JobStatus.COMPLETED,
        _return_value=None,
    )
