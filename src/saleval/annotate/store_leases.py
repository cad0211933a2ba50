"""Task sets, assignments and leases: who holds which bundle, and for how long.

A bundle in progress is handed back only to a request that proves it belongs to its
worker (:func:`_proves`); a lease runs from the worker's last action and, once run out,
the bundle goes back to the pool at the next claim (:class:`LeaseStore`); task sets and
claims are :class:`BundleStore`'s. Every change
is one ``BEGIN IMMEDIATE`` transaction, ordered against answers.
"""

from __future__ import annotations

import hmac
import re
import secrets
import sqlite3
from dataclasses import dataclass
from datetime import timedelta

import pandas as pd

from saleval.annotate.store_db import StoreDatabase, StoreError, _Connection, _iso, _new_code


class BundleRefused(Exception):
    """The worker may not get a bundle now; ``reason`` is shown to them."""

    def __init__(self, reason: str, status: int = 409) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class ResumeRequired(BundleRefused):
    """The worker ID holds a bundle in progress and the request proved no right to it."""


@dataclass(frozen=True)
class Assignment:
    """One worker's bundle and where they are in it."""

    assignment_id: int
    run_key: str
    dataset: str
    bundle_id: str
    worker_id: str
    session_token: str
    n_tasks: int
    assigned_at: str
    instructions_at: str | None
    completed_at: str | None
    completion_code: str | None
    resume_code: str
    lease_expires_at: str
    released_at: str | None
    released_reason: str | None
    platform_session: str | None

    @property
    def done(self) -> bool:
        return self.completed_at is not None

    @property
    def released(self) -> bool:
        return self.released_at is not None


class LeaseStore(StoreDatabase):
    """Assignments as leases: an assignment is made with a lease, renewed by the worker's
    actions, released when it runs out (at the next claim, or :meth:`expire_leases`) or by
    the admin, and taken back by its own worker while nobody else holds the bundle."""

    def _insert(
        self,
        c: _Connection,
        run_key: str,
        dataset: str,
        bundle_id: str,
        n_tasks: int,
        worker_id: str,
        client: str | None,
        platform_session: str | None,
    ) -> Assignment:
        cur = c.execute(
            "INSERT INTO assignments (run_key, dataset, bundle_id, worker_id, session_token, "
            "n_tasks, assigned_at, resume_code, lease_expires_at, client, platform_session) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_key,
                dataset,
                bundle_id,
                worker_id,
                secrets.token_urlsafe(24),
                n_tasks,
                self._now(),
                _new_code(),
                self._lease_end(),
                client,
                platform_session or None,
            ),
        )
        return self._get(c, int(cur.lastrowid or 0))

    def _get(self, c: _Connection, assignment_id: int) -> Assignment:
        row = c.execute(
            "SELECT * FROM assignments WHERE assignment_id=?", (assignment_id,)
        ).fetchone()
        return _assignment(row)

    def _renew(self, c: _Connection, assignment_id: int) -> None:
        c.execute(
            "UPDATE assignments SET lease_expires_at=? WHERE assignment_id=? "
            "AND released_at IS NULL AND completed_at IS NULL",
            (self._lease_end(), assignment_id),
        )

    def _expire(self, c: _Connection, run_key: str) -> int:
        """Release every unfinished bundle of the task set whose lease has run out."""
        now = self._now()
        return c.execute(
            "UPDATE assignments SET released_at=?, released_reason='expired' "
            "WHERE run_key=? AND released_at IS NULL AND completed_at IS NULL "
            "AND lease_expires_at<=?",
            (now, run_key, now),
        ).rowcount

    def _reactivate(self, c: _Connection, assignment_id: int) -> Assignment:
        """Give an expired assignment back to its worker; the indexes refuse a taken bundle."""
        c.execute(
            "UPDATE assignments SET released_at=NULL, released_reason=NULL, lease_expires_at=? "
            "WHERE assignment_id=?",
            (self._lease_end(), assignment_id),
        )
        return self._get(c, assignment_id)

    def expire_leases(self, run_key: str) -> int:
        """Return bundles whose lease has run out to the pool now; how many were released."""
        with self._write() as c:
            return self._expire(c, run_key)

    def reclaim(self, assignment_id: int) -> Assignment:
        """A released assignment back for its own worker (who holds its session), if possible.

        Possible when the lease ran out (an admin release is final), nobody else holds the
        bundle and the worker holds no other bundle of the dataset.
        """
        with self._write() as c:
            a = self._get(c, assignment_id)
            if not a.released:
                self._renew(c, assignment_id)
                return self._get(c, assignment_id)
            if a.released_reason != "expired":
                raise BundleRefused(_released_message(c, a), status=410)
            try:
                return self._reactivate(c, assignment_id)
            except sqlite3.IntegrityError:
                raise BundleRefused(_released_message(c, a), status=410) from None

    def release(self, run_key: str, bundle_id: str, reason: str = "admin") -> Assignment:
        """Take an unfinished bundle away from its worker; their answers so far are kept."""
        with self._write() as c:
            row = c.execute(
                "SELECT * FROM assignments WHERE run_key=? AND bundle_id=? AND released_at IS NULL",
                (run_key, bundle_id),
            ).fetchone()
            if row is None:
                raise BundleRefused(f"Bundle {bundle_id} is not assigned to anyone.")
            a = _assignment(row)
            if a.done:
                raise BundleRefused(f"Bundle {bundle_id} is completed; it cannot be released.")
            c.execute(
                "UPDATE assignments SET released_at=?, released_reason=? WHERE assignment_id=?",
                (self._now(), reason, a.assignment_id),
            )
            return self._get(c, a.assignment_id)


