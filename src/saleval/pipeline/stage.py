"""The stage contract (docs/architecture.md) in one place.

Every stage module defines ``run(cfg) -> dict`` (tests call it) and
``main = hydra_main("<config name>", run)`` (the console script; ``saleval-<stage>`` runs it
through :mod:`saleval.cli`, which imports the module only when the job starts). Inside ``run``::

    with Stage(cfg, "score", inputs={"crowd": cfg.inputs.crowd}) as st:
        df = tables.AGGREGATED.read(st.inputs["crowd"])
        st.write(tables.SCORES, scores)        # writes into the run dir and logs it
        st.log_metrics({...})

``Stage`` first reads its parent runs through :class:`saleval.pipeline.run_inputs.RunInputs`
(``inputs.<name>`` resolved, each parent's ``config.yaml`` and ``run.json`` read once, the
one provenance rule applied; ``st.read`` merges the tables of an input that names several
runs), then owns the run's lifecycle: it writes the resolved config and ``run.json`` (run
id, fingerprint, parents, provenance) into the run dir, starts an MLflow run (nested under
an active pipeline run), tags it (with the host, pid and pid start time that let a later
stage tell it died), and always ends it, marking it FAILED on an exception (KILLED when stopped from outside:
Ctrl-C, a SIGTERM turned into :class:`saleval.errors.Stopped`); before
starting, it marks KILLED the RUNNING runs of this host
whose process is gone (:func:`saleval.pipeline.dead_runs.end_dead_runs`). In the extra processes of a multi-process
(DDP) job it does none of this (:func:`is_main_process`): one run dir, one MLflow run.

What a run can be trusted for (docs/tracking.md): it starts only once its tracking store
has answered (:func:`saleval.pipeline.tracking_health.check_store`), its parents having
FINISHED with their tables unchanged (:mod:`saleval.pipeline.run_checks`); ``run.json``
holds the checksum of every table it writes; everything it logs is kept in its run dir
too (:mod:`saleval.pipeline.tracking_journal`), so a store that fails mid-run costs no
work and ``saleval-catch-up`` sends the rest later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval.pipeline import run_checks, run_record, tracking, tracking_health
from saleval.pipeline.provenance import Provenance
from saleval.pipeline.run_checks import RUN_JSON
from saleval.pipeline.run_inputs import RunInputs, read_run_info
from saleval.pipeline.stage_tracking import StageTracking
from saleval.pipeline.tables import TableSpec

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


def fingerprint(cfg: Mapping[str, Any], parents: Mapping[str, str]) -> str:
    """Hash of what determines a stage's outputs: its config and its parents' fingerprints."""
    blob = json.dumps(
        {"cfg": cfg, "parents": dict(sorted(parents.items()))}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Keys that name where things go rather than what is computed.
_VOLATILE = ("run_dir", "paths", "tracking", "hydra", "inputs", "progress", "reuse_methods")


def stage_fingerprint(
    cfg: DictConfig,
    stage: str,
    input_dirs: Mapping[str, Path],
    parents: Mapping[str, Mapping[str, Any]] | None = None,
    resolved: dict[str, Any] | None = None,
) -> str:
    """What a run of ``stage`` with ``cfg`` on these parent run dirs would compute.

    Two runs with the same fingerprint produce the same outputs (up to hardware
    nondeterminism); ``saleval-run`` reuses a finished one instead of recomputing.
    ``parents`` (their ``run.json``) and ``resolved`` (``cfg`` resolved) spare reading
    and resolving them again when the caller has them.
    """
    if resolved is None:
        container = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(container, dict)
        resolved = cast(dict[str, Any], container)  # a stage config's keys are str
    stable = {k: v for k, v in resolved.items() if k not in _VOLATILE}
    if isinstance(stable.get("dataset"), dict):  # where the files sit is not what they are
        stable["dataset"] = {k: v for k, v in stable["dataset"].items() if k != "data_root"}
    infos = parents or {k: read_run_info(p) for k, p in input_dirs.items()}
    prints = {k: str(infos[k].get("fingerprint", "")) for k in input_dirs}
    # inputs given as plain files (a platform's answers.csv) count by their content
    for k, v in (resolved.get("inputs") or {}).items():
        if k not in prints and isinstance(v, str) and Path(v).is_file():
            prints[k] = "sha256:" + hashlib.sha256(Path(v).read_bytes()).hexdigest()
    return fingerprint({"stage": stage, **stable}, prints)


class Stage:
    """One stage run's lifecycle: run dir, ``config.yaml`` and ``run.json``
    (:mod:`saleval.pipeline.run_record`), the MLflow run (:class:`StageTracking`), table writing;
    what it reads comes from its :class:`RunInputs` (``st.inputs``, ``st.parents``,
    ``st.read``)."""

    def __init__(
        self,
        cfg: DictConfig,
        stage: str,
        inputs: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        inherits: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
        requires: Sequence[str] = (),
    ) -> None:
        """``inherits``: the provenance fields this stage takes from its parents (names,
        or field → input names); None: every field from every parent. ``requires``: fields
        that must be known once inherited (given or adopted), else it fails before starting."""
        self.cfg, self.stage = cfg, stage
        self.run_dir = run_record.run_dir_of(cfg).resolve()
        #: the parent runs, read once, and the provenance they give (saleval.pipeline.run_inputs)
        self.run_inputs = ri = RunInputs(
            cfg, stage, inputs, inherits, requires, (tags or {}).get("simulated") == "true"
        )
        self.input_runs, self.inputs, self.parents = ri.input_runs, ri.inputs, ri.parents
        self.parent_configs, self.parent_provenance = ri.parent_configs, ri.parent_provenance
        #: the run's provenance: the parents' (:class:`RunInputs`), then what it provides
        self.provenance: Provenance = ri.provenance
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(resolved, dict)
        self.resolved: dict[str, Any] = cast(dict[str, Any], resolved)  # keys are str
        self.fingerprint = stage_fingerprint(cfg, stage, ri.runs, ri.infos, self.resolved)
        self.extra_tags = dict(tags or {})
        #: False in a DDP rank > 0: the context then writes and logs nothing
        self.is_main = is_main_process()
        self.tracking = StageTracking(stage, cfg, self.resolved, lambda: self.provenance)
        self._t0 = 0.0
        #: the declared tables written (their checksums go into run.json)
        self._tables: list[str] = []
        self._recorded: dict[str, Any] | None = None  # run.json's tracking record, last written

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (None before the run starts, and in a DDP rank > 0)."""
        return self.tracking.run_id

    @property
    def tags(self) -> dict[str, str]:
        """The MLflow run's tags (``simulated`` among them once known)."""
        return self.tracking.tags

    def provide(self, **fields: Any) -> None:
        """Record provenance this stage computes itself (e.g. the explain stage's
        ``max_length``, a crowd import's ``simulated``); written into ``run.json``."""
        self.provenance = dataclasses.replace(self.provenance, **fields)
        new = {k: str(fields[k]) for k in ("dataset", "model") if fields.get(k) is not None}
        if fields.get("simulated"):
            new["simulated"] = "true"
        if new:
            self.set_tags(new)
        if self.is_main and self.run_id is not None:
            self.tracking.log_identity()
            self._write_run_json(status="RUNNING")

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
        run_checks.write_atomically(
            self.run_dir / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True)
        )
        self.tracking.start(uri, self.run_dir, self.fingerprint, self.run_inputs, self.extra_tags)
        self._write_run_json(status="RUNNING")
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.is_main:
            return
        seconds = time.perf_counter() - self._t0
        # stopped from outside (Ctrl-C, scancel's SIGTERM: saleval.errors.Stopped) is not
        # a failure of the stage: KILLED, as a run whose process died is marked later
        killed = exc_type is not None and not issubclass(exc_type, Exception)
        status = "KILLED" if killed else "FAILED" if exc_type else "FINISHED"
        journal = self.tracking.journal
        if exc is not None and journal is not None and journal.lost is None:
            cause = tracking_health.store_failure(exc)
            if cause is not None:  # the store failed outside saleval's logging: end quickly
                journal.lost = cause
        if exc_type is None:
            self.tracking.recover()  # the store back after an outage: send what it missed
            self.tracking.keep_direct_metrics()  # e.g. Lightning's curves, into the run dir
        failure = exc
        try:
            if not exc_type:
                tracking.log_metrics({"stage_seconds": seconds})
                tracking.log_files([self.run_dir / "config.yaml"])
                self._write_run_json(status=status, seconds=seconds)
                tracking.log_files([self.run_dir / RUN_JSON])
            else:
                self._write_run_json(status=status, seconds=seconds, error=repr(exc))
        except Exception as err:
            if exc_type is not None:
                # a second failure (the disk is full, say) must not hide the first one
                log.warning("%s: could not record the run's end: %s", self.run_dir, err)
            else:  # the work is done but its record could not be written: not FINISHED
                status, failure = "FAILED", err
                with contextlib.suppress(Exception):
                    self._write_run_json(status=status, seconds=seconds, error=repr(err))
                raise
        finally:
            if self.run_id is not None:
                self._end(status, seconds, failure)
        if not exc_type and not self.tracking.nested:  # saleval-run prints its own summary
            root = OmegaConf.select(self.cfg, "paths.output_root", default=None)
            run_record.link_latest(root, self.stage, self.run_dir)
            print(self.summary(), flush=True)
            missed = self.tracking.record() or {}
            if not missed.get("logged", True):
                print(run_record.not_logged_line(self.stage, self.run_dir, missed), flush=True)

    def _end(self, status: str, seconds: float, exc: Any) -> None:
        """End the MLflow run; when its store missed part of the run, ``run.json`` then says
        what (its ``tracking`` record), the work being complete on disk."""
        try:
            self.tracking.end(status)
        except Exception as err:
            if exc is None:
                raise
            log.warning("%s: could not end its MLflow run: %s", self.run_dir, err)
        record = self.tracking.record()
        if record is not None and record != self._recorded:
            try:
                extra = (
                    {"seconds": seconds}
                    if exc is None
                    else {"seconds": seconds, "error": repr(exc)}
                )
                self._write_run_json(status=status, **extra)
            except OSError as err:
                log.warning("%s: could not record what was not logged: %s", self.run_dir, err)

    def summary(self) -> str:
        """Where the run went and the command(s) that take it further (run_record.summary)."""
        known = {"run": str(self.run_dir), **{k: str(p) for k, p in self.inputs.items()}}
        if "checkpoint" in self.extra_tags:
            known.setdefault("model", self.extra_tags["checkpoint"])
        t = self.tracking
        return run_record.summary(self.stage, self.run_dir, t.run_id, known,
                                  t.experiment_id, t.view, t.tags.get("sweep"))  # fmt: skip

    def _write_run_json(self, **extra: Any) -> None:
        """``run.json`` (:func:`saleval.pipeline.run_record.write_run_json`) with the checksum
        of every table written so far and what its tracking store has taken."""
        run_record.write_run_json(
            self.run_dir, self.stage, self.run_id, self.fingerprint, self.run_inputs,
            self.provenance, self.tracking.view,
            checksums=run_checks.table_checksums(self.run_dir, self._tables),
            tracking=self.tracking.record(), **extra,
        )  # fmt: skip
        self._recorded = self.tracking.record()

    # -- inputs -------------------------------------------------------------------
    def read(self, spec: TableSpec, name: str) -> pd.DataFrame:
        """``spec``'s table of ``inputs.<name>``, merged over its runs (:meth:`RunInputs.read`)."""
        return self.run_inputs.read(spec, name)

    def runs_of(self, name: str) -> list[tuple[Path, dict[str, Any], DictConfig]]:
        """Every run behind ``inputs.<name>``: (run dir, run.json, config.yaml)."""
        return self.run_inputs.runs_of(name)

    # -- outputs ------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.run_dir / name

    def write(self, spec: TableSpec, df: pd.DataFrame) -> Path:
        """Validate, write into the run dir (its checksum goes into ``run.json``), and log
        the table as an artifact."""
        if not self.is_main:  # a DDP rank > 0: rank 0 writes the same table
            return spec.path(self.run_dir)
        path = spec.write(df, self.run_dir)
        self._tables.append(spec.filename)
        if self.run_id is not None:  # the record follows what is on disk, table by table
            self._write_run_json(status="RUNNING")
        tracking.log_files([path])
        return path

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.is_main:
            tracking.log_files([path], artifact_path)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int | None = None, **kwargs: Any
    ) -> None:
        """Into the stage run (keys: :func:`saleval.pipeline.run_naming.metric_key`); ``kwargs``:
        MLflow's ``model_id``/``dataset``."""
        if self.is_main:
            tracking.log_metrics(metrics, step=step, **kwargs)

    def log_methods(self, methods: Sequence[str]) -> None:
        """The saliency methods this run is about (:meth:`StageTracking.log_methods`)."""
        self.tracking.log_methods(methods)

    def log_method_rows(self, rows: pd.DataFrame, **kw: Any) -> dict[str, str]:
        """One child run per method and a saved view (:meth:`StageTracking.log_method_rows`)."""
        return self.tracking.log_method_rows(rows, **kw) if self.is_main else {}

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags.get("simulated") == "true" and not self.provenance.simulated:
            self.provenance = dataclasses.replace(self.provenance, simulated=True)
        self.tracking.set_tags(tags)
