"""The MLflow side of one stage run (docs/tracking.md): the run started with what ran as its
name and tags, the identity params (``dataset``, ``model``, ``methods``) logged once known,
per-method child runs with a saved view, and the run ended with its status.

:class:`saleval.pipeline.stage.Stage` owns one :class:`StageTracking` (``st.tracking``); it
reads the run's provenance through a callable, since a stage may learn its model or
``simulated`` while it runs (``Stage.provide``), and the run's name, params and identity
tags (:func:`identity_tags`: ``dataset``, ``model``, ``simulated``) follow it: they are set
from the provenance only, never given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.pipeline import views
from saleval.pipeline.records import dead_runs, run_naming, run_outputs
from saleval.pipeline.records.provenance import Provenance
from saleval.pipeline.records.run_inputs import RunInputs
from saleval.pipeline.tracker import tracking, tracking_health, tracking_journal

#: the tags that say what a run is about, kept equal to its provenance (:func:`identity_tags`)
IDENTITY_TAGS = ("dataset", "model", "simulated")


def identity_tags(p: Provenance) -> dict[str, str]:
    """The tags a run's provenance gives it: ``dataset`` and ``model`` (``none`` while
    unknown), and ``simulated=true`` where a simulated crowd answered upstream.

    >>> identity_tags(Provenance(dataset="imdb", simulated=True))
    {'dataset': 'imdb', 'model': 'none', 'simulated': 'true'}
    """
    tags = {"dataset": str(p.dataset or "none"), "model": str(p.model or "none")}
    return tags | ({"simulated": "true"} if p.simulated else {})


class StageTracking:
    """One stage run in MLflow: start, name, params, tags, method rows, end."""

    def __init__(
        self,
        stage: str,
        cfg: DictConfig,
        resolved: dict[str, Any],
        provenance: Callable[[], Provenance],
    ) -> None:
        self.stage, self.cfg, self.resolved, self._provenance = stage, cfg, resolved, provenance
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        #: the saved MLflow view of this run's per-method rows (views.save_view)
        self.view: str | None = None
        self.tags: dict[str, str] = {}
        #: the saliency methods the run is about (:meth:`log_methods`)
        self.methods: list[str] | None = None
        self.nested = False  # inside saleval-run's pipeline run
        self._params: dict[str, str] = {}  # the identity params logged so far
        self._name: str | None = None  # the run name given to MLflow
        #: what the run sent to MLflow, kept in its run dir (tracking_journal)
        self.journal: tracking_journal.Journal | None = None

    def start(
        self,
        uri: str,
        run_dir: Path,
        fingerprint: str,
        parents: RunInputs,
        extra: Mapping[str, str],
    ) -> None:
        """Start the run (nested under an active pipeline run) in the config's experiment
        (default ``saleval/<dataset>``), tagged (:func:`run_tags`), with the stage's params
        and a ``-m`` job's overrides; first, outside a pipeline, end as KILLED the runs of
        this host whose process is gone (:func:`saleval.pipeline.records.dead_runs.end_dead_runs`).
        From here on, what the run logs is kept in its run dir too (its journal,
        :mod:`saleval.pipeline.tracker.tracking_journal`). A store that refuses or fails here, before
        any work, is one :class:`~saleval.pipeline.tracker.tracking_health.TrackingError` line."""
        p = self._provenance()
        experiment = str(
            OmegaConf.select(self.cfg, "tracking.experiment", default=None)
            or f"saleval/{p.dataset or 'none'}"
        )
        tags = run_tags(self.stage, identity_tags(p), run_dir, fingerprint, parents, extra)
        if p.unfinished:
            tags["unfinished_inputs"] = "; ".join(p.unfinished)[:5000]
        try:
            self.experiment_id = tracking.setup(
                uri, experiment, OmegaConf.select(self.cfg, "tracking.artifact_root", default=None)
            )
            self.nested = mlflow.active_run() is not None
            if not self.nested:  # inside saleval-run, the pipeline did this when it started
                dead_runs.end_dead_runs()
            self._name = self.run_name()
            self.journal = tracking.start_run(
                run_dir, uri, experiment, self._name, tags, nested=self.nested
            )
        except Exception as err:
            line = tracking_health.start_message(err, uri, experiment)
            if line is None:
                raise
            raise tracking_health.TrackingError(line) from err
        self.run_id = self.journal.target.run_id
        self.tags = tags
        # a sweep job's overrides add what it varies; the resolved values win where both
        # name a key (MLflow refuses a param logged twice with different strings)
        swept = run_naming.override_params(run_outputs.sweep_overrides())
        tracking.log_params({**swept, **run_naming.stage_params(self.stage, self.resolved, uri)})
        self.log_identity()

    def recover(self) -> None:
        """When the store failed during the run, ask it once more (within ``tracking.wait_s``
        seconds) and, if it answers now, send what it missed (:func:`tracking.recover`)."""
        if self.journal is not None and self.journal.lost is not None:
            wait = OmegaConf.select(self.cfg, "tracking.wait_s", default=None)
            tracking.recover(self.journal, None if wait is None else float(wait))

    def keep_direct_metrics(self) -> None:
        """Journal what reached the run without the journal (:func:`tracking.keep_direct_metrics`)."""
        if self.journal is not None:
            tracking.keep_direct_metrics(self.journal)

    def end(self, status: str) -> None:
        """End the run with ``status`` (:func:`tracking.end_run`)."""
        if self.journal is not None:
            tracking.end_run(self.journal, status)

    def record(self) -> dict[str, Any] | None:
        """What ``run.json`` says of the run's tracking (None before it starts)."""
        return None if self.journal is None else self.journal.record()

    def run_name(self) -> str:
        """``tracking.run_name`` when given, else what ran (:func:`saleval.pipeline.records.run_naming.run_name`)."""
        given = OmegaConf.select(self.cfg, "tracking.run_name", default=None)
        if given:
            return str(given)
        p = self._provenance()
        return run_naming.run_name(self.stage, p.dataset, p.model, self.methods, bool(p.simulated))

    def log_methods(self, methods: Sequence[str]) -> None:
        """The saliency methods this run is about: the ``methods`` param, and the run name."""
        self.methods = [str(m) for m in methods]
        self.log_identity()

    def log_identity(self) -> None:
        """Params ``dataset``, ``model``, ``methods`` once known (a param never changes),
        and the run name and identity tags brought up to date."""
        if self.run_id is None:
            return
        p = self._provenance()
        changed = {k: v for k, v in identity_tags(p).items() if self.tags.get(k) != v}
        if changed:
            self.tags.update(changed)
            tracking.set_tags(changed)
        methods = ",".join(self.methods) if self.methods else None
        known = {"dataset": p.dataset, "model": p.model, "methods": methods}
        new = {k: str(v) for k, v in known.items() if v is not None and k not in self._params}
        if new:
            tracking.log_params(new)
            self._params.update(new)
        name = self.run_name()
        if name != self._name:
            tracking.rename_run(name)
            self._name = name

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tag the run (and keep the tags for its child runs and summary); the identity
        tags are the provenance's (``Stage.provide``)."""
        given = sorted(set(tags) & set(IDENTITY_TAGS))
        if given:
            raise ValueError(
                f"set_tags: {', '.join(given)} follow the run's provenance: st.provide(...)"
            )
        self.tags.update(tags)
        if self.run_id is not None:
            tracking.set_tags(dict(tags))
            self.log_identity()

    def child_run(
        self, name: str, tags: Mapping[str, str] | None = None
    ) -> AbstractContextManager[str | None]:
        """A child run of this run named ``<name> · <stage>``, active inside the block
        (:func:`saleval.pipeline.tracker.tracking.child_run`), tagged with this run's dataset, model
        and ``simulated`` as its method rows are, and ``tags``; nothing before the run
        starts (a DDP rank > 0)."""
        if self.run_id is None:
            return contextlib.nullcontext()
        identity = {k: v for k, v in self.tags.items() if k in IDENTITY_TAGS}
        return tracking.child_run(name, self.stage, {**identity, **(tags or {})})

    def log_method_rows(
        self,
        rows: pd.DataFrame,
        table: str | None = None,
        key: str = run_naming.METHOD,
        order_by: str | None = None,
        ascending: bool = False,
    ) -> dict[str, str]:
        """One nested child run per method (:func:`saleval.pipeline.tracker.tracking.log_method_rows`),
        tagged with this run's dataset, model and ``simulated``, with the method's own
        settings from the ``method`` group as params (:func:`saleval.pipeline.records.run_naming.method_settings`);
        the rows' methods become the run's ``methods`` when not given yet. A saved MLflow
        view shows the rows side by side (:func:`saleval.pipeline.views.save_view`), sorted by
        ``order_by`` (default: ``human_score`` where there is one, else the first numeric
        column); the printed link opens it (docs/tracking.md#views). ``key``: the column
        that names the rows when they are not methods (saleval-plan: ``design``). Returns
        row name → child run id."""
        if self.run_id is None:
            return {}
        if self.methods is None and key == run_naming.METHOD:
            self.log_methods(rows[key].astype(str).tolist())
        tags = {k: v for k, v in self.tags.items() if k in IDENTITY_TAGS}
        params = {k: v for k, v in self._params.items() if k in ("dataset", "model")}
        settings = run_naming.method_settings(self.resolved.get("method"))
        ids = tracking.log_method_rows(
            rows, self.stage, table=table, tags=tags, params=params, settings=settings, key=key
        )
        columns = views.rows_view_columns(rows, key)
        if self.experiment_id is not None and columns:
            self.view = (
                views.save_run_view(
                    self.run_name(), columns, order_by=order_by or columns[0], ascending=ascending
                )
                or self.view
            )
        return ids


def run_tags(
    stage: str,
    identity: Mapping[str, str],
    run_dir: Path,
    fingerprint: str,
    parents: RunInputs,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """A stage run's MLflow tags: what ran on what (``identity``: :func:`identity_tags`),
    its parents' run ids and dirs, the process (host, pid, pid start: tells a dead run
    later) and the ``-m`` sweep it is in."""
    return {
        "stage": stage,
        **identity,
        "run_dir": str(run_dir),
        "fingerprint": fingerprint,
        **dead_runs.process_tags(),
        **{f"parent.{k}": str(v.run_id or "") for k, v in parents.records.items()},
        **{f"parent_dir.{k}": str(p) for k, p in parents.runs.items()},
        **extra,
        **run_outputs.sweep_tags(),
    }