class BundleStore(LeaseStore):
    """Task sets and who holds which bundle: a task set registered once, a bundle claimed
    by a worker (:meth:`assign`) or given by the admin (:meth:`reassign`), an assignment
    found by its session; every worker ID read by the one worker-ID rule (:meth:`worker`)."""

    def register_run(
        self, run_key: str, dataset: str, tasks_dir: str, bundles: pd.DataFrame
    ) -> None:
        """Store a task set's bundles once; refuse if the same run key now holds other bundles."""
        order = {b: i for i, b in enumerate(dict.fromkeys(bundles["bundle_id"].tolist()))}
        rows = sorted(
            (
                str(r.bundle_id),
                order[r.bundle_id],
                int(r.position),
                str(r.task_id),
                int(bool(r.is_gold)),
            )
            for r in bundles.itertuples(index=False)
        )
        with self._write() as c:
            known = c.execute("SELECT dataset FROM runs WHERE run_key=?", (run_key,)).fetchone()
            if known is None:
                c.execute(
                    "INSERT INTO runs (run_key, dataset, tasks_dir, n_bundles, registered_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_key, dataset, tasks_dir, len(order), self._now()),
                )
                c.executemany(
                    "INSERT INTO bundle_items (run_key, bundle_id, bundle_order, position, "
                    "task_id, is_gold) VALUES (?, ?, ?, ?, ?, ?)",
                    [(run_key, *r) for r in rows],
                )
                return
            stored = sorted(
                (r[0], r[1], r[2], r[3], r[4])
                for r in c.execute(
                    "SELECT bundle_id, bundle_order, position, task_id, is_gold "
                    "FROM bundle_items WHERE run_key=?",
                    (run_key,),
                )
            )
            if known[0] != dataset or stored != rows:
                raise StoreError(
                    f"{self.path}: task set {run_key} is stored with other bundles or another "
                    f"dataset ({known[0]!r}); serve the original tasks run dir or use a new database"
                )

    def worker(self, c: _Connection, worker_id: str) -> str:
        """The worker ``worker_id`` names here, by the one worker-ID rule
        (:meth:`~saleval.config.crowd.WorkerIdCase.key`, ``crowd.worker_id_case``): the
        spelling this store first recorded for that worker, else the ID without its
        surrounding spaces. Every way to a bundle (start, resume, the admin's assign)
        asks it, so "Ann " and "ann" hold one bundle under the default rule."""
        case = self.crowd.worker_id_case
        key = case.key(worker_id)
        known = c.execute(
            "SELECT worker_id FROM (SELECT worker_id, assigned_at AS t FROM assignments "
            "UNION ALL SELECT worker_id, first_seen_at FROM participants) "
            "GROUP BY worker_id ORDER BY MIN(t)"
        )
        return next((str(w) for (w,) in known if case.key(str(w)) == key), worker_id.strip())

    def assign(
        self,
        run_key: str,
        worker_id: str,
        *,
        session_token: str | None = None,
        resume_code: str | None = None,
        platform_session: str | None = None,
        client: str | None = None,
    ) -> Assignment:
        """The worker's bundle of this task set: their unfinished one, or the next free one.

        A bundle in progress is handed back only to a request that proves it belongs to
        its worker: the session token, the resume code shown at the start, or the same
        platform session id (Prolific's ``SESSION_ID``); the worker ID alone raises
        :class:`ResumeRequired`. Raises :class:`BundleRefused` when the worker already
        finished a bundle of this dataset, holds one in another task set of the same
        dataset, the client has claimed too many bundles lately, or no bundle is free.
        Expired leases are released first, in the same transaction.
        """
        with self._write() as c:
            run = c.execute("SELECT dataset FROM runs WHERE run_key=?", (run_key,)).fetchone()
            if run is None:
                raise StoreError(f"{self.path}: task set {run_key} is not registered")
            dataset = run[0]
            worker_id = self.worker(c, worker_id)
            _refuse_ended(c, run_key, worker_id)
            self._expire(c, run_key)
            held = c.execute(
                "SELECT * FROM assignments WHERE worker_id=? AND dataset=? AND released_at IS NULL",
                (worker_id, dataset),
            ).fetchone()
            if held is not None:
                a = _assignment(held)
                if a.run_key != run_key:
                    raise BundleRefused(
                        f"Worker {worker_id} already holds a bundle of the {dataset} dataset in "
                        "another task set. Each worker may take only one bundle per dataset."
                    )
                if a.done:
                    raise BundleRefused(
                        f"Worker {worker_id} has already completed a bundle of the {dataset} "
                        "dataset. Each worker may take only one bundle per dataset."
                    )
                if not _proves(a, session_token, resume_code, platform_session):
                    raise ResumeRequired(
                        f"Worker {worker_id} already has a bundle in progress. Continue in the "
                        "browser where you started, or enter the resume code you were shown "
                        "when you started."
                    )
                self._renew(c, a.assignment_id)
                return self._get(c, a.assignment_id)
            # A worker whose lease ran out takes their own bundle back while it is free.
            mine = c.execute(
                "SELECT * FROM assignments a WHERE worker_id=? AND run_key=? "
                "AND released_reason='expired' AND NOT EXISTS (SELECT 1 FROM assignments o "
                "WHERE o.run_key=a.run_key AND o.bundle_id=a.bundle_id AND o.released_at IS NULL) "
                "ORDER BY assignment_id DESC LIMIT 1",
                (worker_id, run_key),
            ).fetchone()
            if mine is not None and _proves(
                _assignment(mine), session_token, resume_code, platform_session
            ):
                return self._reactivate(c, int(mine["assignment_id"]))
            bound = self.settings.max_claims_per_client
            if client and bound > 0:
                since = _iso(self.clock() - timedelta(minutes=self.settings.claim_window_minutes))
                n = c.execute(
                    "SELECT COUNT(*) FROM assignments WHERE client=? AND assigned_at>=?",
                    (client, since),
                ).fetchone()[0]
                if n >= bound:
                    raise BundleRefused(
                        "Too many bundles were started from your network recently. "
                        "Please try again later.",
                        status=429,
                    )
            # The next free bundle in file order with no task this worker already answered
            # (a worker whose lease ran out never answers one task twice).
            free = c.execute(
                "SELECT bundle_id, COUNT(*) FROM bundle_items b WHERE run_key=? AND NOT EXISTS "
                "(SELECT 1 FROM assignments a WHERE a.run_key=b.run_key "
                "AND a.bundle_id=b.bundle_id AND a.released_at IS NULL) "
                "AND bundle_id NOT IN (SELECT i.bundle_id FROM bundle_items i "
                "JOIN answers n ON n.task_id=i.task_id "
                "JOIN assignments w ON w.assignment_id=n.assignment_id "
                "WHERE i.run_key=b.run_key AND w.run_key=b.run_key AND w.worker_id=?) "
                "GROUP BY bundle_id ORDER BY MIN(bundle_order) LIMIT 1",
                (run_key, worker_id),
            ).fetchone()
            if free is None:
                raise BundleRefused(
                    "Every bundle of this study has been taken. Thank you for your interest.",
                    status=410,
                )
            return self._insert(
                c, run_key, dataset, free[0], free[1], worker_id, client, platform_session
            )

    def reassign(self, run_key: str, bundle_id: str, worker_id: str) -> Assignment:
        """Release ``bundle_id`` if held and give it to ``worker_id``, in one transaction.

        The new worker resumes with the returned assignment's resume code.
        """
        with self._write() as c:
            worker_id = self.worker(c, worker_id)
            run = c.execute("SELECT dataset FROM runs WHERE run_key=?", (run_key,)).fetchone()
            n = c.execute(
                "SELECT COUNT(*) FROM bundle_items WHERE run_key=? AND bundle_id=?",
                (run_key, bundle_id),
            ).fetchone()[0]
            if run is None or n == 0:
                raise BundleRefused(f"Bundle {bundle_id} is not part of task set {run_key}.")
            holder = c.execute(
                "SELECT * FROM assignments WHERE run_key=? AND bundle_id=? AND released_at IS NULL",
                (run_key, bundle_id),
            ).fetchone()
            if holder is not None:
                if _assignment(holder).done:
                    raise BundleRefused(
                        f"Bundle {bundle_id} is completed; it cannot be reassigned."
                    )
                c.execute(
                    "UPDATE assignments SET released_at=?, released_reason='reassigned' "
                    "WHERE assignment_id=?",
                    (self._now(), holder["assignment_id"]),
                )
            busy = c.execute(
                "SELECT bundle_id FROM assignments WHERE worker_id=? AND dataset=? "
                "AND released_at IS NULL",
                (worker_id, run[0]),
            ).fetchone()
            if busy is not None:
                raise BundleRefused(
                    f"Worker {worker_id} already holds bundle {busy[0]} of the {run[0]} dataset."
                )
            return self._insert(c, run_key, run[0], bundle_id, n, worker_id, "admin", None)

    def by_session(self, token: str | None) -> Assignment | None:
        if not token:
            return None
        row = (
            self._conn()
            .execute("SELECT * FROM assignments WHERE session_token=?", (token,))
            .fetchone()
        )
        return None if row is None else _assignment(row)

    def acknowledge_instructions(self, assignment_id: int) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE assignments SET instructions_at=? "
                "WHERE assignment_id=? AND instructions_at IS NULL",
                (self._now(), assignment_id),
            )
            self._renew(c, assignment_id)


