"""The web annotation app (docs/study-design.md#exports): serve bundles to people, lose no answer.

* :mod:`saleval.annotate.study` reads a ``saleval-tasks`` run dir (tasks, bundles,
  instructions, label names) into a :class:`Study`.
* :class:`saleval.annotate.store_answers.AnnotationStore` is the durable store, in three
  layers (:mod:`~saleval.annotate.store_db`, :mod:`~saleval.annotate.store_leases`,
  :mod:`~saleval.annotate.store_answers`): SQLite in WAL mode, every answer committed on
  its own with timestamps, one bundle per worker per dataset enforced by a unique
  constraint in the database.
* :mod:`saleval.annotate.app` builds the FastAPI app (server-rendered Jinja2 pages) from
  :mod:`~saleval.annotate.routes_worker` (the worker's pages),
  :mod:`~saleval.annotate.routes_admin` (the admin view) and
  :mod:`~saleval.annotate.security` (origin check, headers, throttles), which share one
  :class:`~saleval.annotate.state.AppState`.
* :mod:`saleval.annotate.export` writes the answers in the import format (``tables.ANSWERS``).

``saleval-annotate`` (:mod:`saleval.stages.annotate`) is the console script.
"""

from saleval.annotate.study import IDK, Study, StudyError, load_study

__all__ = ["IDK", "Study", "StudyError", "load_study"]
