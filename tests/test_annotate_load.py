"""Load on loopback: 50 concurrent simulated workers, zero lost or duplicated answers.

The smaller sibling of ``benchmarks/annotate_load.py`` (bundles of 4 instead of 20,
server in a thread), on the same driver (:mod:`saleval.testing.annotate_load`). Bounded: workers stop at a deadline and the server is stopped on
exit. Latency is printed, never asserted (no timed tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from saleval.annotate.store_db import LeasePolicy
from saleval.testing.annotate_load import run_load
from tests.annotate_support import TOKEN, served_app

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building the task run logs to MLflow


def test_fifty_concurrent_workers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    no_bound = LeasePolicy(max_claims=0)  # all 50 workers come from loopback
    with served_app(tmp_path, n_bundles=50, bundle_size=4, lease=no_bound) as srv:
        result = run_load(srv.url, TOKEN, n_workers=50, deadline_s=240, seed=7, resend_prob=0.25)
        stored = srv.app.state.store.answers(srv.study.run_key)
        progress = srv.app.state.store.progress(srv.study.run_key)
    summary = result.summary()
    print("annotate load:", summary)
    assert [w.error for w in result.workers if w.error] == []
    assert summary["sent"] == 50 * 4 == summary["exported"] == len(stored)
    assert summary["lost"] == summary["duplicated"] == summary["altered"] == 0
    assert summary["duplicated_tasks"] == summary["unexpected"] == 0
    assert summary["resends"] > 0  # re-sent answers were exercised and absorbed
    assert summary["completed"] == 50 and progress.completed_at.notna().all()
    assert progress.worker_id.nunique() == 50  # every worker got their own bundle
    codes = [w.completion_code for w in result.workers]
    assert set(codes) == set(progress.completion_code)


def test_attack_scenario_at_smoke_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attack round of ``benchmarks/annotate_load.py`` (two servers on one store,
    kill -9, short leases) at a size that runs in well under a minute."""
    from benchmarks import annotate_load

    # the benchmark points MLflow at its own temporary store; the session's comes back after
    monkeypatch.setenv("MLFLOW_TRACKING_URI", os.environ["MLFLOW_TRACKING_URI"])
    argv = ["--scenario", "attack", "--workers", "6", "--bundle-size", "4", "--think", "0.5"]
    argv += ["--kills", "2", "--kill-every", "1", "--lease-s", "2", "--leavers", "1"]
    rc = annotate_load.main([*argv, "--deadline", "90"])
    out = capsys.readouterr().out  # the stages print their summaries first
    summary = json.loads(out[out.index("\n{\n") + 1 :])
    print("attack smoke:", summary)
    assert rc == 0 and summary["problems"] == []
    assert summary["kills"] == 2 and summary["servers"] == 2
    assert summary["lost"] == summary["duplicated"] == summary["altered"] == 0
    assert summary["sent"] == summary["exported"] == summary["stored"] == summary["backed_up"] > 0
    assert summary["bundle_held_twice"] == summary["answers_after_release"] == 0
    assert summary["runs_left_running"] == 0
