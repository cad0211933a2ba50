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
(so client threads do not share its GIL); ``--in-process`` serves from a thread. This file
is only the command line: every scenario, its servers, workers and checks are
:func:`saleval.testing.annotate_load.drive`, which ``tests/test_annotate_load.py`` calls
too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import fields

from saleval.testing.annotate_load import SCENARIOS, LoadSettings, drive

#: flag -> (type, help); each is the LoadSettings field of the same name (dashes: _)
FLAGS = {
    "--workers": (int, "concurrent simulated workers (one bundle each)"),
    "--bundle-size": (int, "tasks per bundle"),
    "--deadline": (float, "seconds before workers stop"),
    "--synchronous": (str, "SQLite's synchronous setting of the store"),
    "--think": (float, "mean seconds per task (0: stress)"),
    "--kill-after": (float, "kill: seconds before SIGKILL"),
    "--pages": (int, "diskfull: pages the database may grow"),
    "--lease-s": (float, "bots, attack: lease in seconds"),
    "--kills": (int, "attack: how many kill -9"),
    "--kill-every": (float, "attack: seconds between kills"),
    "--leavers": (int, "attack: leavers and latecomers (workers/5)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {f.name: f.default for f in fields(LoadSettings)}
    ap.add_argument("--scenario", choices=SCENARIOS, default=defaults["scenario"])
    ap.add_argument("--in-process", action="store_true", help="serve from a thread")
    for flag, (kind, text) in FLAGS.items():
        ap.add_argument(flag, type=kind, default=defaults[flag[2:].replace("-", "_")], help=text)
    settings = LoadSettings(**vars(ap.parse_args(argv)))
    problem = settings.problem()
    if problem:
        ap.error(problem)
    report = drive(settings)
    print(json.dumps(report.summary, indent=2))
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
