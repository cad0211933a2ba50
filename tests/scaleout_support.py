"""Helpers for the tests that run sweeps on real engines (SLURM, Ray, a PostgreSQL-backed
MLflow server): docs/scale-out.md, walked by ``tests/test_scaleout_page.py``.

Those tests need system packages and root. Off CI they skip, naming the command that
installs what is missing; on CI (``CI`` set, as ``.ci/run`` runs) a missing piece fails
instead, so the suite can never pass there by skipping them.
"""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from tests.test_scaleout import _env

__all__ = ["on_ci", "require", "runs_of", "subprocess_env"]


def on_ci() -> bool:
    return bool(os.environ.get("CI"))


def require(missing: str | None) -> None:
    """Skip (off CI) or fail (on CI) with ``missing``, the one-line reason, when not None."""
    if missing is None:
        return
    if on_ci():
        pytest.fail(f"CI must run this test: {missing}")
    pytest.skip(missing)


def subprocess_env(tracking_uri: str | None = None, **extra: str) -> dict[str, str]:
    """The environment a console script gets: this one, MLflow at ``tracking_uri``, one
    thread per process (two cores run two jobs), and ``extra``."""
    env = _env(tracking_uri)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def runs_of(client: MlflowClient, filter_string: str = "") -> list:
    """Every run of every experiment of ``client``'s store that matches ``filter_string``."""
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, filter_string=filter_string, max_results=1000) if exps else []
