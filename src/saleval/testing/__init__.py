"""Test support that writes and drives what the pipeline does, shipped with the package.

* :mod:`saleval.testing.runs`: run dirs (a synthetic explain run, a ``saleval-tasks``
  run, score and metrics runs holding given tables) written by the stages' own writers,
  never by a hand-made copy of their format.
* :mod:`saleval.testing.annotate_load`: the annotation app's one load driver
  (:func:`~saleval.testing.annotate_load.drive`: a scenario, its servers on loopback
  (:mod:`~saleval.testing.load_servers`) and simulated workers over HTTP
  (:mod:`~saleval.testing.load_workers`), the checks); ``benchmarks/annotate_load.py`` is
  its command line (needs ``httpx``, in the ``dev`` extra).

Tests and benchmarks both import from here, so neither depends on the other.
"""

from saleval.testing.runs import (
    explain_frames,
    make_explain_run,
    make_result_run,
    make_task_run,
)

__all__ = ["explain_frames", "make_explain_run", "make_result_run", "make_task_run"]
