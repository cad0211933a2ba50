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
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

from saleval.errors import UserError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_key TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    tasks_dir TEXT NOT NULL,
    n_bundles INTEGER NOT NULL,
    registered_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS bundle_items (
    run_key TEXT NOT NULL REFERENCES runs (run_key),
    bundle_id TEXT NOT NULL,
    bundle_order INTEGER NOT NULL,
    position INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    is_gold INTEGER NOT NULL,
    PRIMARY KEY (run_key, bundle_id, position),
    UNIQUE (run_key, bundle_id, task_id)
);
CREATE TABLE IF NOT EXISTS assignments (
    assignment_id INTEGER PRIMARY KEY,
    run_key TEXT NOT NULL REFERENCES runs (run_key),
    dataset TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    session_token TEXT NOT NULL UNIQUE,
    n_tasks INTEGER NOT NULL,
    assigned_at TEXT NOT NULL,
    instructions_at TEXT,
    completed_at TEXT,
    completion_code TEXT,
    resume_code TEXT NOT NULL DEFAULT '',
    lease_expires_at TEXT NOT NULL DEFAULT '9999-12-31T00:00:00.000+00:00',
    released_at TEXT,
    released_reason TEXT,
    client TEXT,
    platform_session TEXT,
    CHECK (completed_at IS NULL OR released_at IS NULL)
);
CREATE UNIQUE INDEX IF NOT EXISTS one_bundle_per_worker_per_dataset
    ON assignments (worker_id, dataset) WHERE released_at IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS one_worker_per_bundle
    ON assignments (run_key, bundle_id) WHERE released_at IS NULL;
CREATE INDEX IF NOT EXISTS assignments_by_client ON assignments (client, assigned_at);
CREATE TABLE IF NOT EXISTS shown (
    assignment_id INTEGER NOT NULL REFERENCES assignments (assignment_id),
    position INTEGER NOT NULL,
    shown_at TEXT NOT NULL,
    PRIMARY KEY (assignment_id, position)
);
CREATE TABLE IF NOT EXISTS answers (
    assignment_id INTEGER NOT NULL REFERENCES assignments (assignment_id),
    position INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    answer TEXT NOT NULL,
    started_at TEXT NOT NULL,
    submitted_at TEXT NOT NULL,
    PRIMARY KEY (assignment_id, position),
    UNIQUE (assignment_id, task_id)
);
"""

# Version 1 kept one assignment per bundle for ever (table constraints); version 2 adds
# leases, resume codes and released assignments, so its uniqueness rules are partial
# indexes over the assignments still active.
_V1_COLUMNS = (
    "assignment_id, run_key, dataset, bundle_id, worker_id, session_token, n_tasks, "
    "assigned_at, instructions_at, completed_at, completion_code"
)

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def utcnow() -> str:
    """Now as ISO 8601 UTC with milliseconds, the format of every stored time."""
    return _iso(datetime.now(UTC))


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds")


class StoreError(UserError, RuntimeError):
    """The database does not match what the app serves (e.g. a changed task set)."""


class BundleRefused(Exception):
    """The worker may not get a bundle now; ``reason`` is shown to them."""

    def __init__(self, reason: str, status: int = 409) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class ResumeRequired(BundleRefused):
    """The worker ID holds a bundle in progress and the request proved no right to it."""


class AnswerRejected(Exception):
    """A submitted answer cannot be stored (unknown position, task not shown yet...).

    Nothing was written when this is raised: the page says the answer was not saved.
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


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


@dataclass(frozen=True)
class LeasePolicy:
    """How long an idle bundle stays with its worker, and how many bundles one client may claim.

    A lease runs ``lease_minutes`` from the worker's last action (start, instructions,
    a task shown, an answer); when it has run out, the next claim by anyone returns the
    bundle to the pool. ``max_claims`` new bundles per client address per
    ``claim_window_minutes`` (0: no bound).
    """

    lease_minutes: float = 60.0
    max_claims: int = 5
    claim_window_minutes: float = 60.0


