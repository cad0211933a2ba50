"""The annotation app under load, one driver: a scenario, its servers and workers, the checks.

``benchmarks/annotate_load.py`` is a command line over :func:`drive`, and
``tests/test_annotate_load.py`` calls it at smoke sizes, so both run the same drill.
Every scenario ends with the same check: the answers exported through the admin view
equal, one for one, the answers the simulated workers saw acknowledged (HTTP 303): zero
lost, zero duplicated, zero altered (:meth:`LoadResult.check`), plus what the scenario
itself promises (:func:`invariant_problems`). The scenarios (docs/annotate.md,
*Checking the guarantees*):

* ``load``: N concurrent workers; latency per answer and throughput;
* ``kill``: the server is killed with SIGKILL mid-run and started again on its port;
* ``diskfull`` (in process only): the database may grow only ``pages`` more pages;
* ``bots``: as many bots as bundles claim one each and leave; real workers wait out
  the leases;
* ``attack``: two servers on one store, ``kills`` × kill -9, short leases, leavers and
  latecomers; the store, the export and an online backup must agree, and every killed
  server's MLflow run must be marked KILLED by the server that came after it.

The servers are :mod:`saleval.testing.load_servers`, the workers
:mod:`saleval.testing.load_workers`; the task run is written by the real
``saleval-tasks`` stage (:func:`saleval.testing.make_task_run`). Needs ``httpx``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from saleval.testing.load_servers import TwoServers, kill_and_restart, serve, wait_healthy
from saleval.testing.load_workers import LoadResult, claim_and_leave, run_attack, run_load
from saleval.testing.runs import make_task_run

TOKEN = "load-test-token"
SCENARIOS = ("load", "kill", "diskfull", "bots", "attack")


@dataclass(frozen=True)
class LoadSettings:
    """One drill: the scenario and its sizes (the benchmark's flags, one field each)."""

    scenario: str = "load"
    workers: int = 50
    bundle_size: int = 20
    deadline: float = 300  # seconds before workers stop
    in_process: bool = False  # serve from a thread instead of a saleval-annotate process
    synchronous: str = "FULL"
    think: float = 0.0  # mean seconds per task (0: a stress run)
    kill_after: float = 3.0  # kill: seconds before SIGKILL
    pages: int = 0  # diskfull: pages the database may grow
    lease_s: float = 3.0  # bots, attack: the lease in seconds
    kills: int = 4  # attack: how many kill -9
    kill_every: float = 2.0  # attack: seconds between kills
    leavers: int | None = None  # attack: leavers and latecomers (None: workers // 5)
    seed: int = 0
    resend_prob: float = 0.1  # share of answers a worker sends twice

    def problem(self) -> str | None:
        """Why these settings cannot run, in one line naming the setting; None when they can."""
        if self.scenario not in SCENARIOS:
            return f"scenario {self.scenario!r}: choose one of {list(SCENARIOS)}"
        if self.scenario == "diskfull" and not self.in_process:
            return "scenario diskfull needs in_process (the page limit is set on the store)"
        if self.scenario in ("kill", "attack") and self.in_process:
            return f"scenario {self.scenario} needs servers in their own process (no in_process)"
        if self.scenario == "attack" and self.bundle_size < 3:
            return "scenario attack needs bundle_size of at least 3 (leavers answer two)"
        return None


@dataclass
class LoadReport:
    """What a drill found: ``summary`` (JSON-ready, ``problems`` included), the workers'
    logs and the export (``result``), and where the store was (``db``, ``run_key``)."""

    summary: dict[str, Any]
    result: LoadResult
    db: Path
    run_key: str

    @property
    def problems(self) -> list[str]:
        return list(self.summary["problems"])


def drive(settings: LoadSettings, root: Path | None = None) -> LoadReport:
    """Run one drill under ``root`` (a temporary directory when None, removed after),
    MLflow pointed at a store of its own there for the drill's length."""
    problem = settings.problem()
    if problem:
        raise ValueError(problem)
    if root is None:
        with tempfile.TemporaryDirectory(prefix="annotate-load-") as tmp:
            return drive(settings, Path(tmp))
    from saleval.annotate.study import load_study

    with _mlflow_store(root / "mlflow.db"):
        tasks = make_task_run(
            root / "tasks", n_bundles=settings.workers, bundle_size=settings.bundle_size
        )
        db = root / "annotations.sqlite"
        extra: dict[str, Any] = {}
        if settings.scenario == "attack":
            result = _attack(tasks, db, settings, extra)
        else:
            result = _one_server(tasks, db, settings, extra)
    summary: dict[str, Any] = {
        "scenario": settings.scenario,
        "server": "thread" if settings.in_process else "saleval-annotate process",
        "bundle_size": settings.bundle_size,
        "synchronous": settings.synchronous,
        "think_s": settings.think,
        **extra,
        **result.summary(),
    }
    summary["problems"] = invariant_problems(settings.scenario, result, summary)
    return LoadReport(summary, result, db, load_study(tasks).run_key)


@contextmanager
def _mlflow_store(db: Path) -> Iterator[None]:
    """``MLFLOW_TRACKING_URI`` at ``db`` for the block (servers started in it inherit it)."""
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old


def _one_server(tasks: Path, db: Path, s: LoadSettings, extra: dict[str, Any]) -> LoadResult:
    """load, kill, diskfull, bots: one server, N workers."""
    lease = s.lease_s / 60 if s.scenario == "bots" else 60.0
    with serve(tasks, db, TOKEN, s.in_process, s.synchronous, lease) as (url, server):
        killer = None
        if s.scenario == "kill":
            killer = threading.Thread(
                target=kill_and_restart, args=(url, server, s.kill_after, extra)
            )
            killer.start()
        if s.scenario == "diskfull":
            extra["page_limit"] = limit_database_pages(server.state.store, s.pages)
        if s.scenario == "bots":
            bots = claim_and_leave(url, s.workers)
            blocked = claim_and_leave(url, 1, prefix="early")
            extra.update(bots_ok=bots.count(303), early_real_worker_status=blocked[0])
            time.sleep(s.lease_s + 0.5)
        result = run_load(url, TOKEN, s.workers, s.deadline, s.seed, s.resend_prob, think_s=s.think)
        if killer is not None:
            killer.join()
    return result


def _attack(tasks: Path, db: Path, s: LoadSettings, extra: dict[str, Any]) -> LoadResult:
    """Two servers on one store, ``kills`` × kill -9 (alternating, every ``kill_every``
    s, each restarted at once on its port), ``lease_s`` leases, leavers, latecomers;
    then the store, the export and an online backup are compared and MLflow is asked
    whether the killed servers' runs were marked KILLED."""
    from mlflow.tracking import MlflowClient

    from saleval.annotate.study import load_study

    servers = TwoServers(tasks, db, TOKEN, s.synchronous, s.lease_s / 60)
    n_leavers = s.leavers if s.leavers is not None else max(1, s.workers // 5)

    def killer() -> None:
        for k in range(s.kills):
            time.sleep(s.kill_every)
            servers.kill(k % 2)
            servers.start(k % 2)
        servers.wait_healthy()  # the export is read from a server that is up

    try:
        servers.start(0)
        wait_healthy(servers.urls[0], servers.procs[0])  # one creates the store, then two
        servers.start(1)
        servers.wait_healthy()
        result = run_attack(
            servers.urls, TOKEN, s.workers, n_leavers, s.lease_s, s.deadline,
            think_s=s.think, seed=s.seed, during=killer,
        )  # fmt: skip
    finally:
        servers.stop()  # SIGTERM: the last two end their runs as FINISHED
    checks = store_checks(
        db, load_study(tasks).run_key, result.exported, db.parent / "backup.sqlite"
    )
    client = MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string="tags.stage = 'annotate'")
    status = {r.data.tags.get("pid"): r.info.status for r in runs}
    workers = result.workers
    extra.update(
        {
            "servers": 2,
            "lease_s": s.lease_s,
            "kills": len(servers.killed),
            "leavers": n_leavers,
            "latecomers": n_leavers,
            **checks,
            "late_answers_refused": sum(len(w.refused) for w in workers),
            "bundles_lost_to_another_worker": sum(w.bundle_lost for w in workers),
            "leavers_who_got_their_bundle_back": sum(w.came_back for w in workers),
            "latecomers_without_a_bundle": sum(w.no_bundle for w in workers),
            "killed_runs_marked_killed": sum(
                status.get(str(p)) == "KILLED" for p in servers.killed
            ),
            "killed_before_their_run_started": sum(str(p) not in status for p in servers.killed),
            "runs_left_running": sum(v == "RUNNING" for v in status.values()),
        }
    )
    return result


def invariant_problems(scenario: str, result: LoadResult, summary: dict[str, Any]) -> list[str]:
    """What broke: acknowledged = exported, none duplicated or altered, plus each scenario's own."""
    out = [k for k in ("lost", "duplicated", "duplicated_tasks", "altered") if summary[k]]
    if scenario == "diskfull":
        # a worker stops at their first refused answer; the server must have said so
        refused = [p for w in result.workers for p in w.failed_pages]
        if not refused:
            out.append("the database never filled up: lower --pages")
        if any("may not have been saved" not in p for p in refused):
            out.append("a refused answer's page does not say whether it was saved")
        if summary["unexpected"]:
            out.append("answers stored without an acknowledgement")
    else:
        if summary["errors"]:
            out.append(
                "workers failed: "
                + "; ".join(str(w.error) for w in result.workers if w.error)[:500]
            )
        if summary["unexpected"]:
            out.append("answers stored without an acknowledgement")
    if scenario == "kill" and not summary.get("restarted"):
        out.append("the server was not killed and restarted during the run")
    if scenario == "bots":
        if summary.get("early_real_worker_status") != 410:
            out.append("a real worker got a bundle while bots held them all")
        if summary["completed"] != summary["workers"]:
            out.append("real workers did not all finish after the leases ran out")
    if scenario == "attack":
        if not summary["stored_equals_exported"] or summary["stored"] != summary["exported"]:
            out.append("the store and the export differ")
        if not summary["backup_equals_stored"] or summary["backed_up"] != summary["stored"]:
            out.append("the online backup and the store differ")
        if summary["bundle_held_twice"]:
            out.append("a bundle was held by two workers at once")
        if summary["answers_after_release"]:
            out.append("answers were stored after their assignment was released")
        if summary["kills"] == 0:
            out.append("no server was killed")
        marked = summary["killed_runs_marked_killed"] + summary["killed_before_their_run_started"]
        if marked != summary["kills"] or summary["runs_left_running"]:
            out.append("a killed server's MLflow run was not marked KILLED")
    return out


def limit_database_pages(store: Any, extra_pages: int) -> int:
    """Make ``store``'s database "full" ``extra_pages`` pages from now (disk-full drills).

    Every connection the store opens from now on gets ``PRAGMA max_page_count``, so a
    write that would grow the file past it fails with SQLITE_FULL, as on a full disk.
    Returns the page limit.
    """
    limit = int(store._conn().execute("PRAGMA page_count").fetchone()[0]) + extra_pages
    store.close()  # connections opened before the limit are dropped
    opener = store._conn

    def limited() -> Any:
        con = opener()
        if not getattr(con, "page_limited", False):
            con.execute(f"PRAGMA max_page_count={limit}")
            con.page_limited = True
        return con

    store._conn = limited
    return limit


_KEY = ["worker_id", "bundle_id", "position", "task_id", "answer"]


def answer_keys(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    """One answer as who, where, what: the rows compared between store, export and backup."""
    return sorted(
        (str(w), str(b), int(p), str(t), str(a))
        for w, b, p, t, a in df[_KEY].itertuples(index=False)
    )


def store_checks(db: Path, run_key: str, exported: pd.DataFrame, backup_to: Path) -> dict[str, Any]:
    """What the database itself says after a run: stored = exported = backed up, and no
    bundle was held by two workers at once.

    ``bundle_held_twice`` counts bundles with more than one active assignment;
    ``answers_after_release`` answers stored for an assignment after it was released (a
    late answer that should have met the "NOT saved" page). An assignment taken back by
    its own worker is active again and not released, so neither count errs on it. The
    backup is SQLite's online backup (:meth:`AnnotationStore.backup`), read back
    read-only.
    """
    from saleval.annotate.store_answers import AnnotationStore

    store = AnnotationStore(db, readonly=True)
    try:
        stored = store.answers(run_key)
        con = store._conn()
        two_active = con.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM assignments WHERE run_key=? AND released_at "
            "IS NULL GROUP BY bundle_id HAVING COUNT(*) > 1)",
            (run_key,),
        ).fetchone()[0]
        after_release = con.execute(
            "SELECT COUNT(*) FROM answers n JOIN assignments a USING (assignment_id) "
            "WHERE a.run_key=? AND a.released_at IS NOT NULL AND n.submitted_at > a.released_at",
            (run_key,),
        ).fetchone()[0]
        n_assignments = con.execute(
            "SELECT COUNT(*) FROM assignments WHERE run_key=?", (run_key,)
        ).fetchone()[0]
        store.backup(backup_to)
    finally:
        store.close()
    copy = AnnotationStore(backup_to, readonly=True)
    try:
        backed_up = copy.answers(run_key)
    finally:
        copy.close()
    stored_keys, exported_keys = answer_keys(stored), answer_keys(exported)
    return {
        "stored": len(stored),
        "backed_up": len(backed_up),
        "stored_equals_exported": stored_keys == exported_keys,
        "backup_equals_stored": answer_keys(backed_up) == stored_keys,
        "assignments": int(n_assignments),
        "bundle_held_twice": int(two_active),
        "answers_after_release": int(after_release),
    }
