"""``saleval-annotate``: serve a task run's bundles to people, or export the answers.

See docs/study-design.md#exports and docs/architecture.md.
``saleval-annotate inputs.tasks=<tasks run dir>`` (``action=serve``)
serves the bundles on ``annotate.host:annotate.port`` until stopped, then logs how many
answers came in. ``action=export`` writes ``answers.csv`` (``tables.ANSWERS``, the import
format), ``completions.csv`` and ``released.csv`` into its run dir and logs them; it only
reads the database, so an archived or read-only copy exports too. ``action=backup``
copies the live database with SQLite's online backup API. Serve and export share the
database ``annotate.db``; the admin token (from ``SALEVAL_ANNOTATE_TOKEN`` or
``annotate.admin_token_file``) never reaches the run dir or MLflow. See docs/annotate.md.

A paid study (docs/annotate.md#running-a-paid-study): ``annotate.phase=pilot`` serves the
first ``annotate.pilot.bundles`` as a pilot, whose export also writes ``pilot.json`` (and
with ``inputs.plan``, the plan's designs re-costed at its times); the main study takes
``inputs.pilot`` (the pilot's export run: its participants refused, its median time per
task the pay's). Every export writes ``participants.csv``, ``approvals.csv``,
``rejections.csv``, ``bonuses.csv`` and ``payments.json``; ``/admin/dashboard`` shows
the study live.

Main options: ``inputs.tasks``, ``inputs.pilot``, ``inputs.plan``, ``action`` (serve,
export, backup), ``annotate.host``, ``annotate.port``, ``annotate.db``,
``annotate.lease_minutes``, ``annotate.completion_url``, ``annotate.backup_to``,
``annotate.phase``, ``annotate.comprehension.*``, ``annotate.attention.*``,
``annotate.pay.*``.

Example::

    saleval-annotate inputs.tasks=latest annotate.port=8000
    saleval-annotate inputs.tasks=latest action=export
    saleval-annotate inputs.tasks=latest annotate.phase=pilot annotate.comprehension.enabled=true
"""

from __future__ import annotations

import copy
import json
import logging
import secrets
import sqlite3
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import uvicorn
from fastapi import FastAPI
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import paths
from saleval.annotate import dashboard, paid_export, policy
from saleval.annotate.app import create_app
from saleval.annotate.export import answers_frame, write_completions, write_released
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.store_db import StoreError
from saleval.annotate.study import Study, load_study, pilot_study
from saleval.config.annotate import (
    AnnotateAction,
    AnnotateConfig,
    AnnotateCrowdConfig,
    StudyPhase,
)
from saleval.errors import Stopped, sigterm_raises
from saleval.pipeline import tables
from saleval.pipeline.records.provenance import FIELDS
from saleval.pipeline.records.run_inputs import resolve_input
from saleval.pipeline.stage import Stage
from saleval.schema import to_schema

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def run(cfg: DictConfig) -> dict[str, Any]:
    action = AnnotateAction(cfg.action)  # validated when composed; tests may pass a string
    db = Path(str(cfg.annotate.db))
    if action == AnnotateAction.backup:
        return {"backup": str(backup(db, cfg.annotate.backup_to))}
    main_study = load_study(resolve_input("tasks", cfg.inputs.tasks, paths.output_root(cfg)))
    phase = StudyPhase(cfg.annotate.phase)
    study = (
        pilot_study(main_study, int(cfg.annotate.pilot.bundles))
        if phase == StudyPhase.pilot
        else main_study
    )
    token = admin_token(cfg.annotate) if action == AnnotateAction.serve else None
    if any("annotate.admin_token=" in arg for arg in sys.argv[1:]):
        log.warning(
            "annotate.admin_token on the command line lands in shell history and ps, and "
            "Hydra may rewrite it (1_2_3 → 123): use SALEVAL_ANNOTATE_TOKEN or "
            "annotate.admin_token_file (docs/annotate.md)"
        )
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):  # the token stays out of the record
        cfg.annotate.admin_token = None if cfg.annotate.admin_token is None else "<redacted>"
    # the dataset (and study) are the task set's: adopted by the provenance rule
    inputs = {k: OmegaConf.select(cfg, f"inputs.{k}") for k in ("tasks", "pilot", "plan")}
    if inputs["pilot"] is not None and phase == StudyPhase.pilot:
        raise ValueError(
            "inputs.pilot names a pilot for a main study; drop it with annotate.phase=pilot"
        )
    # every field from the task set; the pilot and the plan are read, never inherited from
    inherits = {f: ["tasks"] for f in FIELDS}
    with Stage(cfg, "annotate", inputs=inputs, inherits=inherits, requires=["dataset"]) as st:
        st.tracking.set_tags(
            {"annotate.action": str(action), "annotate.db": str(db), "annotate.phase": str(phase)}
        )
        pilot = read_pilot(st.inputs.get("pilot"))
        if action == AnnotateAction.export:
            return _export(st, db, study, main_study, pilot)
        app = build_app(study, cfg, token, pilot)
        settings: AnnotateConfig = app.state.settings
        host, port = settings.host, settings.port
        if host not in _LOOPBACK:
            log.warning("serving on %s, not loopback: put TLS in front of it", host)
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        print(
            f"saleval-annotate: {study.dataset} ({len(study.bundle_ids)} bundles) at {url}/",
            file=sys.stderr,
        )
        print(f"  admin view: {url}/admin", file=sys.stderr)
        if not token:
            print(f"  admin token (generated, not stored): {settings.admin_token}", file=sys.stderr)
        if study.phase == StudyPhase.pilot:
            print(f"  pilot: the first {len(study.bundle_ids)} bundles", file=sys.stderr)
        print(f"  dashboard: {url}/admin/dashboard", file=sys.stderr)
        hint = app.state.annotate.seconds_hint
        with dashboard.MetricsLogger(
            lambda: dashboard.figures(app.state.store, study, settings, hint),
            st.tracking.run_id,
            settings.dashboard.log_every_s,
        ):
            _serve(app, settings)
        served = _counts(app.state.store, study.run_key)
        app.state.store.close()
        st.log_metrics(served)
        return {"run_dir": str(st.run_dir), "run_id": st.tracking.run_id, **served}


