"""``saleval-annotate``: serve a task run's bundles to people, or export the answers.

SPEC §4 and §9.1. ``saleval-annotate inputs.tasks=<tasks run dir>`` (``action=serve``)
serves the bundles on ``annotate.host:annotate.port`` until stopped, then logs how many
answers came in. ``action=export`` writes ``answers.csv`` (``tables.ANSWERS``, the import
format) and ``completions.csv`` into its run dir and logs both. Serve and export share
the database ``annotate.db``; the admin token never reaches the run dir or MLflow.

Main options: ``inputs.tasks``, ``action`` (serve, export), ``annotate.host``,
``annotate.port``, ``annotate.db``, ``annotate.admin_token``.

Example::

    saleval-annotate inputs.tasks=latest annotate.port=8000
    saleval-annotate inputs.tasks=latest action=export
"""

from __future__ import annotations

import copy
import logging
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import uvicorn
from omegaconf import DictConfig, open_dict

from saleval import tables
from saleval.annotate.app import AppSettings, create_app
from saleval.annotate.export import answers_frame, write_completions
from saleval.annotate.store import AnnotationStore
from saleval.annotate.study import load_study
from saleval.config.annotate import AnnotateAction
from saleval.stage import Stage, hydra_main, resolve_input

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def run(cfg: DictConfig) -> dict[str, Any]:
    action = AnnotateAction(cfg.action)  # validated when composed; tests may pass a string
    study = load_study(resolve_input("tasks", cfg.inputs.tasks))
    token = cfg.annotate.admin_token
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):  # the token stays out of the record
        cfg.annotate.admin_token = None if token is None else "<redacted>"
    db = Path(str(cfg.annotate.db))
    # the dataset (and study) are the task set's: adopted by the provenance rule
    with Stage(cfg, "annotate", inputs={"tasks": cfg.inputs.tasks}, requires=["dataset"]) as st:
        st.set_tags({"annotate.action": str(action), "annotate.db": str(db)})
        if action == AnnotateAction.export:
            if not db.is_file():
                raise FileNotFoundError(f"annotate.db={db}: no such database; serve first")
            store = AnnotationStore(db, synchronous=str(cfg.annotate.synchronous))
            try:
                if store.progress(study.run_key).empty:
                    raise ValueError(
                        f"annotate.db={db} holds no bundles of task set {study.run_key} "
                        f"({study.tasks_dir}); was it served with another annotate.db?"
                    )
                df = answers_frame(store, study, bool(cfg.annotate.export.complete_only))
                path = st.write(tables.ANSWERS, df)
                st.log_file(write_completions(store, study, st.run_dir))
                counts = _counts(store, study.run_key)
            finally:
                store.close()
            st.log_metrics({**counts, "n_exported": len(df)})
            log.info(
                "wrote %s: %d answers from %d workers", path, len(df), df["worker_id"].nunique()
            )
            return {"run_dir": str(st.run_dir), "run_id": st.run_id, "answers": str(path), **counts}

        settings = AppSettings(
            db_path=db,
            admin_token=str(token) if token else secrets.token_urlsafe(18),
            title=cfg.annotate.title,
            completion_code=cfg.annotate.completion_code,
            synchronous=str(cfg.annotate.synchronous),
            secure_cookies=bool(cfg.annotate.secure_cookies),
        )
        app = create_app(study, settings)
        host, port = str(cfg.annotate.host), int(cfg.annotate.port)
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
        _serve(app, host, port, str(cfg.annotate.log_level), bool(cfg.annotate.access_log))
        counts = _counts(app.state.store, study.run_key)
        app.state.store.close()
        st.log_metrics(counts)
        return {"run_dir": str(st.run_dir), "run_id": st.run_id, **counts}


class _Stopped(Exception):
    """SIGTERM: end the study like Ctrl-C does."""


def _serve(app: Any, host: str, port: int, log_level: str, access_log: bool) -> None:
    """Run uvicorn until Ctrl-C or SIGTERM, then return so the stage logs and ends its run.

    uvicorn shuts down gracefully on either signal and then re-raises it; Ctrl-C becomes
    KeyboardInterrupt and SIGTERM reaches the handler installed here, both caught below.
    """

    def on_term(signum: int, frame: Any) -> None:
        raise _Stopped

    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log)
    )
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        server.run()
    except (KeyboardInterrupt, _Stopped):
        log.info("annotation server stopped")
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _counts(store: AnnotationStore, run_key: str) -> dict[str, int]:
    progress = store.progress(run_key)
    return {
        "n_bundles": len(progress),
        "n_bundles_assigned": int(progress["worker_id"].notna().sum()),
        "n_bundles_completed": int(progress["completed_at"].notna().sum()),
        "n_answers": int(progress["n_answered"].sum()),
    }


main = hydra_main("annotate", run)
