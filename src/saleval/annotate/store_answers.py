"""Tasks shown, answers committed (one transaction each, the first answer wins) and
the tables read back for the admin view and the export.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import pandas as pd

from saleval.annotate.store_db import _new_code
from saleval.annotate.store_leases import Assignment, _assignment, _released_message
from saleval.annotate.store_participants import ParticipantStore


class AnswerRejected(Exception):
    """A submitted answer cannot be stored (unknown position, task not shown yet...).

    Nothing was written when this is raised: the page says the answer was not saved.
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class AnswerResult:
    stored: bool  # False: this position was answered before; the first answer stands
    completed: bool
    completion_code: str | None


@dataclass(frozen=True)
class NextTask:
    position: int
    task_id: str
    index: int  # 0-based rank of the position in the bundle
    n_answered: int
    n_tasks: int
    started_at: str


class AnnotationStore(ParticipantStore):
    """Thread-safe access to the annotation database; one connection per thread.

    ``readonly=True`` opens an existing database without writing to it (an archived copy,
    a read-only mount): nothing is created, upgraded or locked for writing, and answers
    still in a ``-wal`` file beside it are read too (:meth:`_open_readonly`).
    """

    def next_task(self, assignment: Assignment) -> NextTask | None:
        """The first unanswered task of the bundle, marked as shown now (once), or None."""
        with self._write() as c:
            self._renew(c, assignment.assignment_id)
            items = c.execute(
                "SELECT position, task_id FROM bundle_items WHERE run_key=? AND bundle_id=? "
                "ORDER BY position",
                (assignment.run_key, assignment.bundle_id),
            ).fetchall()
            answered = {
                r[0]
                for r in c.execute(
                    "SELECT position FROM answers WHERE assignment_id=?",
                    (assignment.assignment_id,),
                )
            }
            for index, (position, task_id) in enumerate(items):
                if position in answered:
                    continue
                c.execute(
                    "INSERT OR IGNORE INTO shown (assignment_id, position, shown_at) "
                    "VALUES (?, ?, ?)",
                    (assignment.assignment_id, position, self._now()),
                )
                started = c.execute(
                    "SELECT shown_at FROM shown WHERE assignment_id=? AND position=?",
                    (assignment.assignment_id, position),
                ).fetchone()[0]
                return NextTask(position, task_id, index, len(answered), len(items), started)
            return None

    def record_answer(self, assignment_id: int, position: int, answer: str) -> AnswerResult:
        """Commit one answer; a repeat for an answered position is a no-op (first wins).

        Only the task currently shown may be answered: a position the worker has not seen
        yet, or that is not in their bundle, is rejected. An assignment whose lease ran
        out is taken back first if nobody else holds the bundle; otherwise the answer is
        rejected (status 410) and nothing is written.
        """
        with self._write() as c:
            row = c.execute(
                "SELECT * FROM assignments WHERE assignment_id=?", (assignment_id,)
            ).fetchone()
            if row is None:
                raise AnswerRejected("Unknown session.", status=403)
            a = _assignment(row)
            item = c.execute(
                "SELECT task_id FROM bundle_items WHERE run_key=? AND bundle_id=? AND position=?",
                (a.run_key, a.bundle_id, position),
            ).fetchone()
            if item is None:
                raise AnswerRejected(f"Position {position} is not part of your bundle.")
            if c.execute(
                "SELECT 1 FROM answers WHERE assignment_id=? AND position=?",
                (assignment_id, position),
            ).fetchone():
                return AnswerResult(False, a.done, a.completion_code)
            if a.released:
                if a.released_reason != "expired":
                    raise AnswerRejected(_released_message(c, a), status=410)
                c.execute("SAVEPOINT reclaim")
                try:
                    a = self._reactivate(c, assignment_id)
                except sqlite3.IntegrityError:
                    c.execute("ROLLBACK TO reclaim")
                    raise AnswerRejected(_released_message(c, a), status=410) from None
                c.execute("RELEASE reclaim")
            shown = c.execute(
                "SELECT shown_at FROM shown WHERE assignment_id=? AND position=?",
                (assignment_id, position),
            ).fetchone()
            if shown is None:
                raise AnswerRejected(
                    f"Task {position} has not been shown to you yet; answer the current task.",
                    status=409,
                )
            c.execute(
                "INSERT INTO answers (assignment_id, position, task_id, answer, started_at, "
                "submitted_at) VALUES (?, ?, ?, ?, ?, ?)",
                (assignment_id, position, item[0], answer, shown[0], self._now()),
            )
            n_answered = c.execute(
                "SELECT COUNT(*) FROM answers WHERE assignment_id=?", (assignment_id,)
            ).fetchone()[0]
            if n_answered < a.n_tasks:
                self._renew(c, assignment_id)
                return AnswerResult(True, False, None)
            code = self.settings.completion_code or _new_code()
            c.execute(
                "UPDATE assignments SET completed_at=?, completion_code=? WHERE assignment_id=?",
                (self._now(), code, assignment_id),
            )
            return AnswerResult(True, True, code)

    # -- reading back ---------------------------------------------------------------
    def answers(self, run_key: str) -> pd.DataFrame:
        """Every committed answer of a task set, in bundle order then position.

        Answers of a released assignment (lease ran out, admin release) are kept: they
        were acknowledged. ``bundle_complete`` is false for them.
        """
        sql = (
            "SELECT a.worker_id, n.task_id, n.answer, n.started_at, n.submitted_at, "
            "a.bundle_id, n.position, a.completed_at IS NOT NULL AS bundle_complete "
            "FROM answers n JOIN assignments a USING (assignment_id) "
            "JOIN bundle_items b ON b.run_key=a.run_key AND b.bundle_id=a.bundle_id "
            "AND b.position=n.position WHERE a.run_key=? "
            "ORDER BY b.bundle_order, a.assignment_id, n.position"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))

    def progress(self, run_key: str) -> pd.DataFrame:
        """One row per bundle: who holds it now, how far they are, its lease, its status.

        ``status`` is ``free``, ``active``, ``expired`` (lease run out, not yet released:
        the next claim releases it) or ``completed``.
        """
        sql = (
            "SELECT b.bundle_id, COUNT(*) AS n_tasks, a.worker_id, a.assigned_at, "
            "a.completed_at, a.completion_code, a.lease_expires_at, "
            "(SELECT COUNT(*) FROM answers n WHERE n.assignment_id=a.assignment_id) AS n_answered, "
            "(SELECT MAX(submitted_at) FROM answers n WHERE n.assignment_id=a.assignment_id) "
            "AS last_answer_at, "
            "(SELECT COUNT(*) FROM assignments r WHERE r.run_key=b.run_key "
            "AND r.bundle_id=b.bundle_id AND r.released_at IS NOT NULL) AS n_released "
            "FROM bundle_items b LEFT JOIN assignments a "
            "ON a.run_key=b.run_key AND a.bundle_id=b.bundle_id AND a.released_at IS NULL "
            "WHERE b.run_key=? GROUP BY b.bundle_id ORDER BY MIN(b.bundle_order)"
        )
        df = pd.read_sql_query(sql, self._conn(), params=(run_key,))
        df["n_answered"] = df["n_answered"].fillna(0).astype(int)
        now = self._now()
        df["status"] = [
            "free"
            if w is None or pd.isna(w)
            else "completed"
            if isinstance(c, str)
            else "expired"
            if str(e) <= now
            else "active"
            for w, c, e in zip(df["worker_id"], df["completed_at"], df["lease_expires_at"])
        ]
        return df

    def released(self, run_key: str) -> pd.DataFrame:
        """Assignments taken back (lease ran out, released or reassigned by the admin).

        Their answers stay in the store and in the export (``bundle_complete`` false).
        """
        sql = (
            "SELECT a.bundle_id, a.worker_id, a.assigned_at, a.released_at, a.released_reason, "
            "(SELECT COUNT(*) FROM answers n WHERE n.assignment_id=a.assignment_id) AS n_answered "
            "FROM assignments a WHERE a.run_key=? AND a.released_at IS NOT NULL "
            "ORDER BY a.released_at"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))

    def n_answers(self, run_key: str) -> int:
        """Answers stored for the task set, released assignments included."""
        return int(
            self._conn()
            .execute(
                "SELECT COUNT(*) FROM answers JOIN assignments USING (assignment_id) "
                "WHERE run_key=?",
                (run_key,),
            )
            .fetchone()[0]
        )

    def completions(self, run_key: str) -> pd.DataFrame:
        """Finished bundles with their completion codes (for paying workers)."""
        sql = (
            "SELECT worker_id, bundle_id, completion_code, assigned_at, completed_at "
            "FROM assignments WHERE run_key=? AND completed_at IS NOT NULL ORDER BY completed_at"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))
