"""The stage contract (docs/architecture.md) in one place.

Every stage module defines ``run(cfg) -> dict``, which tests call and the console script
``saleval-<stage>`` runs (:mod:`saleval.cli` builds it from the stage table and imports the
module only when the job starts). Inside ``run``::

    with Stage(cfg, "score", inputs={"crowd": cfg.inputs.crowd}) as st:
        df = tables.AGGREGATED.read(st.inputs["crowd"])
        st.write(tables.SCORES, scores)        # writes into the run dir and logs it
        st.log_metrics({...})

``Stage`` is built from two parts and restates neither. ``st.inputs`` is the run's
:class:`saleval.pipeline.records.run_inputs.RunInputs` (``inputs.<name>`` resolved, each parent's
``config.yaml`` and record read once, the one provenance rule applied;
``st.inputs.read`` merges the tables of an input that names several runs); ``st.tracking``
is its :class:`saleval.pipeline.tracker.stage_tracking.StageTracking` (the MLflow run: its id, tags,
methods and per-method child runs). ``Stage`` itself owns the run's lifecycle and what it
means: its provenance (``st.provenance``, the one place a run is ``simulated``, whose tags
follow it), the resolved config and the record, ``run.json``
(:class:`saleval.pipeline.records.run_record.RunRecord`: run id, fingerprint, parents, provenance),
written into the run dir as the run goes and at its end by ``st.record``
(:class:`saleval.pipeline.stage_record.StageRecord`); it starts an MLflow run (nested under
an active pipeline run), tags it (with the host, pid and pid start time that let a later
stage tell it died), and always ends it, marking it FAILED on an exception (KILLED when stopped from outside:
Ctrl-C, a SIGTERM turned into :class:`saleval.errors.Stopped`); before
starting, it marks KILLED the RUNNING runs of this host
whose process is gone (:func:`saleval.pipeline.records.dead_runs.end_dead_runs`). In the extra processes of a multi-process
(DDP) job it does none of this (:func:`is_main_process`): one run dir, one MLflow run.

What a run can be trusted for (docs/tracking.md): it starts only once its tracking store
has answered (:func:`saleval.pipeline.tracker.tracking_health.check_store`), its parents having
FINISHED with their tables unchanged (:class:`~saleval.pipeline.records.run_record.RunRecord`); ``run.json``
holds the checksum of every table it writes; everything it logs is kept in its run dir
too (:mod:`saleval.pipeline.tracker.tracking_journal`), so a store that fails mid-run costs no
work and ``saleval-catch-up`` sends the rest later.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import paths
from saleval.pipeline.records import fingerprints, run_outputs, run_record
from saleval.pipeline.records.provenance import Provenance
from saleval.pipeline.records.run_inputs import RunInputs
from saleval.pipeline.stage_record import StageRecord
from saleval.pipeline.tables import TableSpec
from saleval.pipeline.tracker import tracking, tracking_health
from saleval.pipeline.tracker.stage_tracking import IDENTITY_TAGS, StageTracking

log = logging.getLogger(__name__)

#: where launchers put a process's rank: Lightning's ``ddp`` launcher (``LOCAL_RANK``,
#: ``NODE_RANK``), ``torchrun`` (``RANK``), ``srun`` (``SLURM_PROCID``), LSF (``JSM_...``).
_RANK_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def is_main_process() -> bool:
    """False in the ranks > 0 of a multi-process (DDP) job, known from the environment.

    Read at start-up rather than from a Trainer because Lightning's ``ddp`` launcher (and
    ``torchrun``, ``srun``) run the whole stage again in every rank: only the process whose
    ranks are all 0 (or unset) may write the run dir and log to MLflow.
    """
    return all(os.environ.get(v, "0").strip() in ("", "0") for v in _RANK_VARS)


def end_status(exc_type: type[BaseException] | None) -> str:
    """How a run ended: stopped from outside (Ctrl-C, scancel's SIGTERM:
    :class:`saleval.errors.Stopped`) is not a failure of the stage but KILLED, as a run
    whose process died is marked later.

    >>> end_status(None), end_status(ValueError), end_status(KeyboardInterrupt)
    ('FINISHED', 'FAILED', 'KILLED')
    """
    if exc_type is None:
        return "FINISHED"
    return "FAILED" if issubclass(exc_type, Exception) else "KILLED"


class Stage:
    """One stage run's lifecycle: run dir, ``config.yaml`` and its record
    (:class:`~saleval.pipeline.records.run_record.RunRecord`), the provenance its outputs carry,
    table writing. What it reads is ``st.inputs`` (:class:`RunInputs`), its MLflow side
    ``st.tracking`` (:class:`StageTracking`)."""

    def __init__(
        self,
        cfg: DictConfig,
        stage: str,
        inputs: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        inherits: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
        requires: Sequence[str] = (),
        simulated: bool = False,
    ) -> None:
        """``inherits``: the provenance fields this stage takes from its parents (names,
        or field → input names); None: every field from every parent. ``requires``: fields
        that must be known once inherited (given or adopted), else it fails before starting.
        ``simulated``: a simulated crowd answers in this run (its parents may say so too).
        ``tags``: the run's own MLflow tags; ``dataset``, ``model`` and ``simulated`` are
        not among them: they follow the provenance (:meth:`provide`)."""
        given = sorted(set(tags or {}) & set(IDENTITY_TAGS))
        if given:
            raise ValueError(
                f"Stage(tags=...): {', '.join(given)} follow the run's provenance: pass "
                "simulated=True, or st.provide(...) once the stage knows them"
            )
        self.cfg, self.stage = cfg, stage
        self.run_dir = run_outputs.run_dir_of(cfg).resolve()
        #: what the run reads: its parent runs, read once, and the provenance they give
        self.inputs = RunInputs(cfg, stage, inputs, inherits, requires, simulated)
        #: the run's provenance: its parents' (:class:`RunInputs`), then what it provides
        self.provenance: Provenance = self.inputs.provenance
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(resolved, dict)
        self.resolved: dict[str, Any] = cast(dict[str, Any], resolved)  # keys are str
        self.fingerprint = fingerprints.stage_fingerprint(
            cfg, stage, self.inputs.runs, self.inputs.records, self.resolved
        )
        self.extra_tags = dict(tags or {})
        #: False in a DDP rank > 0: the context then writes and logs nothing
        self.is_main = is_main_process()
        #: the MLflow run (its tags follow :attr:`provenance`)
        self.tracking = StageTracking(stage, cfg, self.resolved, lambda: self.provenance)
        self._t0 = 0.0
        #: run.json, kept in step with the run dir and the store
        self.record = StageRecord(
            stage,
            self.run_dir,
            self.fingerprint,
            self.inputs,
            self.tracking,
            lambda: self.provenance,
        )

    def provide(self, **fields: Any) -> None:
        """Record provenance this stage computes itself (e.g. the explain stage's
        ``max_length``, a crowd import's ``simulated``); written into ``run.json``, and the
        MLflow run's name, params and tags follow."""
        self.provenance = dataclasses.replace(self.provenance, **fields)
        if self.is_main and self.tracking.run_id is not None:
            self.tracking.log_identity()
            self.record.write(status="RUNNING")

    def __enter__(self) -> Stage:
        if not self.is_main:  # a DDP rank > 0: rank 0 owns the run dir and the MLflow run
            return self
        # the store actually used (MLFLOW_TRACKING_URI wins), in config.yaml and the params;
        # one holding a password, or one that does not answer, fails here, before any work
        uri = tracking.tracking_uri(OmegaConf.select(self.cfg, "tracking.uri", default=None))
        tracking_health.check_store(
            uri,
            OmegaConf.select(self.cfg, "tracking.wait_s", default=None),
            OmegaConf.select(self.cfg, "tracking.experiment", default=None),
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if OmegaConf.select(self.cfg, "tracking", default=None) is not None:
            with open_dict(self.cfg):
                self.cfg.tracking.uri = uri
            self.resolved["tracking"]["uri"] = uri
        run_record.write_atomically(
            self.run_dir / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True)
        )
        self.tracking.start(uri, self.run_dir, self.fingerprint, self.inputs, self.extra_tags)
        self.record.write(status="RUNNING")
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.is_main:
            return
        seconds = time.perf_counter() - self._t0
        status = end_status(exc_type)
        journal = self.tracking.journal
        if exc is not None and journal is not None and journal.lost is None:
            cause = tracking_health.store_failure(exc)
            if cause is not None:  # the store failed outside saleval's logging: end quickly
                journal.lost = cause
        if exc_type is None:
            self.tracking.recover()  # the store back after an outage: send what it missed
            self.tracking.keep_direct_metrics()  # e.g. Lightning's curves, into the run dir
        try:
            self.record.finish(status, seconds, exc if exc_type else None)
        finally:
            if self.tracking.run_id is not None:
                self.record.end(seconds)
        if not exc_type and not self.tracking.nested:  # saleval-run prints its own summary
            run_outputs.link_latest(paths.output_root(self.cfg), self.stage, self.run_dir)
            print(self.summary(), flush=True)
            missed = self.tracking.record() or {}
            if not missed.get("logged", True):
                print(run_outputs.not_logged_line(self.stage, self.run_dir, missed), flush=True)

    def summary(self) -> str:
        """Where the run went and the command(s) that take it further (run_outputs.summary)."""
        known = {"run": str(self.run_dir), **{k: str(p) for k, p in self.inputs.items()}}
        if "checkpoint" in self.extra_tags:
            known.setdefault("model", self.extra_tags["checkpoint"])
        t = self.tracking
        return run_outputs.summary(self.stage, self.run_dir, t.run_id, known,
                                   t.experiment_id, t.view, t.tags.get("sweep"))  # fmt: skip

    # -- outputs ------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.run_dir / name

    def write(self, spec: TableSpec, df: pd.DataFrame) -> Path:
        """Validate, write into the run dir (its checksum goes into ``run.json``), and log
        the table as an artifact."""
        if not self.is_main:  # a DDP rank > 0: rank 0 writes the same table
            return spec.path(self.run_dir)
        path = spec.write(df, self.run_dir)
        self.record.tables.append(spec.filename)
        if self.tracking.run_id is not None:  # the record follows what is on disk, table by table
            self.record.write(status="RUNNING")
        tracking.log_files([path])
        return path

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.is_main:
            tracking.log_files([path], artifact_path)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int | None = None, **kwargs: Any
    ) -> None:
        """Into the stage run (keys: :func:`saleval.pipeline.records.run_naming.metric_key`); ``kwargs``:
        MLflow's ``model_id``/``dataset``."""
        if self.is_main:
            tracking.log_metrics(metrics, step=step, **kwargs)
