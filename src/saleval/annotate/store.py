"""The annotation app's durable store: SQLite in WAL mode, one commit per answer.

Why SQLite: a study runs on one machine for days; a crash, a kill or a reboot must not
lose an answer a worker already saw acknowledged. Every answer is its own
``BEGIN IMMEDIATE … COMMIT`` transaction with ``synchronous=FULL`` by default, so once
the server has redirected the worker to the next task, the answer is on disk.

The rules of the study live in the schema, not only in Python, so that no code path (two
server processes on one database, a double-clicked button, a replayed request) can
break them:

* ``one_bundle_per_worker_per_dataset``: a unique index on the *active* assignments'
  ``(worker_id, dataset)``, across every task set stored in the same database;
* ``one_worker_per_bundle``: a unique index on the active assignments' ``(run_key,
  bundle_id)``: a bundle is never with two workers at once;
* ``PRIMARY KEY (assignment_id, position)`` and ``UNIQUE (assignment_id, task_id)`` on
  answers: an answer is never stored twice; the first one wins.

An assignment is active until it is released: its lease ran out (``lease_minutes`` after
the worker's last action; see :class:`LeasePolicy`), or the admin released or
reassigned it. A released assignment keeps its answers (they were acknowledged) and its
bundle goes back to the pool. Every lease change is a ``BEGIN IMMEDIATE`` transaction
like an answer, so a late answer and the claim that releases its bundle are ordered:
exactly one of them wins. docs/annotate.md describes the rules for operators.

Times are ISO 8601 in UTC with milliseconds (``2025-01-31T12:00:00.123+00:00``).

The store is built in three layers, each its own module: the database (schema, upgrade,
connections, read-only opening, backups: :mod:`saleval.annotate.store_db`), task sets,
assignments and leases (:mod:`saleval.annotate.store_leases`), and tasks, answers and
the tables read back (:mod:`saleval.annotate.store_answers`, whose
:class:`AnnotationStore` is the store). This module names them all, as before.
"""

from __future__ import annotations

# the read-only opening copies files with shutil, reached through this module's name
import shutil  # noqa: F401

from saleval.annotate.store_answers import AnnotationStore as AnnotationStore
from saleval.annotate.store_answers import AnswerRejected as AnswerRejected
from saleval.annotate.store_answers import AnswerResult as AnswerResult
from saleval.annotate.store_answers import NextTask as NextTask
from saleval.annotate.store_db import SCHEMA_VERSION as SCHEMA_VERSION
from saleval.annotate.store_db import SYNCHRONOUS as SYNCHRONOUS
from saleval.annotate.store_db import LeasePolicy as LeasePolicy
from saleval.annotate.store_db import StoreDatabase as StoreDatabase
from saleval.annotate.store_db import StoreError as StoreError
from saleval.annotate.store_db import utcnow as utcnow
from saleval.annotate.store_leases import Assignment as Assignment
from saleval.annotate.store_leases import BundleRefused as BundleRefused
from saleval.annotate.store_leases import LeaseStore as LeaseStore
from saleval.annotate.store_leases import ResumeRequired as ResumeRequired
