"""Helpers for the annotation app tests: a served task run, Chromium.

Task runs come from :func:`saleval.testing.make_task_run` (the real ``saleval-tasks``
stage on a synthetic explain run); building one starts MLflow runs, so tests that call
:func:`served_app` use the ``mlflow_uri`` fixture. Browser tests drive Debian's ``chromium`` (``apt-get install -y chromium``) through
Playwright for Python, never a browser that Playwright downloads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from saleval.annotate.app import background_server, create_app
from saleval.annotate.study import Study, load_study
from saleval.config.annotate import AnnotateConfig
from saleval.schema import to_schema
from saleval.testing import make_task_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "admin-token-for-tests"


def settings(db: Path, **fields: Any) -> AnnotateConfig:
    """The ``annotate`` node an app is built from, as a test gives it: its database, the
    tests' admin token, and ``fields`` (any other ``annotate.*`` setting)."""
    return AnnotateConfig(db=str(db), admin_token=TOKEN, **fields)


needs_chromium = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason="/usr/bin/chromium absent: apt-get install -y chromium (CI installs it in .ci/run)",
)


@dataclass
class Served:
    url: str
    app: Any
    study: Study
    tasks_dir: Path
    db: Path


@contextmanager
def served_app(
    root: Path, n_bundles: int = 3, bundle_size: int = 5, **fields: Any
) -> Iterator[Served]:
    """A fresh task run and database under ``root``, served from a thread on loopback."""
    tasks_dir = make_task_run(root / "tasks", n_bundles=n_bundles, bundle_size=bundle_size)
    db = root / "annotations.sqlite"
    study = load_study(tasks_dir)
    app = create_app(study, settings(db, **fields))
    try:
        with background_server(app) as url:
            yield Served(url, app, study, tasks_dir, db)
    finally:
        app.state.store.close()


def launch_chromium(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


class Clock:
    """A store clock the test moves: answer times, leases and the pilot's medians become
    exact (``store.clock = clock``)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)

    def __call__(self) -> Any:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


PAID = {
    "comprehension": {"enabled": True, "attempts": 2, "return_code": "SCREEN01"},
    "pay": {"seconds_per_task": 30.0, "hourly_rate": 12.0, "fee": 0.25, "gold_bonus": 0.05},
}
"""The paid-study settings the tests serve with (``annotate.*`` as the config gives them)."""


def paid_settings(db: Path, **fields: Any) -> AnnotateConfig:
    """:func:`settings` with :data:`PAID` (typed, as ``to_schema`` builds them), then
    ``fields`` over them."""
    node = OmegaConf.merge(OmegaConf.structured(AnnotateConfig), PAID, fields)
    node.db, node.admin_token = str(db), TOKEN
    return to_schema(AnnotateConfig, node)


def gold_truth(study: Study) -> dict[tuple[str, int], str | None]:
    """(bundle, position) -> the right label of a gold question, None for other tasks."""
    out: dict[tuple[str, int], str | None] = {}
    for r in study.bundles.itertuples(index=False):
        label = study.label_names[int(study.tasks.at[r.task_id, "label"])]
        out[(str(r.bundle_id), int(r.position))] = label if bool(r.is_gold) else None
    return out


def wrong_label(study: Study, right: str) -> str:
    return next(n for n in study.label_names if n != right)
