"""The crowd study's design (docs/study-design.md): tasks t_ijk, what a worker sees, and bundles.

One module per concept, in layers (each imports only those before it):

* :mod:`~saleval.crowd.design.rendering` — :func:`render`: shown words in order, each
  hidden word as one ".";
* :mod:`~saleval.crowd.design.tasks` — :func:`build_tasks`: every (sample, method, k),
  top-k by :func:`saleval.words.rank_words`, nested across k; the noise ablation;
* :mod:`~saleval.crowd.design.duplicates` — :func:`identical_methods`: methods whose
  top-k words agree on every sample at every k (their tasks would be the same);
* :mod:`~saleval.crowd.design.gold` — :func:`select_gold`: attention-check questions;
* :mod:`~saleval.crowd.design.bundles` — :func:`assign_bundles`: every task R times, no
  bundle with two tasks of one sample, methods and k mixed evenly;
* :mod:`~saleval.crowd.design.checks` — :func:`check_design`: every constraint verified
  and every violation reported, so a broken design never reaches workers;
* :mod:`~saleval.crowd.design.study` — :func:`build_study`: samples → tasks → bundles →
  verified design, configured by :class:`saleval.config.crowd.StudyConfig`.

What goes wrong is a :class:`saleval.config.crowd.DesignError`, imported from there.
"""

from saleval.crowd.design.bundles import assign_bundles
from saleval.crowd.design.checks import Violation, assert_design, check_design
from saleval.crowd.design.duplicates import identical_methods, methods_to_drop
from saleval.crowd.design.gold import GOLD_METHOD, gold_task_id, select_gold
from saleval.crowd.design.rendering import render
from saleval.crowd.design.study import StudyDesign, build_study, choose_methods
from saleval.crowd.design.tasks import build_tasks, noisy_shown, task_id

__all__ = [
    "GOLD_METHOD",
    "StudyDesign",
    "Violation",
    "assert_design",
    "assign_bundles",
    "build_study",
    "build_tasks",
    "check_design",
    "choose_methods",
    "gold_task_id",
    "identical_methods",
    "methods_to_drop",
    "noisy_shown",
    "render",
    "select_gold",
    "task_id",
]
