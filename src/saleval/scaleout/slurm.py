"""``hydra/launcher=slurm``: Submitit's SLURM launcher, made to fail early and resume.

Hydra's Submitit plugin submits one array task per job and waits on ``sacct``. Three things
a user met on a small cluster (docs/scale-out.md) are handled here:

* **Resources checked before submitting.** A job that asks for more memory, cores, GPUs or
  time than any node of its partition has is never started by SLURM: it waits in the queue
  for ever (or until the time limit); a job whose trainer runs on a GPU it did not ask for
  (``trainer=gpu`` with ``gpus_per_node=0``, or on a partition without GPUs) crashes on its
  node. :func:`check_resources` compares the request with what ``sinfo`` reports and with
  what the jobs' configs use (:mod:`saleval.scaleout.needs`) and fails in one line naming
  each setting and the value that fits.
* **A job that ends without a result is noticed.** Without an accounting database,
  ``sacct`` answers nothing and Submitit would wait for ever on a cancelled job; the wait
  here reads ``squeue`` (:mod:`saleval.pipeline.records.slurm_state`) and ends the sweep with one
  line naming the job, its SLURM state and the command that reruns it.
* **A job told to stop ends its run as KILLED.** ``scancel`` (with or without ``-s KILL``)
  and a preempting scheduler send SIGTERM before killing: the job turns it into
  :class:`saleval.errors.Stopped`, naming what SLURM is doing (:func:`stop_reason`), so
  the stage marks its MLflow run and ``run.json`` KILLED. So does the warning signal
  Submitit asks for before the time limit, unless ``max_num_timeout`` lets Submitit
  requeue. A job killed outright is marked by the next stage or launcher that starts
  (:func:`saleval.pipeline.records.dead_runs.end_dead_runs`).

Resubmitting into the same sweep dir (``hydra.sweep.dir=<sweep dir>``) runs only the jobs
that did not finish (:mod:`saleval.scaleout.resume`).
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
    SlurmLauncher as SubmititSlurmLauncher,
)

from saleval.errors import Stopped, sigterm_raises
from saleval.pipeline.records import slurm_state
from saleval.scaleout import resume
from saleval.scaleout.needs import GpuUse, sweep_gpus
from saleval.scaleout.resume import LauncherError, one_line_errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Partition:
    """What the largest node of a partition offers, as ``sinfo`` reports it."""

    name: str
    memory_mb: int
    cpus: int
    gpus: int
    time_limit_min: int | None  # None: no limit


def _minutes(limit: str) -> int | None:
    """``sinfo``'s ``%l`` (``infinite``, ``1-00:00:00``, ``2:00:00``, ``30:00``) in minutes.

    >>> [_minutes(x) for x in ("infinite", "1-02:00:00", "2:00:00", "30:00", "45")]
    [None, 1560, 120, 30, 45]
    """
    if not limit or limit.lower() in ("infinite", "unlimited", "n/a"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    h, m, s = ([0, 0, *parts])[-3:] if len(parts) >= 2 else (0, parts[0], 0)
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


def _gpus(gres: str) -> int:
    """GPUs in ``sinfo``'s ``%G`` (``(null)``, ``gpu:4``, ``gpu:a100:2(S:0-1),mps:100``).

    >>> [_gpus(x) for x in ("(null)", "gpu:4", "gpu:a100:2(S:0-1),mps:100")]
    [0, 4, 2]
    """
    total = 0
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def partition_info(partition: str | None) -> Partition:
    """The largest node of ``partition`` (None: the cluster's default partition)."""
    if shutil.which("sinfo") is None:
        raise LauncherError(
            "sinfo not found: hydra/launcher=slurm submits from a SLURM login node "
            "(to try it on this machine: make slurm-local, docs/scale-out.md)"
        )
    res = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%P|%m|%c|%G|%l"], capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0:
        raise LauncherError(f"sinfo failed: {' '.join(res.stderr.split())}")
    rows = [line.split("|") for line in res.stdout.splitlines() if line.count("|") == 4]
    names = sorted({r[0].rstrip("*") for r in rows})
    if partition is None:
        default = {r[0].rstrip("*") for r in rows if r[0].endswith("*")}
        if not default:
            raise LauncherError(
                f"this cluster has no default partition: set hydra.launcher.partition "
                f"(one of {', '.join(names)})"
            )
        partition = default.pop()
    mine = [r for r in rows if r[0].rstrip("*") == partition]
    if not mine:
        raise LauncherError(
            f"hydra.launcher.partition={partition}: no such partition; sinfo lists "
            f"{', '.join(names) or 'none'}"
        )
    limits = [_minutes(r[4]) for r in mine]
    return Partition(
        name=partition,
        memory_mb=max(int(re.sub(r"\D", "", r[1]) or 0) for r in mine),
        cpus=max(int(re.sub(r"\D", "", r[2]) or 0) for r in mine),
        gpus=max(_gpus(r[3]) for r in mine),
        time_limit_min=None if None in limits else max(x for x in limits if x is not None),
    )


def check_resources(params: Mapping[str, Any], part: Partition, use: GpuUse | None = None) -> None:
    """Refuse, in one line, a job no node of ``part`` can run (each setting that does not
    fit and the value that would), a job whose trainer takes more GPUs than it asks for
    (``use``: :func:`saleval.scaleout.needs.sweep_gpus`; it would crash on its node), and a
    time limit Submitit's warning signal eats.

    >>> p = Partition("debug", memory_mb=3900, cpus=2, gpus=0, time_limit_min=60)
    >>> check_resources({"mem_gb": 4, "cpus_per_task": 1, "gpus_per_node": 0,
    ...                  "timeout_min": 60, "signal_delay_s": 120}, p)
    Traceback (most recent call last):
    ...
    saleval.scaleout.resume.LauncherError: partition 'debug' cannot run these jobs (its largest node: 3900 MB, 2 cores, no GPU, 60 min): set hydra.launcher.mem_gb=3 or less
    """
    use = use or GpuUse()
    fixes = []
    tasks = int(params.get("tasks_per_node") or 1)
    mem = params.get("mem_gb")
    if mem is not None and int(mem) * 1024 > part.memory_mb:
        fixes.append(f"hydra.launcher.mem_gb={max(part.memory_mb // 1024, 1)} or less")
    cpus = params.get("cpus_per_task")
    if cpus is not None and int(cpus) * tasks > part.cpus:
        fixes.append(f"hydra.launcher.cpus_per_task={max(part.cpus // tasks, 1)} or less")
    fixes.extend(_gpu_fixes(int(params.get("gpus_per_node") or 0), use, part.gpus))
    timeout = int(params.get("timeout_min") or 0)
    if part.time_limit_min is not None and timeout > part.time_limit_min:
        fixes.append(f"hydra.launcher.timeout_min={part.time_limit_min} or less")
    if fixes:
        gpu = f"{part.gpus} GPU" if part.gpus else "no GPU"
        limit = f"{part.time_limit_min} min" if part.time_limit_min else "no time limit"
        each = f"; each job's {use.what} takes {use.gpus} GPU" if use.gpus else ""
        raise LauncherError(
            f"partition '{part.name}' cannot run these jobs (its largest node: "
            f"{part.memory_mb} MB, {part.cpus} cores, {gpu}, {limit}{each}): set "
            + ", ".join(fixes)
        )
    delay = int(params.get("signal_delay_s") or 0)
    if timeout * 60 <= delay:
        raise LauncherError(
            f"hydra.launcher.timeout_min={timeout} leaves no time before Submitit's warning "
            f"signal (hydra.launcher.signal_delay_s={delay}): set hydra.launcher.timeout_min "
            f"above {delay // 60 + 1}"
        )


def _gpu_fixes(asked: int, use: GpuUse, there: int) -> list[str]:
    """The settings that make the GPUs asked for (``gpus_per_node``), those the job's
    trainer takes (``use``) and those a node has (``there``) agree.

    >>> _gpu_fixes(1, GpuUse(), 0)
    ['hydra.launcher.gpus_per_node=0 (or a partition with GPUs)']
    >>> _gpu_fixes(0, GpuUse(1, "trainer=gpu"), 0)
    ['trainer=cpu (or a partition with GPUs)']
    >>> _gpu_fixes(0, GpuUse(1, "trainer=gpu"), 4)
    ['hydra.launcher.gpus_per_node=1 (or trainer=cpu)']
    >>> _gpu_fixes(8, GpuUse(8, "trainer=ddp"), 4)
    ['hydra.launcher.gpus_per_node=4 or less', 'trainer.devices=4 or less']
    """
    if there == 0:
        wrong = (["trainer=cpu"] if use.gpus else []) + (
            ["hydra.launcher.gpus_per_node=0"] if asked else []
        )
        return [" and ".join(wrong) + " (or a partition with GPUs)"] if wrong else []
    fixes = []
    if asked > there:
        fixes.append(f"hydra.launcher.gpus_per_node={there} or less")
    if use.gpus > there:
        fixes.append(f"trainer.devices={there} or less")
    elif use.gpus > asked:
        fixes.append(f"hydra.launcher.gpus_per_node={use.gpus} (or trainer=cpu)")
    return fixes


def stop_reason(signame: str, job: str | None, state: str | None) -> str:
    """Why a job got ``signame``, for its run's ``run.json`` and MLflow run. SLURM turns
    ``scancel`` and ``scancel -s KILL`` alike (and its time limit, and preemption) into
    SIGTERM, then SIGKILL after ``KillWait``: the job's state at that moment (COMPLETING,
    CANCELLED...) tells SLURM killing it from a signal sent alone (``scancel -s TERM``:
    still RUNNING).

    >>> stop_reason("SIGTERM", "10_1", "COMPLETING")  # doctest: +ELLIPSIS
    'SLURM is killing job 10_1 (COMPLETING: scancel or scancel -s KILL, ...'
    >>> stop_reason("SIGTERM", "10_1", "RUNNING")
    'job 10_1 got SIGTERM (scancel -s TERM or kill), and SLURM still runs it'
    >>> stop_reason("SIGTERM", None, None)
    'SLURM sent SIGTERM (scancel or preemption)'
    """
    if not job or not state:
        return f"SLURM sent {signame} (scancel or preemption)"
    if state in slurm_state.ACTIVE and state != "COMPLETING":
        return f"job {job} got {signame} (scancel -s TERM or kill), and SLURM still runs it"
    return (
        f"SLURM is killing job {job} ({state}: scancel or scancel -s KILL, its time limit, "
        f"or preemption; {signame} first, SIGKILL after KillWait)"
    )


#: SLURM states of a job stopped before its end: it wrote no result
_STOPPED = frozenset(
    {"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


class SlurmLauncher(SubmititSlurmLauncher):
    """Submitit's SLURM launcher with the checks, the wait and the resume of the module
    docstring. Hydra finds it as ``hydra_plugins.saleval_launchers.SlurmLauncher``."""

    #: seconds between two looks at the queue while jobs run
    poll_s = 2.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The job itself, on a node: SIGTERM (``scancel``, preemption) stops the stage,
        naming what SLURM is doing; once the stage is done, Submitit's handler is back."""

        def stopped(signum: int) -> Stopped:
            job = slurm_state.job_tags().get("slurm_job_id")
            state = slurm_state.job_states([job], timeout=5).get(job) if job else None
            return Stopped(stop_reason(signal.Signals(signum).name, job, state))

        with sigterm_raises(stopped):
            return super().__call__(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Submitit's hook for its warning signal (the time limit near, or preemption):
        requeue where ``max_num_timeout`` allows, else stop the stage (its run: KILLED)."""
        if int(self.params.get("max_num_timeout") or 0) > 0:
            return super().checkpoint(*args, **kwargs)
        raise Stopped(
            f"the SLURM time limit is near (hydra.launcher.timeout_min="
            f"{self.params.get('timeout_min')}) or the job was preempted"
        )

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        assert self.config is not None
        with one_line_errors(str(self.config.hydra.job.name)):
            return self._launch(job_overrides, initial_job_idx)

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        assert self.config is not None
        params = dict(self.params)
        assert self.hydra_context is not None
        use = sweep_gpus(
            self.config, job_overrides, self.hydra_context.config_loader.load_sweep_config
        )
        check_resources(params, partition_info(params.get("partition")), use)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        jobs = resume.jobs_of(self.config, job_overrides, initial_job_idx)
        todo, done = resume.split(jobs)
        resume.end_dead_runs(self.config)
        for job in done:
            log.info("\t#%d : finished already in %s: not run again", job.idx, job.dir)
        returns: dict[int, Any] = {
            j.idx: resume.reused_return(j, str(self.config.hydra.job.name)) for j in done
        }
        if todo:
            executor = submitit.AutoExecutor(
                cluster="slurm",
                folder=params.pop("submitit_folder"),
                slurm_max_num_timeout=params.pop("max_num_timeout", 0),
            )
            base = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node",
                    "mem_gb", "nodes", "name", "stderr_to_stdout"}  # fmt: skip
            executor.update_parameters(
                **{k if k in base else f"slurm_{k}": v for k, v in params.items()}
            )
            log.info("Submitit 'slurm' sweep output dir : %s", sweep_dir)
            sweep_dir.mkdir(parents=True, exist_ok=True)
            for job in todo:
                log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
            state = Singleton.get_state()
            submitted = executor.map_array(
                self,
                [j.overrides for j in todo],
                ["hydra.sweep.dir"] * len(todo),
                [j.idx for j in todo],
                [f"job_id_for_{j.idx}" for j in todo],
                [state] * len(todo),
            )
            returns.update(self._wait(todo, submitted, sweep_dir))
        return [returns[j.idx] for j in jobs]

    def _wait(
        self, todo: Sequence[resume.Job], submitted: Sequence[Any], sweep_dir: Path
    ) -> dict[int, Any]:
        """Each job's result, or, for jobs SLURM ended without one, one error line once
        every other job is done."""
        results: dict[int, Any] = {}
        ended: dict[int, str] = {}
        pending = dict(zip([j.idx for j in todo], submitted))
        gone_since: dict[int, float] = {}
        while pending:
            states = slurm_state.job_states(j.job_id for j in pending.values())
            for idx, sjob in list(pending.items()):
                if sjob.paths.result_pickle.exists():
                    results[idx] = sjob.results()[0]
                    del pending[idx]
                    continue
                state = states.get(sjob.job_id)
                if state is None or state in slurm_state.ACTIVE:
                    continue
                # over without a result: a job that ran to its end may have written one
                # that a shared filesystem shows late; a stopped job has none to show
                first = gone_since.setdefault(idx, time.monotonic())
                grace = 0 if state in _STOPPED else 30
                if time.monotonic() - first >= grace:
                    ended[idx] = f"{state} (SLURM job {sjob.job_id})"
                    del pending[idx]
            if pending:
                time.sleep(self.poll_s)
        if ended:
            resume.end_dead_runs(self.config, before_submit=False)
            named = "; ".join(
                f"job {idx} ({' '.join(next(j.overrides for j in todo if j.idx == idx))}) "
                f"ended {why}"
                for idx, why in sorted(ended.items())
            )
            raise LauncherError(
                f"{named} without finishing (a run it started is marked KILLED). Rerun only the "
                f"unfinished jobs: the same command with hydra.sweep.dir={sweep_dir}"
            )
        return results
