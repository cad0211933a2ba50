"""The database under the annotation store: SQLite in WAL mode, one commit per answer.

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

An assignment is active until it is released: its lease ran out
(``annotate.lease_minutes`` after the worker's last action), or the admin released or
reassigned it. A released assignment keeps its answers (they were acknowledged) and its
bundle goes back to the pool. Every lease change is a ``BEGIN IMMEDIATE`` transaction
like an answer, so a late answer and the claim that releases its bundle are ordered:
exactly one of them wins. docs/annotate.md describes the rules for operators.

Times are ISO 8601 in UTC with milliseconds (``2025-01-31T12:00:00.123+00:00``).

The store is three layers, one module each: this one (schema and its upgrade,
connections, transactions, read-only opening, backups), which knows nothing of bundles,
leases or answers; task sets, assignments and leases
(:mod:`saleval.annotate.store_leases`); and tasks, answers and the tables read back
(:mod:`saleval.annotate.store_answers`, whose :class:`AnnotationStore` is the store).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from saleval.config.annotate import AnnotateConfig, AnnotateCrowdConfig
from saleval.errors import UserError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3

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
CREATE TABLE IF NOT EXISTS participants (
    run_key TEXT NOT NULL REFERENCES runs (run_key),
    worker_id TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    first_seen_at TEXT NOT NULL,
    study_id TEXT,
    platform_session TEXT,
    client TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    passed_at TEXT,
    screened_out_at TEXT,
    ended_at TEXT,
    ended_reason TEXT,
    PRIMARY KEY (run_key, worker_id),
    CHECK (passed_at IS NULL OR screened_out_at IS NULL)
);
CREATE TABLE IF NOT EXISTS comprehension_attempts (
    run_key TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    submitted_at TEXT NOT NULL,
    answers TEXT NOT NULL,
    wrong TEXT NOT NULL,
    passed INTEGER NOT NULL,
    PRIMARY KEY (run_key, worker_id, attempt),
    FOREIGN KEY (run_key, worker_id) REFERENCES participants (run_key, worker_id)
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


class StoreDatabase:
    """One SQLite database in WAL mode, thread-safe with one connection per thread.

    Its settings are the ``annotate`` and ``crowd`` nodes of ``saleval-annotate``'s config,
    typed (:class:`~saleval.config.annotate.AnnotateConfig`,
    :class:`~saleval.config.annotate.AnnotateCrowdConfig`; their defaults when not given):
    ``synchronous`` and ``completion_code`` here; a lease runs ``lease_minutes`` from the
    worker's last action (start, instructions, a task shown, an answer), and when it has
    run out the next claim by anyone returns the bundle to the pool;
    ``max_claims_per_client`` new bundles per client address per ``claim_window_minutes``
    (0: no bound); ``crowd.worker_id_case``, the import's rule of which IDs name one
    worker, so a worker is one in the app and in the scores. The path is given apart:
    a store is also opened on an archived copy or a backup.

    ``readonly=True`` opens an existing database without writing to it (an archived copy,
    a read-only mount): nothing is created, upgraded or locked for writing, and answers
    still in a ``-wal`` file beside it are read too (:meth:`_open_readonly`).
    """

    def __init__(
        self,
        path: str | Path,
        settings: AnnotateConfig | None = None,
        crowd: AnnotateCrowdConfig | None = None,
        busy_timeout_s: float = 30.0,
        readonly: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = Path(path)
        self.settings = settings or AnnotateConfig()
        self.crowd = crowd or AnnotateCrowdConfig()
        synchronous = str(self.settings.synchronous)
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"annotate.synchronous={synchronous!r}: use one of {SYNCHRONOUS}")
        self.synchronous = synchronous.upper()
        self.busy_timeout_s = busy_timeout_s
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
        upgrade_from_v1(self)
        with self._write() as c:
            c.executescript_safe(_SCHEMA)
            row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif int(row[0]) == 2:  # version 3 only adds the participants' tables
                c.execute(
                    "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),)
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
        return _iso(self.clock() + timedelta(minutes=self.settings.lease_minutes))


def upgrade_from_v1(db: StoreDatabase) -> None:
    """Rebuild a version-1 ``assignments`` table (table constraints) as version 2.

    SQLite cannot drop a table constraint, so the table is copied; foreign keys are
    off during the copy (``shown`` and ``answers`` point at it) and checked after.
    """
    con = db._conn()
    row = con.execute("SELECT 1 FROM sqlite_master WHERE name='meta' AND type='table'").fetchone()
    version = row and con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if not version or int(version[0]) != 1:
        return
    con.execute("PRAGMA foreign_keys=OFF")
    try:
        with db._write() as c:
            ddl = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS assignments") :]
            ddl = ddl[: ddl.index(");") + 1].replace("IF NOT EXISTS assignments", "assignments_v2")
            c.execute(ddl)
            c.execute(
                f"INSERT INTO assignments_v2 ({_V1_COLUMNS}) SELECT {_V1_COLUMNS} FROM assignments"
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
                    (_new_code(), db._lease_end(), aid),
                )
            bad = c.execute("PRAGMA foreign_key_check").fetchall()
            if bad:
                raise StoreError(f"{db.path}: upgrade broke foreign keys: {bad[:3]}")
            c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
    finally:
        con.execute("PRAGMA foreign_keys=ON")


class _Connection(sqlite3.Connection):
    def executescript_safe(self, script: str) -> None:
        """Run DDL statements one by one inside the open transaction.

        ``executescript`` would COMMIT the transaction first; splitting keeps schema
        creation and the version check atomic.
        """
        for stmt in script.split(";"):
            if stmt.strip():
                self.execute(stmt)


def _new_code() -> str:
    """A completion code workers copy by hand: 8 characters without 0/O or 1/I look-alikes."""
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    raw = "".join(secrets.choice(alphabet) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"