def _export(
    st: Stage, db: Path, study: Study, main_study: Study, pilot: Pilot | None
) -> dict[str, Any]:
    """answers.csv (the rejected left out, ``export.exclude_rejected``), completions,
    releases and the paid study's files, from a read-only store."""
    if not db.is_file():
        raise FileNotFoundError(f"annotate.db={db}: no such database; serve first")
    store = AnnotationStore(db, readonly=True)  # an archived copy exports too
    try:
        if store.progress(study.run_key).empty:
            raise ValueError(
                f"annotate.db={db} holds no bundles of task set {study.run_key} "
                f"({study.tasks_dir}); was it served with another annotate.db?"
            )
        conf = to_schema(AnnotateConfig, st.cfg.annotate)
        paid = export_paid(st, store, study, main_study, conf, pilot)
        rejected = paid.table.loc[paid.table["decision"] == policy.Decision.reject]
        exclude = set(rejected["worker_id"]) if conf.export.exclude_rejected else set()
        df = answers_frame(store, study, conf.export.complete_only, exclude)
        path = st.write(tables.ANSWERS, df)
        st.log_file(write_completions(store, study, st.run_dir))
        st.log_file(write_released(store, study, st.run_dir))
        counts: dict[str, float] = {**_counts(store, study.run_key), **paid.metrics}
    except sqlite3.Error as err:
        raise StoreError(f"annotate.db={db}: {err}") from err
    finally:
        store.close()
    st.log_metrics({**counts, "n_exported": len(df)})
    log.info("wrote %s: %d answers from %d workers", path, len(df), df["worker_id"].nunique())
    return {
        "run_dir": str(st.run_dir),
        "run_id": st.tracking.run_id,
        "answers": str(path),
        **counts,
    }


def build_app(
    study: Study, cfg: DictConfig, token: str | None, pilot: Pilot | None = None
) -> FastAPI:
    """The app of a ``saleval-annotate`` config: its typed ``annotate`` and ``crowd`` nodes as
    they are, with ``token`` put back as the admin token (the record holds it redacted), or
    a random one when none was given; with a ``pilot``, its participants refused
    (``annotate.exclude_pilot``) and its median time per task the pay's."""
    settings = replace(
        to_schema(AnnotateConfig, cfg.annotate), admin_token=token or secrets.token_urlsafe(18)
    )
    excluded = pilot.workers if pilot is not None and settings.exclude_pilot else ()
    return create_app(
        study,
        settings,
        to_schema(AnnotateCrowdConfig, cfg.crowd),
        excluded=excluded,
        seconds_hint=pilot.seconds_per_task if pilot is not None else None,
    )


