"""The annotation app's guarantees under stress, on loopback: load, kill -9, a full disk, bots,
an attack round.

Every scenario ends with the same check: the answers exported through the admin view
equal, one for one, the answers the simulated workers saw acknowledged (HTTP 303):
zero lost, zero duplicated, zero altered (:meth:`LoadResult.check`). The exit status is
1 when that fails. Bounded and self-stopping: workers stop at a deadline, servers are
stopped by process group whatever happens; everything, MLflow store included, lives in
a temporary directory.

    .venv/bin/python benchmarks/annotate_load.py --workers 50 --bundle-size 20
    .venv/bin/python benchmarks/annotate_load.py --scenario kill --think 0.2
    .venv/bin/python benchmarks/annotate_load.py --scenario diskfull --in-process
    .venv/bin/python benchmarks/annotate_load.py --scenario bots
    .venv/bin/python benchmarks/annotate_load.py --scenario attack --workers 40 --think 0.2

* ``load`` (default): N concurrent workers; prints p50/p95/max latency per answer (the
  POST /answer round trip) and throughput. ``--think 1.0`` paces workers like people;
  the default 0 is a stress run where latency is mostly queueing (Little's law).
* ``kill``: the server is killed with SIGKILL ``--kill-after`` seconds into the run and
  started again on the same port; workers re-send what got no answer, as a person
  reloading would.
* ``diskfull`` (``--in-process`` only): the database may grow only ``--pages`` more
  pages, then every write fails as on a full disk; a refused answer must get a page
  that says it may not have been saved, and every acknowledged one must be exported.
* ``bots``: as many bots as bundles claim one each and leave; real workers are refused
  until the leases (``--lease-s``) run out, then all of them finish.
* ``attack``: two servers on one store; ``--kills`` × kill -9 of one of them, every
  ``--kill-every`` s, alternating, each restarted at once on its port; ``--lease-s``
  leases (3 s). Workers fail over to the other server; ``--leavers`` of them leave
  mid-bundle for three leases, as many latecomers take the bundles that come free, and
  a leaver's late answer then meets the "NOT saved" page. Asserts acknowledged =
  stored = exported = backed up (an online backup), no bundle held twice, no answer
  stored after its assignment was released, and every killed server's MLflow run
  marked KILLED by the server that came after it (docs/tracking.md).

By default the server is the real ``saleval-annotate`` console script in its own process
(so client threads do not share its GIL); ``--in-process`` serves from a thread. The
task run is written by the real ``saleval-tasks`` stage
(:func:`saleval.testing.make_task_run`); the workers and the check are
:mod:`saleval.testing.annotate_load`, which ``tests/test_annotate_load.py`` runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from saleval.testing import make_task_run
from saleval.testing.annotate_load import (
    LoadResult,
    claim_and_leave,
    free_port,
    limit_database_pages,
    run_attack,
    run_load,
    start_cli_server,
    stop,
    store_checks,
    wait_healthy,
)

TOKEN = "load-test-token"
SCENARIOS = ("load", "kill", "diskfull", "bots", "attack")


@contextmanager
def serve(
    root: Path, tasks: Path, args: argparse.Namespace, lease_minutes: float = 60.0
) -> Iterator[tuple[str, Any]]:
    """(base URL, the app or the server process) for the run's lifetime."""
    db = root / "annotations.sqlite"
    if args.in_process:
        from saleval.annotate.app import background_server, create_app
        from saleval.annotate.state import AppSettings
        from saleval.annotate.store_db import LeasePolicy

        lease = LeasePolicy(lease_minutes=lease_minutes, max_claims=0)
        app = create_app(tasks, AppSettings(db, TOKEN, synchronous=args.synchronous, lease=lease))
        try:
            with background_server(app) as url:
                yield url, app
        finally:
            app.state.store.close()
        return
    port = free_port()
    overrides = [
        f"annotate.synchronous={args.synchronous}",
        f"annotate.lease_minutes={lease_minutes}",
    ]
    holder: dict[str, Any] = {}

    def start(n: int) -> None:
        (root / f"serve{n}").mkdir()
        holder["proc"] = start_cli_server(
            tasks, db, port, TOKEN, root / f"serve{n}", overrides=overrides
        )

    start(1)
    holder["restart"] = start
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, holder["proc"])
        yield url, holder
    finally:
        stop(holder["proc"])