class AnnotationStore:
    """Thread-safe access to the annotation database; one connection per thread.

    ``readonly=True`` opens an existing database without writing to it (an archived copy,
    a read-only mount): nothing is created, upgraded or locked for writing, and answers
    still in a ``-wal`` file beside it are read too (:meth:`_open_readonly`).
    """

    def __init__(
        self,
        path: str | Path,
        synchronous: str = "FULL",
        completion_code: str | None = None,
        busy_timeout_s: float = 30.0,
        lease: LeasePolicy | None = None,
        readonly: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = Path(path)
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous={synchronous!r}: use one of {SYNCHRONOUS}")
        self.synchronous = synchronous.upper()
        self.completion_code = completion_code
        self.busy_timeout_s = busy_timeout_s
        self.lease = lease or LeasePolicy()
        self.readonly = readonly
        self.clock = clock or (lambda: datetime.now(UTC))
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._uri: str | None = None
        self._copy: tempfile.TemporaryDirectory[str] | None = None
        if readonly:
            self._open_readonly()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = self._conn()
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        self._migrate_v1()
        with self._write() as c:
            c.executescript_safe(_SCHEMA)
            row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {row[0]}, this saleval writes {SCHEMA_VERSION}"
                )

    def _open_readonly(self) -> None:
        """Open without writing a byte beside the database, and read every committed answer.

        * A ``-wal`` with answers in it but no ``-shm`` (an archive copied without the
          index; no server has it open, which would keep ``-shm``): SQLite could read the
          WAL only after writing a new ``-shm`` next to it, and ``immutable=1`` would
          ignore the WAL and its answers. The database and its WAL are copied into a
          private temporary directory and read there.
        * Otherwise ``mode=ro`` in place (a live server's store: the current state).
        * If that fails: with answers in a WAL, the private copy again; without, the
          WAL cannot hide anything and ``immutable=1`` reads the main file (a read-only
          medium where SQLite cannot even create the WAL index).

        A WAL that cannot be read either way is an error naming both files, never a
        silent export without its answers (docs/annotate.md#7-export).
        """
        if not self.path.is_file():
            raise StoreError(f"{self.path}: no such database")
        wal = self.path.with_name(self.path.name + "-wal")
        shm = self.path.with_name(self.path.name + "-shm")
        has_wal = wal.is_file() and wal.stat().st_size > 0
        if has_wal and not shm.exists():
            self._open_private_copy(wal, None)
            return
        try:
            self._open_uri(f"{self.path.resolve().as_uri()}?mode=ro")
            return
        except sqlite3.Error as err:
            first = err
        if has_wal:
            self._open_private_copy(wal, first)
            return
        try:
            self._open_uri(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1")
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot be opened read-only ({first}; {err})") from None

    def _open_uri(self, uri: str) -> None:
        """Connect through ``uri`` and check the schema version; sqlite3.Error if unreadable."""
        self._uri = uri
        self._local = threading.local()
        try:
            row = (
                self._conn().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            )
        except sqlite3.Error:
            self.close()
            raise
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {None if row is None else row[0]}, this "
                f"saleval reads {SCHEMA_VERSION}; open it once writable to upgrade it"
            )

    def _open_private_copy(self, wal: Path, why: Exception | None) -> None:
        """Read the database and its WAL from a copy in a private temporary directory
        (removed by :meth:`close`), so the WAL's answers are read and nothing is written
        beside the original."""
        self._copy = tempfile.TemporaryDirectory(prefix="saleval-annotate-ro-")
        copy = Path(self._copy.name, self.path.name)
        try:
            shutil.copyfile(self.path, copy)
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            self._open_uri(f"{copy.as_uri()}?mode=ro")
        except (OSError, sqlite3.Error) as err:
            self.close()
            raise StoreError(
                f"{self.path}: its write-ahead log {wal} holds answers not yet in the main "
                f"file, and they cannot be read without writing beside it ({why or err}; "
                f"copying both files to a temporary directory failed: {err}). Copy "
                f"{self.path.name} and {wal.name} together into a writable directory and "
                "export from there"
            ) from None
        log.info("%s: read with its write-ahead log through a private copy", self.path)

    # -- connections --------------------------------------------------------------
    def _conn(self) -> _Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            raw = sqlite3.connect(
                self._uri or self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,  # autocommit; transactions are explicit below
                check_same_thread=False,
                factory=_Connection,
                uri=self._uri is not None,
            )
            raw.row_factory = sqlite3.Row
            if not self.readonly:
                raw.execute(f"PRAGMA synchronous={self.synchronous}")
            raw.execute("PRAGMA foreign_keys=ON")
            raw.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            self._local.con = raw
            with self._lock:
                self._all.append(raw)
            con = raw
        return con

    @contextmanager
    def _write(self) -> Iterator[_Connection]:
        """One write transaction, taking the write lock up front so reads inside it are current.

        Threads of this process queue on a Python lock first: SQLite's own busy handler
        sleeps in growing steps, which under 50 concurrent writers turned into
        second-long tail latencies. Other processes still meet ``busy_timeout``.
        """
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        con = self._conn()
        with self._write_lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                if con.in_transaction:  # SQLITE_FULL and the like roll back by themselves
                    con.execute("ROLLBACK")
                raise
            try:
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

    def _migrate_v1(self) -> None:
        """Rebuild a version-1 ``assignments`` table (table constraints) as version 2.

        SQLite cannot drop a table constraint, so the table is copied; foreign keys are
        off during the copy (``shown`` and ``answers`` point at it) and checked after.
        """
        con = self._conn()
        row = con.execute(
            "SELECT 1 FROM sqlite_master WHERE name='meta' AND type='table'"
        ).fetchone()
        version = (
            row and con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        )
        if not version or int(version[0]) != 1:
            return
        con.execute("PRAGMA foreign_keys=OFF")
        try:
            with self._write() as c:
                ddl = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS assignments") :]
                ddl = ddl[: ddl.index(");") + 1].replace(
                    "IF NOT EXISTS assignments", "assignments_v2"
                )
                c.execute(ddl)
                c.execute(
                    f"INSERT INTO assignments_v2 ({_V1_COLUMNS}) SELECT {_V1_COLUMNS} "
                    "FROM assignments"
                )
                c.execute("DROP TABLE assignments")
                c.execute("ALTER TABLE assignments_v2 RENAME TO assignments")
                c.executescript_safe(_SCHEMA)  # the indexes
                # v1 bundles were never released: each keeps a lease from now, and a
                # resume code of its own
                for (aid,) in c.execute(
                    "SELECT assignment_id FROM assignments WHERE resume_code=''"
                ).fetchall():
                    c.execute(
                        "UPDATE assignments SET resume_code=?, lease_expires_at=? "
                        "WHERE assignment_id=?",
                        (_new_code(), self._lease_end(), aid),
                    )
                bad = c.execute("PRAGMA foreign_key_check").fetchall()
                if bad:
                    raise StoreError(f"{self.path}: upgrade broke foreign keys: {bad[:3]}")
                c.execute(
                    "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),)
                )
        finally:
            con.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                con.close()
            self._all.clear()
        self._local = threading.local()
        copy, self._copy = self._copy, None
        if copy is not None:  # the private copy of a read-only open
            copy.cleanup()

    def journal_mode(self) -> str:
        return str(self._conn().execute("PRAGMA journal_mode").fetchone()[0])

    def backup(self, dest: str | Path) -> Path:
        """A consistent copy of the live database, WAL included (SQLite's online backup API).

        Safe while the app serves: the copy is one snapshot of committed transactions.
        Copying the ``.sqlite`` file alone would miss answers still in ``-wal``.
        """
        dest = Path(dest)
        if dest.resolve() == self.path.resolve():
            raise StoreError(f"{dest}: the backup would overwrite the live database")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".partial")
        tmp.unlink(missing_ok=True)
        target = sqlite3.connect(tmp)
        try:
            self._conn().backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            ok = target.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            target.close()
        if ok != "ok":
            raise StoreError(f"{tmp}: the backup failed its integrity check: {ok}")
        tmp.replace(dest)
        return dest

    # -- time ---------------------------------------------------------------------
    def _now(self) -> str:
        return _iso(self.clock())

    def _lease_end(self) -> str:
        return _iso(self.clock() + timedelta(minutes=self.lease.lease_minutes))

    # -- task sets ----------------------------------------------------------------
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

    # -- assignments --------------------------------------------------------------
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
            if client and self.lease.max_claims > 0:
                since = _iso(self.clock() - timedelta(minutes=self.lease.claim_window_minutes))
                n = c.execute(
                    "SELECT COUNT(*) FROM assignments WHERE client=? AND assigned_at>=?",
                    (client, since),
                ).fetchone()[0]
                if n >= self.lease.max_claims:
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

    def reassign(self, run_key: str, bundle_id: str, worker_id: str) -> Assignment:
        """Release ``bundle_id`` if held and give it to ``worker_id``, in one transaction.

        The new worker resumes with the returned assignment's resume code.
        """
        with self._write() as c:
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

    # -- tasks and answers --------------------------------------------------------
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
            code = self.completion_code or _new_code()
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
    }.get(str(a.released_reason), "your bundle was released")
    return (
        f"Sorry: {why}. This answer was NOT saved. Your {n} earlier "
        f"answer{'s are' if n != 1 else ' is'} saved."
    )


class _Connection(sqlite3.Connection):
    def executescript_safe(self, script: str) -> None:
        """Run DDL statements one by one inside the open transaction.

        ``executescript`` would COMMIT the transaction first; splitting keeps schema
        creation and the version check atomic.
        """
        for stmt in script.split(";"):
            if stmt.strip():
                self.execute(stmt)


def _assignment(row: sqlite3.Row) -> Assignment:
    return Assignment(**{k: row[k] for k in Assignment.__dataclass_fields__})


def _new_code() -> str:
    """A completion code workers copy by hand: 8 characters without 0/O or 1/I look-alikes."""
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    raw = "".join(secrets.choice(alphabet) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"
