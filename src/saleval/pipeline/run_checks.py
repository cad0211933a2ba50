"""What makes a run dir fit to be read: its record says FINISHED, and its tables are the
bytes it wrote (docs/architecture.md, section 2; docs/tracking.md, *Run records you can
trust*).

A stage run's record (``run.json``) holds its ``status`` and, for every declared table it
wrote (:mod:`saleval.pipeline.tables`), the table's SHA-256 under ``checksums``. Before a
stage reads a parent it asks two questions, each one function here, each a plain function
of the record and the files so it can move into a typed run record unchanged:

* :func:`status_problem`: is the run FINISHED? A FAILED, KILLED or RUNNING run's tables
  may be partial; it is refused as an input in one line naming its status and the fix
  (rerun it, or ``allow_unfinished_inputs=true``, which the child's provenance records).
* :func:`changed_tables`: does every table still hash to what the run recorded? A table
  edited by hand, truncated or corrupted after the run finished is refused in one line
  naming the table and the run.

Runs recorded before ``run.json`` carried ``checksums`` have nothing to check against and
are read as they are. This module imports nothing of saleval but the error base.

>>> status_problem({"status": "FINISHED"}) is None
True
>>> status_problem({"status": "FAILED", "error": "OSError(28, 'No space left on device')"})
"is FAILED (OSError(28, 'No space left on device')), not FINISHED"
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: the status of a run whose work completed (MLflow's word, which ``run.json`` shares)
FINISHED = "FINISHED"
#: ``run.json``'s field: table file name (relative to the run dir) -> ``sha256:<hex>``
CHECKSUMS = "checksums"
#: the key of the override that accepts a run that is not FINISHED as an input
ALLOW_UNFINISHED = "allow_unfinished_inputs"
RUN_JSON = "run.json"

_ALGORITHM = "sha256"
#: (path, size, mtime_ns) -> digest: a table read twice in one process is hashed once
_SEEN: dict[tuple[str, int, int], str] = {}


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


def status_problem(info: Mapping[str, Any]) -> str | None:
    """Why a run with record ``info`` may not be read as an input (None: it is FINISHED):
    ``is FAILED (<error>), not FINISHED``, ``is KILLED, not FINISHED``, ..."""
    status = info.get("status")
    if status == FINISHED:
        return None
    if not status:
        return "has no status in its run.json (no saleval stage wrote it)"
    error = " ".join(str(info.get("error") or "").split())
    return f"is {status}" + (f" ({error[:160]})" if error else "") + ", not FINISHED"


def unfinished_message(
    name: str, run_dir: str | Path, info: Mapping[str, Any], sweep: str | Path | None = None
) -> str | None:
    """The one line that refuses ``inputs.<name>=<run_dir>`` when it is not FINISHED
    (None when it is): its stage, its status and what to do. ``sweep``: the run is a job
    of that ``-m`` sweep dir, which is rerun with the same command and ``hydra.sweep.dir``.

    >>> print(unfinished_message("explain", "/o/explain/1", {"stage": "explain", "status": "KILLED"}))
    inputs.explain=/o/explain/1: this saleval-explain run is KILLED, not FINISHED: its tables may be incomplete; rerun it, or pass allow_unfinished_inputs=true to read it anyway (this run's provenance then records it)
    """
    problem = status_problem(info)
    if problem is None:
        return None
    stage = info.get("stage") or "?"
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


def changed_tables(run_dir: str | Path, info: Mapping[str, Any]) -> list[str]:
    """The tables of ``run_dir`` whose bytes differ from what its record says it wrote
    (a table that is gone is left to its reader, which names it)."""
    recorded = info.get(CHECKSUMS)
    if not isinstance(recorded, Mapping):
        return []  # recorded before run.json carried checksums
    changed = []
    for name, digest in recorded.items():
        path = Path(run_dir, str(name))
        if path.is_file() and file_digest(path) != digest:
            changed.append(str(name))
    return sorted(changed)


def changed_message(run_dir: str | Path, info: Mapping[str, Any], tables: list[str]) -> str:
    """The one line that refuses a run whose ``tables`` changed after it wrote them."""
    stage = info.get("stage") or "?"
    which = ", ".join(tables)
    return (
        f"{Path(run_dir, tables[0])}: {which} of the saleval-{stage} run {run_dir} changed "
        f"after the run wrote {'it' if len(tables) == 1 else 'them'} (its run.json records "
        f"another SHA-256): rerun that {stage} run, or restore its files from its MLflow run "
        f"{info.get('run_id') or '(none recorded)'}"
    )


def table_problem(path: str | Path) -> str | None:
    """Why the table file ``path`` may not be read (None: it may): it lies in a run dir
    whose record lists another checksum for it. Every :meth:`TableSpec.read
    <saleval.pipeline.tables.TableSpec.read>` asks, so a table read from an ancestor run
    (not a direct input) is checked too."""
    p = Path(path)
    record = p.parent / RUN_JSON
    if not record.is_file():
        return None
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return None  # a run.json that cannot be read is named by whoever needs it
    recorded = info.get(CHECKSUMS) if isinstance(info, Mapping) else None
    if not isinstance(recorded, Mapping) or p.name not in recorded:
        return None
    if file_digest(p) == recorded[p.name]:
        return None
    return changed_message(p.parent, info, [p.name])


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