def kill_and_restart(url: str, holder: dict[str, Any], after_s: float, log: dict[str, Any]) -> None:
    time.sleep(after_s)
    stop(holder["proc"], signal.SIGKILL)
    log["killed_rc"] = holder["proc"].returncode
    holder["restart"](2)
    wait_healthy(url, holder["proc"])
    log["restarted"] = True


class TwoServers:
    """Two ``saleval-annotate`` processes on one store, each on its own port, each
    restartable there after a ``kill -9`` (the attack scenario)."""

    def __init__(self, root: Path, tasks: Path, args: argparse.Namespace) -> None:
        self.root, self.tasks = root, tasks
        self.db = root / "annotations.sqlite"
        self.ports = [free_port()]
        while len(self.ports) < 2:
            port = free_port()
            if port not in self.ports:
                self.ports.append(port)
        self.overrides = [
            f"annotate.synchronous={args.synchronous}",
            f"annotate.lease_minutes={args.lease_s / 60}",
        ]
        self.procs: list[Any] = [None, None]
        self.starts = 0
        self.killed: list[int] = []  # pids killed with SIGKILL

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self, i: int) -> None:
        self.starts += 1
        run_dir = self.root / f"serve{i}-{self.starts}"
        run_dir.mkdir()
        self.procs[i] = start_cli_server(
            self.tasks, self.db, self.ports[i], TOKEN, run_dir, overrides=self.overrides
        )

    def kill(self, i: int) -> None:
        self.killed.append(self.procs[i].pid)
        stop(self.procs[i], signal.SIGKILL)

    def wait_healthy(self) -> None:
        for url, proc in zip(self.urls, self.procs):
            wait_healthy(url, proc)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                stop(proc)


