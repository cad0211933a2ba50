"""Load on loopback: 50 concurrent simulated workers, zero lost or duplicated answers.

The smaller sibling of ``benchmarks/annotate_load.py`` (bundles of 4 instead of 20,
server in a thread), through the same driver (:func:`saleval.testing.annotate_load.drive`).
Bounded: workers stop at a deadline and the servers are stopped on exit. Latency is
printed, never asserted (no timed tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from saleval.annotate.store_answers import AnnotationStore
from saleval.testing.annotate_load import LoadSettings, drive


def test_fifty_concurrent_workers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    settings = LoadSettings(
        workers=50, bundle_size=4, in_process=True, deadline=240, seed=7, resend_prob=0.25
    )
    report = drive(settings, tmp_path)
    summary, result = report.summary, report.result
    print("annotate load:", summary)
    assert report.problems == []
    assert [w.error for w in result.workers if w.error] == []
    store = AnnotationStore(report.db, readonly=True)
    try:
        stored = store.answers(report.run_key)
        progress = store.progress(report.run_key)
    finally:
        store.close()
    assert summary["sent"] == 50 * 4 == summary["exported"] == len(stored)
    assert summary["lost"] == summary["duplicated"] == summary["altered"] == 0
    assert summary["duplicated_tasks"] == summary["unexpected"] == 0
    assert summary["resends"] > 0  # re-sent answers were exercised and absorbed
    assert summary["completed"] == 50 and progress.completed_at.notna().all()
    assert progress.worker_id.nunique() == 50  # every worker got their own bundle
    codes = [w.completion_code for w in result.workers]
    assert set(codes) == set(progress.completion_code)


def test_attack_scenario_at_smoke_size(tmp_path: Path) -> None:
    """The attack round (two servers on one store, kill -9, short leases) at a size that
    runs in well under a minute."""
    settings = LoadSettings(
        scenario="attack", workers=6, bundle_size=4, think=0.5, kills=2, kill_every=1,
        lease_s=2, leavers=1, deadline=90,
    )  # fmt: skip
    summary = drive(settings, tmp_path).summary
    print("attack smoke:", summary)
    assert summary["problems"] == []
    assert summary["kills"] == 2 and summary["servers"] == 2
    assert summary["lost"] == summary["duplicated"] == summary["altered"] == 0
    assert summary["sent"] == summary["exported"] == summary["stored"] == summary["backed_up"] > 0
    assert summary["bundle_held_twice"] == summary["answers_after_release"] == 0
    assert summary["runs_left_running"] == 0


@pytest.mark.parametrize(
    "settings,problem",
    [
        (LoadSettings(scenario="diskfull"), "diskfull needs in_process"),
        (LoadSettings(scenario="attack", in_process=True), "attack needs servers in their own"),
        (LoadSettings(scenario="attack", bundle_size=2), "bundle_size of at least 3"),
        (LoadSettings(scenario="flood"), "scenario 'flood': choose one of"),
    ],
)
def test_settings_that_cannot_run_are_one_line(settings: LoadSettings, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        drive(settings)


def test_the_benchmark_is_a_command_line_over_the_driver(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its flags are the driver's settings: a bad combination is refused by the driver's
    own check, before anything starts."""
    from benchmarks import annotate_load

    with pytest.raises(SystemExit):
        annotate_load.main(["--scenario", "diskfull"])
    assert "diskfull needs in_process" in capsys.readouterr().err