@dataclass(frozen=True)
class Pilot:
    """What a main study takes from its pilot's export run."""

    run_dir: Path
    workers: tuple[str, ...]
    seconds_per_task: float | None


def read_pilot(run_dir: Path | None) -> Pilot | None:
    """The pilot's participants and median time per task, from its export run."""
    if run_dir is None:
        return None
    people, report = run_dir / paid_export.PARTICIPANTS, run_dir / paid_export.PILOT
    if not people.is_file() or not report.is_file():
        raise ValueError(
            f"inputs.pilot={run_dir}: holds no {people.name} and {report.name}; pass the "
            "pilot's export run (saleval-annotate annotate.phase=pilot action=export)"
        )
    workers = pd.read_csv(people, dtype={"worker_id": str})["worker_id"].dropna()
    seconds = json.loads(report.read_text(encoding="utf-8")).get("median_task_s")
    return Pilot(run_dir, tuple(workers), None if seconds is None else float(seconds))


def export_paid(
    st: Stage,
    store: AnnotationStore,
    study: Study,
    main_study: Study,
    settings: AnnotateConfig,
    pilot: Pilot | None,
) -> paid_export.PaidExport:
    """The paid study's files (decisions, bulk files, totals; a pilot's report), logged."""
    records = policy.StudyRecords.read(store, study.run_key)
    hint = settings.pay.seconds_per_task
    if hint is None and pilot is not None:
        hint = pilot.seconds_per_task
    paid = paid_export.write_payments(st.run_dir, records, study, settings, hint)
    metrics = dict(paid.metrics)
    files = list(paid.files)
    if study.phase == StudyPhase.pilot:
        plan_dir = st.inputs.get("plan")
        plan_cfg = st.inputs.parent_configs.get("plan")
        report = paid_export.pilot_report(
            st.run_dir, records, study, main_study, settings, paid.table, plan_dir, plan_cfg
        )
        metrics |= report.metrics
        files += report.files
    for f in files:
        st.log_file(f)
    return paid_export.PaidExport(files, metrics, paid.table)


def _serve(app: FastAPI, settings: AnnotateConfig) -> None:
    """Run uvicorn until Ctrl-C or SIGTERM, then return so the stage logs and ends its run:
    stopping the server is how a study ends, so its run ends FINISHED.

    uvicorn shuts down gracefully on either signal and then re-raises it; Ctrl-C becomes
    KeyboardInterrupt and SIGTERM :class:`saleval.errors.Stopped`, both caught here.
    """
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=settings.access_log,
        )
    )
    try:
        with sigterm_raises():
            server.run()
    except (KeyboardInterrupt, Stopped):
        log.info("annotation server stopped")


def admin_token(annotate: DictConfig) -> str | None:
    """``annotate.admin_token`` (from ``SALEVAL_ANNOTATE_TOKEN``), else the first line of
    ``annotate.admin_token_file``; None: the server makes one up and prints it."""
    if annotate.admin_token:
        return str(annotate.admin_token)
    if not annotate.admin_token_file:
        return None
    path = Path(str(annotate.admin_token_file)).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(
            f"annotate.admin_token_file={path}: cannot be read ({err.strerror}); write the "
            "token into it (umask 077) or set SALEVAL_ANNOTATE_TOKEN"
        ) from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if len(token) < 8:
        raise ValueError(
            f"annotate.admin_token_file={path}: the token must be at least 8 characters "
            "on the first line"
        )
    return token


def backup(db: Path, dest: str | None) -> Path:
    """An online backup of the live database (the server may keep serving)."""
    if not dest:
        raise ValueError("action=backup needs annotate.backup_to=<file to write>")
    if not db.is_file():
        raise FileNotFoundError(f"annotate.db={db}: no such database")
    store = AnnotationStore(db, readonly=True)
    try:
        out = store.backup(dest)
    finally:
        store.close()
    print(f"saleval-annotate: backed up {db} to {out}", file=sys.stderr)
    return out


def _counts(store: AnnotationStore, run_key: str) -> dict[str, int]:
    progress = store.progress(run_key)
    return {
        "n_bundles": len(progress),
        "n_bundles_assigned": int(progress["worker_id"].notna().sum()),
        "n_bundles_completed": int(progress["completed_at"].notna().sum()),
        "n_bundles_released": len(store.released(run_key)),
        "n_answers": store.n_answers(run_key),
    }