def attack(root: Path, tasks: Path, args: argparse.Namespace) -> tuple[LoadResult, dict[str, Any]]:
    """Two servers on one store, ``--kills`` × kill -9 (alternating, every
    ``--kill-every`` s, each restarted at once on its port), ``--lease-s`` leases,
    leavers, latecomers; then the store, the export and an online backup are compared
    and MLflow is asked whether the killed servers' runs were marked KILLED."""
    from mlflow.tracking import MlflowClient

    from saleval.annotate.study import load_study

    servers = TwoServers(root, tasks, args)
    n_leavers = args.leavers if args.leavers is not None else max(1, args.workers // 5)

    def killer() -> None:
        for k in range(args.kills):
            time.sleep(args.kill_every)
            servers.kill(k % 2)
            servers.start(k % 2)
        servers.wait_healthy()  # the export is read from a server that is up

    try:
        servers.start(0)
        wait_healthy(servers.urls[0], servers.procs[0])  # one creates the store, then two
        servers.start(1)
        servers.wait_healthy()
        result = run_attack(
            servers.urls,
            TOKEN,
            args.workers,
            n_leavers,
            args.lease_s,
            args.deadline,
            think_s=args.think,
            during=killer,
        )
    finally:
        servers.stop()  # SIGTERM: the last two end their runs as FINISHED
    checks = store_checks(
        servers.db, load_study(tasks).run_key, result.exported, root / "backup.sqlite"
    )
    client = MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string="tags.stage = 'annotate'")
    status = {r.data.tags.get("pid"): r.info.status for r in runs}
    workers = result.workers
    return result, {
        "servers": 2,
        "lease_s": args.lease_s,
        "kills": len(servers.killed),
        "leavers": n_leavers,
        "latecomers": n_leavers,
        **checks,
        "late_answers_refused": sum(len(w.refused) for w in workers),
        "bundles_lost_to_another_worker": sum(w.bundle_lost for w in workers),
        "leavers_who_got_their_bundle_back": sum(w.came_back for w in workers),
        "latecomers_without_a_bundle": sum(w.no_bundle for w in workers),
        "killed_runs_marked_killed": sum(status.get(str(p)) == "KILLED" for p in servers.killed),
        "killed_before_their_run_started": sum(str(p) not in status for p in servers.killed),
        "runs_left_running": sum(s == "RUNNING" for s in status.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=SCENARIOS, default="load")
    ap.add_argument("--workers", type=int, default=50)
    ap.add_argument("--bundle-size", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=300, help="seconds before workers stop")
    ap.add_argument("--in-process", action="store_true", help="serve from a thread")
    ap.add_argument("--synchronous", default="FULL")
    ap.add_argument("--think", type=float, default=0.0, help="mean seconds per task (0: stress)")
    ap.add_argument("--kill-after", type=float, default=3.0, help="kill: seconds before SIGKILL")
    ap.add_argument("--pages", type=int, default=0, help="diskfull: pages the database may grow")
    ap.add_argument("--lease-s", type=float, default=3.0, help="bots, attack: lease in seconds")
    ap.add_argument("--kills", type=int, default=4, help="attack: how many kill -9")
    ap.add_argument("--kill-every", type=float, default=2.0, help="attack: seconds between kills")
    ap.add_argument(
        "--leavers", type=int, default=None, help="attack: leavers and latecomers (workers/5)"
    )
    args = ap.parse_args(argv)
    if args.scenario == "diskfull" and not args.in_process:
        ap.error("--scenario diskfull needs --in-process (the page limit is set on the store)")
    if args.scenario in ("kill", "attack") and args.in_process:
        ap.error(f"--scenario {args.scenario} needs servers in their own process (no --in-process)")
    if args.scenario == "attack" and args.bundle_size < 3:
        ap.error("--scenario attack needs --bundle-size of at least 3 (leavers answer two)")
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="annotate-load-") as tmp:
        root = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
        tasks = make_task_run(root / "tasks", n_bundles=args.workers, bundle_size=args.bundle_size)
        if args.scenario == "attack":
            result, extra = attack(root, tasks, args)
        else:
            result = run_scenario(root, tasks, args, extra)
    summary: dict[str, Any] = {
        "scenario": args.scenario,
        "server": "thread" if args.in_process else "saleval-annotate process",
        "bundle_size": args.bundle_size,
        "synchronous": args.synchronous,
        "think_s": args.think,
        **extra,
        **result.summary(),
    }
    problems = invariant_problems(args.scenario, result, summary)
    summary["problems"] = problems
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


def run_scenario(
    root: Path, tasks: Path, args: argparse.Namespace, extra: dict[str, Any]
) -> LoadResult:
    """load, kill, diskfull, bots: one server, N workers."""
    lease = args.lease_s / 60 if args.scenario == "bots" else 60.0
    with serve(root, tasks, args, lease) as (url, server):
        killer = None
        if args.scenario == "kill":
            killer = threading.Thread(
                target=kill_and_restart, args=(url, server, args.kill_after, extra)
            )
            killer.start()
        if args.scenario == "diskfull":
            extra["page_limit"] = limit_database_pages(server.state.store, args.pages)
        if args.scenario == "bots":
            bots = claim_and_leave(url, args.workers)
            blocked = claim_and_leave(url, 1, prefix="early")
            extra.update(bots_ok=bots.count(303), early_real_worker_status=blocked[0])
            time.sleep(args.lease_s + 0.5)
        result = run_load(url, TOKEN, args.workers, args.deadline, think_s=args.think)
        if killer is not None:
            killer.join()
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


if __name__ == "__main__":
    raise SystemExit(main())
