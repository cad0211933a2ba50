"""Participants of a paid study: who came, their comprehension attempts, who was
screened out or had their session ended (docs/annotate.md#running-a-paid-study).

A participant is recorded at the start page, before any bundle: the comprehension check
comes before the first task, so one screened out never holds a bundle. Every change is
one ``BEGIN IMMEDIATE`` transaction like an answer, so two tabs submitting an attempt at
once use up two attempts, never three, and an attention failure's release of the bundle
and the end of the session are one step.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from saleval.annotate.store_db import _Connection
from saleval.annotate.store_leases import BundleRefused, BundleStore

ENDED_ATTENTION = "attention"
"""``ended_reason`` (and the released bundle's reason) of a session ended by the policy."""


@dataclass(frozen=True)
class Participant:
    """One person in one task set, before and after they hold a bundle."""

    run_key: str
    worker_id: str
    token: str  # the participant cookie's value (before a bundle's session exists)
    first_seen_at: str
    study_id: str | None
    platform_session: str | None
    attempts: int
    passed_at: str | None
    screened_out_at: str | None
    ended_at: str | None
    ended_reason: str | None

    @property
    def screened_out(self) -> bool:
        return self.screened_out_at is not None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


class ParticipantStore(BundleStore):
    """Participants, their comprehension attempts and the sessions the policy ended."""

    def participant(
        self,
        run_key: str,
        worker_id: str,
        *,
        study_id: str | None = None,
        platform_session: str | None = None,
        client: str | None = None,
    ) -> Participant:
        """The participant ``worker_id`` names in this task set, recorded on first sight."""
        with self._write() as c:
            worker_id = self.worker(c, worker_id)
            c.execute(
                "INSERT OR IGNORE INTO participants (run_key, worker_id, token, first_seen_at, "
                "study_id, platform_session, client) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_key,
                    worker_id,
                    secrets.token_urlsafe(24),
                    self._now(),
                    study_id or None,
                    platform_session or None,
                    client,
                ),
            )
            return self._participant(c, run_key, worker_id)

    def by_participant_token(self, token: str | None) -> Participant | None:
        if not token:
            return None
        row = self._conn().execute("SELECT * FROM participants WHERE token=?", (token,)).fetchone()
        return None if row is None else _participant(row)

    def record_attempt(
        self,
        run_key: str,
        worker_id: str,
        answers: Mapping[int, str],
        wrong: Sequence[int],
        allowed: int,
    ) -> Participant:
        """One comprehension attempt: passed when nothing is wrong; the ``allowed``-th
        failure screens the participant out. An attempt after either is refused."""
        with self._write() as c:
            p = self._participant(c, run_key, worker_id)
            if p.passed_at or p.screened_out_at:
                raise BundleRefused("You have already taken the comprehension check.")
            attempt = p.attempts + 1
            passed = not wrong
            c.execute(
                "INSERT INTO comprehension_attempts (run_key, worker_id, attempt, submitted_at, "
                "answers, wrong, passed) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_key,
                    p.worker_id,
                    attempt,
                    self._now(),
                    json.dumps({str(k): v for k, v in sorted(answers.items())}),
                    json.dumps(list(wrong)),
                    int(passed),
                ),
            )
            outcome = (
                "passed_at=?" if passed else "screened_out_at=?" if attempt >= allowed else None
            )
            c.execute(
                "UPDATE participants SET attempts=?"
                + (f", {outcome}" if outcome else "")
                + " WHERE run_key=? AND worker_id=?",
                (attempt, *([self._now()] if outcome else []), run_key, p.worker_id),
            )
            return self._participant(c, run_key, p.worker_id)

    def end_session(self, run_key: str, worker_id: str, reason: str) -> Participant:
        """End a participant's session: their unfinished bundle goes back to the pool (its
        answers kept), and they get no other bundle of this task set."""
        with self._write() as c:
            p = self._participant(c, run_key, worker_id)
            now = self._now()
            c.execute(
                "UPDATE assignments SET released_at=?, released_reason=? WHERE run_key=? "
                "AND worker_id=? AND released_at IS NULL AND completed_at IS NULL",
                (now, reason, run_key, p.worker_id),
            )
            c.execute(
                "UPDATE participants SET ended_at=?, ended_reason=? WHERE run_key=? "
                "AND worker_id=? AND ended_at IS NULL",
                (now, reason, run_key, p.worker_id),
            )
            return self._participant(c, run_key, p.worker_id)

    def participants(self, run_key: str) -> pd.DataFrame:
        """Every participant of the task set, in the order they came."""
        return pd.read_sql_query(
            "SELECT * FROM participants WHERE run_key=? ORDER BY first_seen_at, worker_id",
            self._conn(),
            params=(run_key,),
        ).drop(columns=["token"])

    def comprehension_attempts(self, run_key: str) -> pd.DataFrame:
        return pd.read_sql_query(
            "SELECT * FROM comprehension_attempts WHERE run_key=? ORDER BY submitted_at",
            self._conn(),
            params=(run_key,),
        )

    def assignments(self, run_key: str) -> pd.DataFrame:
        """Every assignment of the task set (released ones too), without session secrets."""
        sql = (
            "SELECT a.assignment_id, a.worker_id, a.bundle_id, a.n_tasks, a.assigned_at, "
            "a.completed_at, a.completion_code, a.released_at, a.released_reason, "
            "a.lease_expires_at, (SELECT COUNT(*) FROM answers n "
            "WHERE n.assignment_id=a.assignment_id) AS n_answered "
            "FROM assignments a WHERE a.run_key=? ORDER BY a.assignment_id"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))

    def _participant(self, c: _Connection, run_key: str, worker_id: str) -> Participant:
        row = c.execute(
            "SELECT * FROM participants WHERE run_key=? AND worker_id=?", (run_key, worker_id)
        ).fetchone()
        if row is None:
            raise BundleRefused("Start the study from its first page.", status=403)
        return _participant(row)


def _participant(row: sqlite3.Row) -> Participant:
    return Participant(**{k: row[k] for k in Participant.__dataclass_fields__})
