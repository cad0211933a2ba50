"""The stage contract (docs/architecture.md) in one place.

Every stage module defines ``run(cfg) -> dict`` (tests call it) and
``main = hydra_main("<config name>", run)`` (the console script; ``saleval-<stage>`` runs it
through :mod:`saleval.cli`, which imports the module only when the job starts). Inside ``run``::

    with Stage(cfg, "score", inputs={"crowd": cfg.inputs.crowd}) as st:
        df = tables.AGGREGATED.read(st.inputs["crowd"])
        st.write(tables.SCORES, scores)        # writes into the run dir and logs it
        st.log_metrics({...})

``Stage`` first reads its parent runs through :class:`saleval.run_inputs.RunInputs`
(``inputs.<name>`` resolved, each parent's ``config.yaml`` and ``run.json`` read once, the
one provenance rule applied; ``st.read`` merges the tables of an input that names several
runs), then owns the run's lifecycle: it writes the resolved config and ``run.json`` (run
id, fingerprint, parents, provenance) into the run dir, starts an MLflow run (nested under
an active pipeline run), tags it (with the host, pid and pid start time that let a later
stage tell it died), and always ends it, marking it FAILED on an exception; before
starting, it marks KILLED the RUNNING runs of this host
whose process is gone (:func:`saleval.tracking.end_dead_runs`). In the extra processes of a multi-process
(DDP) job it does none of this (:func:`is_main_process`): one run dir, one MLflow run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import mlflow
import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import stage_table, tracking
from saleval.cli import hydra_main as hydra_main  # the stages' `main`; see saleval.cli
from saleval.provenance import Provenance
from saleval.run_inputs import LATEST as LATEST
from saleval.run_inputs import PRODUCERS as PRODUCERS
from saleval.run_inputs import RUN_JSON as RUN_JSON
from saleval.run_inputs import InputError as InputError
from saleval.run_inputs import RunInputs as RunInputs
from saleval.run_inputs import given_input as given_input
from saleval.run_inputs import latest_link as latest_link
from saleval.run_inputs import read_run_config as read_run_config
from saleval.run_inputs import read_run_info as read_run_info
from saleval.run_inputs import resolve_input as resolve_input
from saleval.run_inputs import resolve_inputs as resolve_inputs
from saleval.run_inputs import run_or_checkpoint as run_or_checkpoint
from saleval.tables import TableSpec

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


def _run_dir_of(cfg: DictConfig) -> Path:
    explicit = cfg.get("run_dir")
    if explicit:
        return Path(str(explicit))
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    raise ValueError("no run dir: set run_dir=<path> when calling a stage outside Hydra")


class Stage:
    """One stage run's lifecycle: run dir, run.json, MLflow run, table writing; what it
    reads comes from its :class:`RunInputs` (``st.inputs``, ``st.parents``, ``st.read``)."""

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
        self.cfg = cfg
        self.stage = stage
        self.run_dir = _run_dir_of(cfg).resolve()
        #: the parent runs, read once, and the provenance they give (saleval.run_inputs)
        self.run_inputs = RunInputs(
            cfg, stage, inputs, inherits, requires, (tags or {}).get("simulated") == "true"
        )
        ri = self.run_inputs
        self.input_runs, self.inputs, self.parents = ri.input_runs, ri.inputs, ri.parents
        self.parent_configs, self.parent_provenance = ri.parent_configs, ri.parent_provenance
        #: the run's provenance: the parents' (:class:`RunInputs`), then what it provides
        self.provenance: Provenance = ri.provenance
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(resolved, dict)
        # a stage config's keys are str
        self.resolved: dict[str, Any] = cast(dict[str, Any], resolved)
        self.fingerprint = stage_fingerprint(cfg, stage, ri.runs, ri.infos, self.resolved)
        self.extra_tags = dict(tags or {})
        self.run_id: str | None = None
        #: the saved MLflow view of this run's per-method rows (tracking.save_view)
        self.view: str | None = None
        self.tags: dict[str, str] = {}
        #: False in a DDP rank > 0: the context then writes and logs nothing
        self.is_main = is_main_process()
        self._t0 = 0.0
        self._started_here = False
        self._nested = False
        #: the saliency methods the run is about (:meth:`log_methods`)
        self.methods: list[str] | None = None
        self.experiment_id: str | None = None
        self._params: dict[str, str] = {}  # the identity params logged so far
        self._name: str | None = None  # the run name given to MLflow

    def provide(self, **fields: Any) -> None:
        """Record provenance this stage computes itself (e.g. the explain stage's
        ``max_length``, a crowd import's ``simulated``); written into ``run.json``."""
        self.provenance = dataclasses.replace(self.provenance, **fields)
        if fields.get("simulated"):
            self.set_tags({"simulated": "true"})
        for key in ("dataset", "model"):
            if fields.get(key) is not None:
                self.set_tags({key: str(fields[key])})
        if self.is_main and self.run_id is not None:
            self._log_identity()
            self._write_run_json(status="RUNNING")

    # -- context ------------------------------------------------------------------
    def __enter__(self) -> Stage:
        if not self.is_main:  # a DDP rank > 0: rank 0 owns the run dir and the MLflow run
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # the store actually used (MLFLOW_TRACKING_URI wins), in config.yaml and the params
        uri = tracking.tracking_uri(OmegaConf.select(self.cfg, "tracking.uri", default=None))
        if OmegaConf.select(self.cfg, "tracking", default=None) is not None:
            with open_dict(self.cfg):
                self.cfg.tracking.uri = uri
            self.resolved["tracking"]["uri"] = uri
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg, resolve=True))
        dataset = str(self.provenance.dataset or "none")
        model = str(self.provenance.model or "none")
        experiment = str(
            OmegaConf.select(self.cfg, "tracking.experiment", default=None) or f"saleval/{dataset}"
        )
        self.experiment_id = tracking.setup(
            uri, experiment, OmegaConf.select(self.cfg, "tracking.artifact_root", default=None)
        )
        tags = {
            "stage": self.stage,
            "dataset": dataset,
            "model": model,
            "run_dir": str(self.run_dir),
            "fingerprint": self.fingerprint,
            **tracking.process_tags(),  # host, pid, pid_start: tells a dead run later
            **{f"parent.{k}": str(v.get("run_id", "")) for k, v in self.run_inputs.infos.items()},
            **{f"parent_dir.{k}": str(p) for k, p in self.run_inputs.runs.items()},
            **self.extra_tags,
        }
        tags.update(_sweep_tags())
        if self.provenance.simulated:
            tags["simulated"] = "true"
        nested = mlflow.active_run() is not None
        self._nested = nested
        if not nested:  # inside saleval-run, the pipeline did this when it started
            tracking.end_dead_runs()
        self._name = self.run_name()
        run = mlflow.start_run(run_name=self._name, nested=nested, tags=tags)
        self._started_here = True
        self.run_id = run.info.run_id
        self.tags = tags
        # a sweep job's overrides add what it varies; the resolved values win where both
        # name a key (MLflow refuses a param logged twice with different strings)
        swept = tracking.override_params(_sweep_overrides())
        tracking.log_params({**swept, **tracking.stage_params(self.stage, self.resolved, uri)})
        self._log_identity()
        self._write_run_json(status="RUNNING")
        self._t0 = time.perf_counter()
        return self

    # -- what ran: run name, params dataset/model/methods ------------------------------
    def run_name(self) -> str:
        """``tracking.run_name`` when given, else what ran (:func:`saleval.tracking.run_name`)."""
        given = OmegaConf.select(self.cfg, "tracking.run_name", default=None)
        if given:
            return str(given)
        p = self.provenance
        return tracking.run_name(self.stage, p.dataset, p.model, self.methods, bool(p.simulated))

    def log_methods(self, methods: Sequence[str]) -> None:
        """The saliency methods this run is about: the ``methods`` param, and the run name."""
        self.methods = [str(m) for m in methods]
        self._log_identity()

    def _log_identity(self) -> None:
        """Params ``dataset``, ``model``, ``methods`` once known (a param never changes),
        and the run name brought up to date."""
        if not self.is_main or self.run_id is None:
            return
        known = {
            "dataset": self.provenance.dataset,
            "model": self.provenance.model,
            "methods": ",".join(self.methods) if self.methods else None,
        }
        new = {k: str(v) for k, v in known.items() if v is not None and k not in self._params}
        if new:
            tracking.log_params(new)
            self._params.update(new)
        name = self.run_name()
        if name != self._name:
            mlflow.tracking.MlflowClient().update_run(self.run_id, name=name)
            self._name = name

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.is_main:
            return
        seconds = time.perf_counter() - self._t0
        status = "FAILED" if exc_type else "FINISHED"
        try:
            if not exc_type:
                tracking.log_metrics({"stage_seconds": seconds})
                self._write_run_json(status=status, seconds=seconds)
                tracking.log_files([self.run_dir / "config.yaml", self.run_dir / RUN_JSON])
            else:
                self._write_run_json(status=status, seconds=seconds, error=repr(exc))
        finally:
            if self._started_here:
                mlflow.end_run(status=status)
        if not exc_type and not self._nested:  # saleval-run prints its own summary
            self._link_latest()
            print(self.summary(), flush=True)

    def _link_latest(self) -> None:
        """Point ``<output root>/<stage>/latest`` at this run, when it lies there."""
        root = OmegaConf.select(self.cfg, "paths.output_root", default=None)
        if root is None:
            return
        link = latest_link(root, self.stage)
        if link.parent.resolve() not in self.run_dir.parents:
            return  # a run dir elsewhere (tests, run_dir=...) is not "the latest" of outputs/
        tmp = link.with_name(f".{LATEST}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(self.run_dir, target_is_directory=True)
        os.replace(tmp, link)  # atomic: a reader never sees no link

    def summary(self) -> str:
        """Where the run went and the command(s) that take it further, paths filled in."""
        known = {"run": str(self.run_dir), **{k: str(p) for k, p in self.inputs.items()}}
        if "checkpoint" in self.extra_tags:
            known.setdefault("model", self.extra_tags["checkpoint"])
        lines = [
            f"[saleval-{self.stage}] finished: {self.run_dir}",
            f"  MLflow run {self.run_id} in {mlflow.get_tracking_uri()}",
        ]
        if self.experiment_id is not None:
            hint = tracking.ui_hint(mlflow.get_tracking_uri(), self.experiment_id, self.view)
            lines.append(f"  open: {hint}")
        for template in stage_table.next_steps(self.stage):
            command = template
            for key in ("run", "model", "tasks"):
                command = command.replace("{" + key + "}", known.get(key, LATEST))
            lines.append(f"  next: {command}")
        sweep = self.tags.get("sweep")
        names = [n for n, s in PRODUCERS.items() if s == self.stage]
        if sweep and names:  # a -m job: the whole sweep can be the next stage's input
            lines.append(f"  sweep: all its jobs as one input: inputs.{names[0]}={sweep}")
        return "\n".join(lines)

    def _write_run_json(self, **extra: Any) -> None:
        info = {
            "stage": self.stage,
            "run_id": self.run_id,
            "tracking_uri": mlflow.get_tracking_uri(),
            "fingerprint": self.fingerprint,
            "parents": {k: v.get("run_id") for k, v in self.run_inputs.infos.items()},
            "parent_dirs": {k: str(p) for k, p in self.run_inputs.runs.items()},
            "simulated": "true" if self.provenance.simulated else "false",
            "provenance": self.provenance.to_json(),
            # which machine and process ran it: jobs of a parallel multirun or a cluster differ
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **({"mlflow_view": self.view} if self.view else {}),
            **extra,
        }
        (self.run_dir / RUN_JSON).write_text(json.dumps(info, indent=2))

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
        """Validate, write into the run dir, and log the table as an artifact."""
        if not self.is_main:  # a DDP rank > 0: rank 0 writes the same table
            return spec.path(self.run_dir)
        path = spec.write(df, self.run_dir)
        mlflow.log_artifact(str(path))
        return path

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.is_main:
            tracking.log_files([path], artifact_path)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int | None = None, **kwargs: Any
    ) -> None:
        """Into the stage run (keys: :func:`saleval.tracking.metric_key`); ``kwargs``:
        MLflow's ``model_id``/``dataset``."""
        if self.is_main:
            tracking.log_metrics(metrics, step=step, **kwargs)

    def log_method_rows(
        self,
        rows: pd.DataFrame,
        table: str | None = None,
        key: str = tracking.METHOD,
        order_by: str | None = None,
        ascending: bool = False,
    ) -> dict[str, str]:
        """One nested child run per method (:func:`saleval.tracking.log_method_rows`),
        tagged with this run's dataset, model and ``simulated``, with the method's own
        settings from the ``method`` group as params (:func:`saleval.tracking.method_settings`);
        the rows' methods become the run's ``methods`` when not given yet. A saved MLflow
        view shows the rows side by side (:func:`saleval.tracking.save_view`), sorted by
        ``order_by`` (default: ``human_score`` where there is one, else the first numeric
        column); the printed link opens it. ``key``: the column that names the rows when
        they are not methods (saleval-plan: ``design``). Returns row name → child run id."""
        if not self.is_main or self.run_id is None:
            return {}
        if self.methods is None and key == tracking.METHOD:
            self.log_methods(rows[key].astype(str).tolist())
        keep = ("dataset", "model", "simulated")
        tags = {k: v for k, v in self.tags.items() if k in keep}
        params = {k: v for k, v in self._params.items() if k in ("dataset", "model")}
        settings = tracking.method_settings(self.resolved.get("method"))
        ids = tracking.log_method_rows(
            rows, self.stage, table=table, tags=tags, params=params, settings=settings, key=key
        )
        # the printed link opens these rows side by side (docs/tracking.md#views)
        columns = [c for c in rows.columns if c != key and pd.api.types.is_numeric_dtype(rows[c])]
        columns.sort(key=lambda c: c != "human_score")  # the human score first, where there is one
        if self.experiment_id is not None and columns:
            self.view = tracking.save_view(
                self.experiment_id,
                self.run_id,
                self.run_name(),
                columns,
                order_by=order_by or columns[0],
                ascending=ascending,
            )
        return ids

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update(tags)
        if tags.get("simulated") == "true" and not self.provenance.simulated:
            self.provenance = dataclasses.replace(self.provenance, simulated=True)
        if self.is_main and self.run_id is not None:
            mlflow.set_tags(dict(tags))
            self._log_identity()


def _multirun() -> Any:
    """Hydra's config of this ``-m`` job (None outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get()


def _sweep_overrides() -> list[str]:
    """The overrides of this ``-m`` job ([] outside a multirun)."""
    hc = _multirun()
    return [] if hc is None else list(hc.overrides.task)


def _sweep_tags() -> dict[str, str]:
    """Group the jobs of one ``-m`` multirun: same sweep dir, job number, overrides."""
    hc = _multirun()
    if hc is None:
        return {}
    return {
        "sweep": str(hc.sweep.dir),
        "sweep.job": str(hc.job.num),
        "sweep.overrides": ",".join(hc.overrides.task)[:5000],
    }
