"""The annotation app's durable store: SQLite in WAL mode, one commit per answer.

Why SQLite: a study runs on one machine for days; a crash, a kill or a reboot must not
lose an answer a worker already saw acknowledged. Every answer is its own
``BEGIN IMMEDIATE … COMMIT`` transaction with ``synchronous=FULL`` by default, so once
the server has redirected the worker to the next task, the answer is on disk.

The rules of the study live in the schema, not only in Python, so that no code path (two
server processes on one database, a double-clicked button, a replayed request) can
break them:

* ``UNIQUE (worker_id, dataset)`` on assignments: one bundle per worker per dataset,
  across every task set stored in the same database;
* ``UNIQUE (run_key, bundle_id)``: a bundle goes to one worker;
* ``PRIMARY KEY (assignment_id, position)`` and ``UNIQUE (assignment_id, task_id)`` on
  answers: an answer is never stored twice; the first one wins.

Times are ISO 8601 in UTC with milliseconds (``2025-01-31T12:00:00.123+00:00``).
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from saleval.errors import UserError

SCHEMA_VERSION = 1

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
    CONSTRAINT one_bundle_per_worker_per_dataset UNIQUE (worker_id, dataset),
    CONSTRAINT one_worker_per_bundle UNIQUE (run_key, bundle_id)
);
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

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def utcnow() -> str:
    """Now as ISO 8601 UTC with milliseconds, the format of every stored time."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class StoreError(UserError, RuntimeError):
    """The database does not match what the app serves (e.g. a changed task set)."""


class BundleRefused(Exception):
    """The worker may not get a bundle now; ``reason`` is shown to them."""

    def __init__(self, reason: str, status: int = 409) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class AnswerRejected(Exception):
    """A submitted answer cannot be stored (unknown position, task not shown yet...)."""

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

    @property
    def done(self) -> bool:
        return self.completed_at is not None


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


class AnnotationStore:
    """Thread-safe access to the annotation database; one connection per thread."""

    def __init__(
        self,
        path: str | Path,
        synchronous: str = "FULL",
        completion_code: str | None = None,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous={synchronous!r}: use one of {SYNCHRONOUS}")
        self.synchronous = synchronous.upper()
        self.completion_code = completion_code
        self.busy_timeout_s = busy_timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        con = self._conn()
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
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

    # -- connections --------------------------------------------------------------
    def _conn(self) -> _Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            raw = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,  # autocommit; transactions are explicit below
                check_same_thread=False,
                factory=_Connection,
            )
            raw.row_factory = sqlite3.Row
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
        con = self._conn()
        with self._write_lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                con.close()
            self._all.clear()
        self._local = threading.local()

    def journal_mode(self) -> str:
        return str(self._conn().execute("PRAGMA journal_mode").fetchone()[0])

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
                    (run_key, dataset, tasks_dir, len(order), utcnow()),
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
    def assign(self, run_key: str, worker_id: str) -> Assignment:
        """The worker's bundle of this task set: their unfinished one, or the next free one.

        Raises :class:`BundleRefused` when the worker already finished a bundle of this
        dataset, holds one in another task set of the same dataset, or no bundle is left.
        """
        with self._write() as c:
            run = c.execute("SELECT dataset FROM runs WHERE run_key=?", (run_key,)).fetchone()
            if run is None:
                raise StoreError(f"{self.path}: task set {run_key} is not registered")
            dataset = run[0]
            held = c.execute(
                "SELECT * FROM assignments WHERE worker_id=? AND dataset=?", (worker_id, dataset)
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
                return a
            free = c.execute(
                "SELECT bundle_id, COUNT(*) FROM bundle_items b WHERE run_key=? AND NOT EXISTS "
                "(SELECT 1 FROM assignments a WHERE a.run_key=b.run_key AND a.bundle_id=b.bundle_id) "
                "GROUP BY bundle_id ORDER BY MIN(bundle_order) LIMIT 1",
                (run_key,),
            ).fetchone()
            if free is None:
                raise BundleRefused(
                    "Every bundle of this study has been taken. Thank you for your interest.",
                    status=410,
                )
            c.execute(
                "INSERT INTO assignments (run_key, dataset, bundle_id, worker_id, session_token, "
                "n_tasks, assigned_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_key,
                    dataset,
                    free[0],
                    worker_id,
                    secrets.token_urlsafe(24),
                    free[1],
                    utcnow(),
                ),
            )
            row = c.execute(
                "SELECT * FROM assignments WHERE worker_id=? AND dataset=?", (worker_id, dataset)
            ).fetchone()
            return _assignment(row)

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
                (utcnow(), assignment_id),
            )

    # -- tasks and answers --------------------------------------------------------
    def next_task(self, assignment: Assignment) -> NextTask | None:
        """The first unanswered task of the bundle, marked as shown now (once), or None."""
        with self._write() as c:
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
                    (assignment.assignment_id, position, utcnow()),
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
        yet, or that is not in their bundle, is rejected.
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
                (assignment_id, position, item[0], answer, shown[0], utcnow()),
            )
            n_answered = c.execute(
                "SELECT COUNT(*) FROM answers WHERE assignment_id=?", (assignment_id,)
            ).fetchone()[0]
            if n_answered < a.n_tasks:
                return AnswerResult(True, False, None)
            code = self.completion_code or _new_code()
            c.execute(
                "UPDATE assignments SET completed_at=?, completion_code=? WHERE assignment_id=?",
                (utcnow(), code, assignment_id),
            )
            return AnswerResult(True, True, code)

    # -- reading back ---------------------------------------------------------------
    def answers(self, run_key: str) -> pd.DataFrame:
        """Every committed answer of a task set, in bundle order then position."""
        sql = (
            "SELECT a.worker_id, n.task_id, n.answer, n.started_at, n.submitted_at, "
            "a.bundle_id, n.position, a.completed_at IS NOT NULL AS bundle_complete "
            "FROM answers n JOIN assignments a USING (assignment_id) "
            "JOIN bundle_items b ON b.run_key=a.run_key AND b.bundle_id=a.bundle_id "
            "AND b.position=n.position WHERE a.run_key=? ORDER BY b.bundle_order, n.position"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))

    def progress(self, run_key: str) -> pd.DataFrame:
        """One row per bundle: who holds it, how far they are, when, and the completion code."""
        sql = (
            "SELECT b.bundle_id, COUNT(*) AS n_tasks, a.worker_id, a.assigned_at, "
            "a.completed_at, a.completion_code, "
            "(SELECT COUNT(*) FROM answers n WHERE n.assignment_id=a.assignment_id) AS n_answered, "
            "(SELECT MAX(submitted_at) FROM answers n WHERE n.assignment_id=a.assignment_id) "
            "AS last_answer_at "
            "FROM bundle_items b LEFT JOIN assignments a "
            "ON a.run_key=b.run_key AND a.bundle_id=b.bundle_id "
            "WHERE b.run_key=? GROUP BY b.bundle_id ORDER BY MIN(b.bundle_order)"
        )
        df = pd.read_sql_query(sql, self._conn(), params=(run_key,))
        df["n_answered"] = df["n_answered"].fillna(0).astype(int)
        return df

    def completions(self, run_key: str) -> pd.DataFrame:
        """Finished bundles with their completion codes (for paying workers)."""
        sql = (
            "SELECT worker_id, bundle_id, completion_code, assigned_at, completed_at "
            "FROM assignments WHERE run_key=? AND completed_at IS NOT NULL ORDER BY completed_at"
        )
        return pd.read_sql_query(sql, self._conn(), params=(run_key,))


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