def _refuse_ended(c: _Connection, run_key: str, worker_id: str) -> None:
    """A participant screened out or whose session the policy ended never gets a bundle
    of the task set again, however they come back (docs/annotate.md#running-a-paid-study)."""
    ended = c.execute(
        "SELECT 1 FROM participants WHERE run_key=? AND worker_id=? "
        "AND (ended_at IS NOT NULL OR screened_out_at IS NOT NULL)",
        (run_key, worker_id),
    ).fetchone()
    if ended is not None:
        raise BundleRefused(
            f"The session of worker {worker_id} in this study has ended; please return the "
            "study on your platform.",
            status=403,
        )


def _proves(
    a: Assignment, session_token: str | None, resume_code: str | None, platform: str | None
) -> bool:
    """Does the request carry something only the worker of ``a`` has?"""
    checks = [
        (session_token, a.session_token),
        (_normal_code(resume_code), _normal_code(a.resume_code)),
        (platform, a.platform_session),
    ]
    return any(
        bool(given) and bool(held) and _same(str(given), str(held)) for given, held in checks
    )


def _same(a: str, b: str) -> bool:
    """Constant-time comparison of any two strings (non-ASCII included)."""
    return hmac.compare_digest(
        a.encode("utf-8", "backslashreplace"), b.encode("utf-8", "backslashreplace")
    )


def _normal_code(code: str | None) -> str:
    """Codes are typed by hand: case, spaces and the dash do not matter."""
    return re.sub(r"[^A-Z0-9]", "", (code or "").upper())


def _released_message(c: sqlite3.Connection, a: Assignment) -> str:
    n = c.execute(
        "SELECT COUNT(*) FROM answers WHERE assignment_id=?", (a.assignment_id,)
    ).fetchone()[0]
    why = {
        "expired": "your time for this bundle ran out and it went to another worker",
        "admin": "the study's organiser released your bundle",
        "reassigned": "the study's organiser gave your bundle to another worker",
        "attention": "your session ended after the attention checks",
    }.get(str(a.released_reason), "your bundle was released")
    return (
        f"Sorry: {why}. This answer was NOT saved. Your {n} earlier "
        f"answer{'s are' if n != 1 else ' is'} saved."
    )


def _assignment(row: sqlite3.Row) -> Assignment:
    return Assignment(**{k: row[k] for k in Assignment.__dataclass_fields__})
