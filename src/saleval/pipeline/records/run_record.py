"""A stage run's record, ``run.json``, as one typed, frozen object (docs/architecture.md,
section 2; docs/tracking.md, *Run records you can trust*).

:class:`RunRecord` is the only code that knows the file's name and its fields: every stage
writes its record through it (:meth:`RunRecord.write`) and every reader reads one through
it (:meth:`RunRecord.read`). It says what the run is (stage, MLflow run id and store,
fingerprint, parents, provenance), which process ran it, how it ended (``status``), the
SHA-256 of every declared table it wrote (``checksums``) and what its tracking store took
(``tracking``, :mod:`saleval.pipeline.tracker.tracking_journal`).

Before a stage reads a parent it asks the parent's record two questions, each one method:

* :meth:`RunRecord.status_problem`: is the run FINISHED? A FAILED, KILLED or RUNNING run's
  tables may be partial; it is refused as an input in one line naming its status and the
  fix (rerun it, or ``allow_unfinished_inputs=true``, which the child's provenance records).
* :meth:`RunRecord.changed_tables`: does every table still hash to what the run recorded?
  A table edited by hand, truncated or corrupted after the run finished is refused in one
  line naming the table and the run.

Runs recorded before ``run.json`` carried ``checksums`` have nothing to check against and
are read as they are. :func:`ancestry` is the one walk up a run's parents.

>>> RunRecord(status="FINISHED").status_problem() is None
True
>>> RunRecord(status="FAILED", error="OSError(28, 'No space left on device')").status_problem()
"is FAILED (OSError(28, 'No space left on device')), not FINISHED"
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from saleval import renames
from saleval.errors import UserError
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.provenance import Provenance

log = logging.getLogger(__name__)

#: the record's file in a run dir (the one place its name is written)
RUN_JSON = "run.json"
#: the status of a run whose work completed (MLflow's word, which ``run.json`` shares)
FINISHED = "FINISHED"
#: ``run.json``'s field: table file name (relative to the run dir) -> ``sha256:<hex>``
CHECKSUMS = "checksums"
#: the key of the override that accepts a run that is not FINISHED as an input
ALLOW_UNFINISHED = "allow_unfinished_inputs"

_ALGORITHM = "sha256"
#: (path, size, mtime_ns) -> digest: a table read twice in one process is hashed once
_SEEN: dict[tuple[str, int, int], str] = {}


class DamagedRecordError(UserError, ValueError):
    """A ``run.json`` that is not a whole JSON object (cut short by a full disk or a copy,
    or edited by hand): one line naming the file and the fix."""


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: what a stage run is, where it is tracked, and how it ended.

    Fields a record does not hold are None (a run recorded by an older saleval, or a
    record written by hand); fields this version does not know are kept in ``extra`` and
    written back unchanged.
    """

    stage: str | None = None
    #: the MLflow run's id, and the store it was meant for
    run_id: str | None = None
    tracking_uri: str | None = None
    #: what it computed (:func:`saleval.pipeline.records.fingerprints.stage_fingerprint`)
    fingerprint: str | None = None
    #: each parent by its label (the input's name, ``<name>.<i>`` for several): run id, dir
    parents: Mapping[str, str | None] = field(default_factory=dict)
    parent_dirs: Mapping[str, str] = field(default_factory=dict)
    #: a simulated crowd answered upstream (also in ``provenance``; older runs hold only this)
    simulated: bool = False
    #: what its rows mean (:mod:`saleval.pipeline.records.provenance`); None: recorded before the field
    provenance: Provenance | None = None
    #: which machine and process ran it (the jobs of a parallel multirun or a cluster differ)
    host: str | None = None
    pid: int | None = None
    #: the key of the saved MLflow view of its per-method rows (docs/tracking.md#views)
    mlflow_view: str | None = None
    #: table file name -> ``sha256:<hex>`` of each declared table written; None: recorded
    #: before checksums
    checksums: Mapping[str, str] | None = None
    #: what its tracking store took (:meth:`saleval.pipeline.tracker.tracking_journal.Journal.record`)
    tracking: Mapping[str, Any] | None = None
    #: RUNNING, FINISHED, FAILED or KILLED; the seconds it took, its error
    status: str | None = None
    seconds: float | None = None
    error: str | None = None
    #: its copies in other stores, store URI -> run id (``saleval-catch-up``)
    copies: Mapping[str, str] | None = None
    #: fields written by another version of saleval, kept as they are
    extra: Mapping[str, Any] = field(default_factory=dict)

    # -- the file ----------------------------------------------------------------------
    @staticmethod
    def path_in(run_dir: str | Path) -> Path:
        """Where a run dir keeps its record."""
        return Path(run_dir, RUN_JSON)

    @staticmethod
    def exists(run_dir: str | Path) -> bool:
        """Whether ``run_dir`` holds a record (is a stage's run dir)."""
        return RunRecord.path_in(run_dir).is_file()

    @classmethod
    def read(cls, run_dir: str | Path) -> RunRecord:
        """The record of ``run_dir`` (``FileNotFoundError`` when it has none,
        :class:`DamagedRecordError`, a ``ValueError``, when it is not a whole JSON object)."""
        path = cls.path_in(run_dir)
        text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            cut = "not valid JSON" if text.rstrip().endswith("}") else "cut short"
            raise DamagedRecordError(
                f"{path} is damaged ({cut}: {err.msg}, line {err.lineno} column "
                f"{err.colno}): the run that wrote it cannot be trusted as an input; rerun "
                f"that stage (or restore {path.name} from a copy of {path.parent})"
            ) from None
        if not isinstance(data, Mapping):
            raise DamagedRecordError(
                f"{path} is damaged (a JSON {type(data).__name__}, not an object): rerun the "
                f"stage that wrote {path.parent} (or restore {path.name} from a copy)"
            )
        return cls.from_json(data)

    def write(self, run_dir: str | Path) -> None:
        """Write the record into ``run_dir``, whole or not at all (:func:`write_atomically`)."""
        write_atomically(self.path_in(run_dir), json.dumps(self.to_json(), indent=2))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record a ``run.json`` object holds.

        >>> r = RunRecord.from_json({"stage": "explain", "simulated": "true", "new": 1})
        >>> r.stage, r.simulated, r.extra
        ('explain', True, {'new': 1})
        """
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        prov = data.get("provenance")
        checksums = data.get(CHECKSUMS)
        return cls(
            stage=_opt_str(data.get("stage")),
            run_id=_opt_str(data.get("run_id")),
            tracking_uri=_opt_str(data.get("tracking_uri")),
            fingerprint=_opt_str(data.get("fingerprint")),
            parents=dict(data.get("parents") or {}),
            parent_dirs={str(k): str(v) for k, v in (data.get("parent_dirs") or {}).items()},
            simulated=str(data.get("simulated", "")).lower() == "true",
            provenance=Provenance.from_json(prov) if isinstance(prov, Mapping) else None,
            host=_opt_str(data.get("host")),
            pid=None if data.get("pid") is None else int(data["pid"]),
            mlflow_view=_opt_str(data.get("mlflow_view")),
            checksums=dict(checksums) if isinstance(checksums, Mapping) else None,
            tracking=data.get("tracking"),
            status=_opt_str(data.get("status")),
            seconds=data.get("seconds"),
            error=_opt_str(data.get("error")),
            copies=data.get("copies"),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        """The ``run.json`` object: what the run is, then how it ended (empty optional
        fields left out).

        >>> RunRecord("score", "r1", simulated=True, status="FINISHED").to_json()["simulated"]
        'true'
        """
        out: dict[str, Any] = {
            "stage": self.stage,
            "run_id": self.run_id,
            "tracking_uri": self.tracking_uri,
            "fingerprint": self.fingerprint,
            "parents": dict(self.parents),
            "parent_dirs": dict(self.parent_dirs),
            "simulated": "true" if self.simulated else "false",
            "provenance": None if self.provenance is None else self.provenance.to_json(),
            "host": self.host,
            "pid": self.pid,
        }
        if self.mlflow_view:
            out["mlflow_view"] = self.mlflow_view
        optional = {
            CHECKSUMS: None if self.checksums is None else dict(self.checksums),
            "tracking": None if self.tracking is None else dict(self.tracking),
            "status": self.status,
            "seconds": self.seconds,
            "error": self.error,
            "copies": None if self.copies is None else dict(self.copies),
        }
        return {**out, **{k: v for k, v in optional.items() if v is not None}, **self.extra}

    def provenance_of_run(self, run_dir: str | Path, cfg: DictConfig | None = None) -> Provenance:
        """What the run's rows mean: its ``provenance``, or for a run recorded before the
        field, what its ``config.yaml`` (``cfg`` when already read) says
        (:meth:`Provenance.of_run <saleval.pipeline.records.provenance.Provenance.of_run>`)."""
        return Provenance.of_run(run_dir, self.provenance, self.simulated, cfg)

    # -- fit to be read ------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    def status_problem(self) -> str | None:
        """Why this run may not be read as an input (None: it is FINISHED):
        ``is FAILED (<error>), not FINISHED``, ``is KILLED, not FINISHED``, ..."""
        if self.status == FINISHED:
            return None
        if not self.status:
            return "has no status in its run.json (no saleval stage wrote it)"
        error = " ".join(str(self.error or "").split())
        return f"is {self.status}" + (f" ({error[:160]})" if error else "") + ", not FINISHED"

    def unfinished_mark(self, run_dir: str | Path) -> str | None:
        """How a child's provenance names this run when it was read although it had not
        finished (``allow_unfinished_inputs=true``): ``<run dir> (<status>)``; None when it
        finished.

        >>> RunRecord(status="KILLED").unfinished_mark("/o/explain/1")
        '/o/explain/1 (KILLED)'
        """
        if self.status_problem() is None:
            return None
        return f"{run_dir} ({self.status or 'no status'})"

    def unfinished_message(
        self, name: str, run_dir: str | Path, sweep: str | Path | None = None
    ) -> str | None:
        """The one line that refuses ``inputs.<name>=<run_dir>`` when it is not FINISHED
        (None when it is): its stage, its status and what to do. ``sweep``: the run is a job
        of that ``-m`` sweep dir, which is rerun with the same command and ``hydra.sweep.dir``.

        >>> print(RunRecord("explain", status="KILLED").unfinished_message("explain", "/o/explain/1"))
        inputs.explain=/o/explain/1: this saleval-explain run is KILLED, not FINISHED: its tables may be incomplete; rerun it, or pass allow_unfinished_inputs=true to read it anyway (this run's provenance then records it)
        """
        problem = self.status_problem()
        if problem is None:
            return None
        stage = self.stage or "?"
        rerun = (
            f"rerun the sweep's unfinished jobs (the same command with hydra.sweep.dir={sweep}) "
            "or list the jobs that finished"
            if sweep is not None
            else "rerun it"
        )
        what = f"sweep job {run_dir}" if sweep is not None else f"{run_dir}"
        return (
            f"inputs.{name}={what}: this saleval-{stage} run {problem}: its tables may be "
            f"incomplete; {rerun}, or pass {ALLOW_UNFINISHED}=true to read it anyway (this "
            "run's provenance then records it)"
        )

    def changed_tables(self, run_dir: str | Path) -> list[str]:
        """The tables of ``run_dir`` whose bytes differ from what this record says the run
        wrote (a table that is gone is left to its reader, which names it)."""
        if self.checksums is None:
            return []  # recorded before run.json carried checksums
        changed = []
        for name, digest in self.checksums.items():
            path = Path(run_dir, str(name))
            if path.is_file() and file_digest(path) != digest:
                changed.append(str(name))
        return sorted(changed)

    def changed_message(self, run_dir: str | Path, tables: list[str]) -> str:
        """The one line that refuses a run whose ``tables`` changed after it wrote them."""
        stage = self.stage or "?"
        which = ", ".join(tables)
        return (
            f"{Path(run_dir, tables[0])}: {which} of the saleval-{stage} run {run_dir} changed "
            f"after the run wrote {'it' if len(tables) == 1 else 'them'} (its run.json records "
            f"another SHA-256): rerun that {stage} run, or restore its files from its MLflow "
            f"run {self.run_id or '(none recorded)'}"
        )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def ancestry(run_dirs: Iterable[str | Path]) -> Iterator[tuple[Path, RunRecord]]:
    """Every run upstream of ``run_dirs`` (themselves first) with its record, nearest first:
    breadth-first through each record's ``parent_dirs``, to the runs that have no parent,
    however long the chain. Each run is visited once, so a cycle of records (which no stage
    writes, but copied run dirs could) ends the walk instead of looping; a parent dir that
    holds no record (moved, deleted) is passed over.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> for d, parents in {"a": {"b": "b"}, "b": {"c": "c", "a": "a"}, "c": {}}.items():
    ...     (root / d).mkdir()
    ...     RunRecord(d, parent_dirs={k: str(root / v) for k, v in parents.items()}).write(root / d)
    >>> [r.stage for _, r in ancestry([root / "a"])]
    ['a', 'b', 'c']
    """
    todo = collections.deque(Path(d) for d in run_dirs)
    seen: set[Path] = set()
    while todo:
        run_dir = todo.popleft()
        key = run_dir.resolve()
        if key in seen or not RunRecord.exists(run_dir):
            continue
        seen.add(key)
        record = RunRecord.read(run_dir)
        yield run_dir, record
        todo.extend(Path(p) for p in record.parent_dirs.values())


# -- the files a record vouches for ----------------------------------------------------
def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes (kept per path, size and modification time, so a
    process that reads a table twice hashes it once; any write changes the time)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SEEN:
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _SEEN[key] = f"{_ALGORITHM}:{h.hexdigest()}"
    return _SEEN[key]


def table_checksums(run_dir: str | Path, filenames: Iterable[str]) -> dict[str, str]:
    """The record's ``checksums``: each written table's file name -> :func:`file_digest`
    (files that are not there are left out)."""
    out = {}
    for name in sorted(set(filenames)):
        path = Path(run_dir, name)
        if path.is_file():
            out[name] = file_digest(path)
    return out


def table_problem(path: str | Path) -> str | None:
    """Why the table file ``path`` may not be read (None: it may): it lies in a run dir
    whose record lists another checksum for it. Every :meth:`TableSpec.read
    <saleval.pipeline.tables.TableSpec.read>` asks, so a table read from an ancestor run
    (not a direct input) is checked too."""
    p = Path(path)
    if not RunRecord.exists(p.parent):
        return None
    try:
        record = RunRecord.read(p.parent)
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # a run.json that cannot be read is named by whoever needs it
    if record.checksums is None or p.name not in record.checksums:
        return None
    if file_digest(p) == record.checksums[p.name]:
        return None
    return record.changed_message(p.parent, [p.name])


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it, so a reader
    (or a full disk) never leaves half a file where a whole one stood."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def read_run_config(run_dir: str | Path) -> DictConfig:
    """A run's resolved ``config.yaml`` (every run dir has one; the error names the file),
    its ``_target_``s and plugin modules at today's addresses (:mod:`saleval.renames`)."""
    path = Path(run_dir, "config.yaml")
    if not path.is_file():
        raise InputError(f"{path}: the run's config.yaml is missing; is this a saleval run dir?")
    plain = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if not isinstance(plain, dict):
        raise InputError(f"{path}: not a mapping")
    moved = renames.rewrite_config(plain)
    if moved:  # recorded before code moved: read with today's addresses
        log.warning("%s names code that has moved, read as %s", path, "; ".join(moved))
    cfg = OmegaConf.create(plain)
    assert isinstance(cfg, DictConfig)
    return cfg
