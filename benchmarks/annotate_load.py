"""Load test of the annotation app on loopback: N concurrent simulated workers over HTTP.

Bounded and self-stopping: every worker stops at a deadline, the server is stopped at
the end whatever happens. Each simulated worker does what a person does through the
pages (start with an id, acknowledge the instructions, GET a task, POST an answer,
repeat), and a few re-send an answer they already sent (a double click or a retry
after a timeout). At the end, the answers exported through the admin view must equal,
one for one, the answers the workers saw acknowledged: zero lost, zero duplicated.

    .venv/bin/python benchmarks/annotate_load.py --workers 50 --bundle-size 20

prints answers, p50/p95/max latency per answer (the POST /answer round trip) and
throughput as JSON. ``--think 1.0`` paces workers like people (about a second per
task); the default 0 is a stress run where latency is mostly queueing (Little's law).
By default the server is the real ``saleval-annotate`` console script in its own
process (so client threads do not share its GIL); ``--in-process`` serves from a
thread instead. The task run is written by the real ``saleval-tasks`` stage
(:func:`saleval.testing.make_task_run`); the workers and the check are
:mod:`saleval.testing.annotate_load`, which ``tests/test_annotate_load.py`` runs too.
Everything, MLflow store included, lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from saleval.testing import make_task_run
from saleval.testing.annotate_load import free_port, run_load, start_cli_server, stop, wait_healthy


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=50)
    ap.add_argument("--bundle-size", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=300, help="seconds before workers stop")
    ap.add_argument("--in-process", action="store_true", help="serve from a thread")
    ap.add_argument("--synchronous", default="FULL")
    ap.add_argument(
        "--think", type=float, default=0.0, help="mean seconds a worker reads a task (0: stress)"
    )
    args = ap.parse_args(argv)
    token = "load-test-token"
    with tempfile.TemporaryDirectory(prefix="annotate-load-") as tmp:
        root = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
        tasks = make_task_run(root / "tasks", n_bundles=args.workers, bundle_size=args.bundle_size)
        db = root / "annotations.sqlite"
        if args.in_process:
            from saleval.annotate.app import AppSettings, background_server, create_app
            from saleval.annotate.store import LeasePolicy

            settings = AppSettings(
                db, token, synchronous=args.synchronous, lease=LeasePolicy(max_claims=0)
            )
            app = create_app(tasks, settings)
            with background_server(app) as url:
                result = run_load(url, token, args.workers, args.deadline, think_s=args.think)
            app.state.store.close()
        else:
            port = free_port()
            (root / "serve").mkdir()
            proc = start_cli_server(
                tasks,
                db,
                port,
                token,
                root / "serve",
                overrides=[f"annotate.synchronous={args.synchronous}"],
            )
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, proc)
                result = run_load(url, token, args.workers, args.deadline, think_s=args.think)
            finally:
                stop(proc)
    summary = {
        "server": "thread" if args.in_process else "saleval-annotate process",
        "bundle_size": args.bundle_size,
        "synchronous": args.synchronous,
        "think_s": args.think,
        **result.summary(),
    }
    print(json.dumps(summary, indent=2))
    bad = summary["lost"] or summary["duplicated"] or summary["altered"] or summary["errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
