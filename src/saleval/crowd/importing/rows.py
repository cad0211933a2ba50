"""What every crowd input format shares (docs/aggregation.md): reading delimited files, the rejects
list, the ``strict``/``report`` policy, file hashes, and the result of an import.

Nothing is dropped silently: every data row is either accepted or listed in the
rejects table with the file, the 1-based data row, the field and the problem.
With policy ``strict`` any reject is an error; with ``report`` the good rows go
on and the rejects are written next to them. A file that cannot be read at all
(missing file, missing required column) is an error under both policies. Under both,
the import ends by printing one line per reason with its count and rows
(:func:`reject_summary`). Fields may be of any size (a CSV field is not capped at
Python's default 131,072 characters).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from saleval.config.crowd import Policy
from saleval.crowd.errors import CrowdImportError
from saleval.pipeline import tables

MAX_LISTED_REJECTS = 20
MAX_PROBLEM_CHARS = 400  # longer problem texts (a huge field quoted in them) are cut


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, logged with every import so results trace to their bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_rows(
    path: Path,
    delimiter: str = ",",
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_MINIMAL,
    encoding: str = "utf-8",
) -> tuple[list[str], list[list[str]], dict[int, tuple[str, str]]]:
    """Header (stripped), data rows and undecodable fields of a delimited file (no type guessing).

    The file is decoded with ``encoding`` (``crowd.encoding``; a UTF-8 BOM is skipped).
    Bytes that do not decode stop nothing: the third result maps each 1-based data row
    holding one to ``(field, problem)``, which the readers turn into a reject of that
    row. Duplicate column names (compared case-insensitively) are an error: which of
    the two ``answer`` columns was meant cannot be guessed.
    """
    if not path.is_file():
        raise CrowdImportError(f"{path}: file not found")
    codec = _codec(encoding)
    allow_any_field_size()
    rows: list[list[str]] = []
    with open(path, encoding=codec, errors="surrogateescape", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter, quoting=quoting)

        def unreadable(where: str, err: csv.Error) -> CrowdImportError:
            """Whatever the csv module still refuses: located, never a traceback."""
            return CrowdImportError(
                f"{path}, {where} (line {reader.line_num}): the file cannot be read as "
                f"delimited text ({err}); check its quoting around that line"
            )

        try:
            header = next(reader)
        except StopIteration:
            raise CrowdImportError(f"{path}: empty file (no header row)") from None
        except csv.Error as err:
            raise unreadable("row header", err) from None
        try:
            for values in reader:  # one by one: a failing row is located by its number
                rows.append(values)
        except csv.Error as err:
            raise unreadable(f"row {len(rows) + 1}", err) from None
    for j, name in enumerate(header):
        problem = _undecodable(name, encoding)
        if problem:
            raise CrowdImportError(f"{path}, row header, column {j + 1}: {problem}")
    header = [h.strip() for h in header]
    seen: dict[str, list[str]] = {}
    for name in header:
        seen.setdefault(name.lower(), []).append(name)
    dupes = [names for names in seen.values() if len(names) > 1]
    if dupes:
        listed = "; ".join(" and ".join(repr(n) for n in names) for names in dupes)
        raise CrowdImportError(
            f"{path}, row header: duplicate column names {listed} (compared "
            "case-insensitively); rename or delete all but one"
        )
    bad: dict[int, tuple[str, str]] = {}
    for r, values in enumerate(rows, start=1):
        for j, value in enumerate(values):
            problem = _undecodable(value, encoding)
            if problem:
                bad[r] = (header[j] if j < len(header) else f"column {j + 1}", problem)
                break
    return header, rows, bad


def allow_any_field_size() -> None:
    """Let the csv module read fields of any size the platform can hold.

    Its default limit (131,072 characters) made a long free-text answer crash the whole
    import; the largest limit the C ``long`` accepts is set instead (``sys.maxsize`` on
    64-bit Linux, halved until accepted where ``long`` is 32 bits).
    """
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:
            limit //= 2


def _codec(encoding: str) -> str:
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise CrowdImportError(
            f"crowd.encoding={encoding!r}: not an encoding Python knows (e.g. utf-8, cp1252, "
            "latin-1)"
        ) from None
    return "utf-8-sig" if name == "utf-8" else name


def _undecodable(value: str, encoding: str) -> str | None:
    """Why ``value`` (decoded with surrogateescape) holds a byte ``encoding`` cannot read."""
    for i, ch in enumerate(value):
        if "\udc80" <= ch <= "\udcff":
            return (
                f"byte 0x{ord(ch) - 0xDC00:02X} at character {i + 1} is not valid {encoding}; "
                "re-save the file as UTF-8, or set crowd.encoding to the file's encoding "
                "(cp1252 for files saved by Excel on Windows)"
            )
    return None


@dataclass
class Rejects:
    """The rejected rows of one file (``tables.REJECTS``), collected while reading it."""

    file: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: int | None, fld: str, problem: str) -> None:
        self.rows.append({"file": self.file, "row": row, "field": fld, "problem": clip(problem)})

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=list(tables.REJECTS.columns))
        df["row"] = df["row"].astype("Int64")
        return df

    @property
    def bad_rows(self) -> set[int]:
        return {int(r["row"]) for r in self.rows if r["row"] is not None}


def clip(problem: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    """A problem text short enough for a console line: the middle of a longer one (a
    200,000-character field quoted in it) is left out, the start and the advice at the
    end are kept.

    >>> clip("unknown label 'xxxxxxxxxxxxxxxxxxxxxxxxx'; expected one of [A, B]", 40)
    "unknown label 'x … [33 characters left out] … ed one of [A, B]"
    """
    if len(problem) <= limit:
        return problem
    head, tail = limit * 2 // 5, limit * 2 // 5
    cut = len(problem) - head - tail
    return f"{problem[:head]} … [{cut} characters left out] … {problem[-tail:]}"


_SPECIFIC = re.compile(
    r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""  # a quoted value
    r"|0x[0-9A-Fa-f]+|(?<![\w-])\d+(?![\w-])"  # a byte, a number (not the 8 of utf-8)
)


def reject_reason(problem: str) -> str:
    """A reject's problem without the row's own values (quoted values, numbers, bytes):
    the key rejects are counted by.

    >>> reject_reason("unknown task 't99' (first at row 12)")
    'unknown task … (first at row …)'
    >>> reject_reason("byte 0xE9 at character 3 is not valid utf-8")
    'byte … at character … is not valid utf-8'
    """
    return _SPECIFIC.sub("…", problem)


def reject_summary(rejects: pd.DataFrame, policy: str, rejects_csv: str | Path | None) -> list[str]:
    """The console lines that end an import with rejects (every policy): one headline with
    the count, the policy and where ``rejects.csv`` is, then one line per file, field and
    reason (:func:`reject_reason`) with its count, its rows and the first problem in full.

    >>> df = pd.DataFrame({"file": ["a.csv"] * 3, "row": [2, 5, 9], "field": ["task_id"] * 3,
    ...     "problem": ["unknown task 'x'", "unknown task 'y'", "empty task id"]})
    >>> print("\\n".join(reject_summary(df, "report", "run/rejects.csv")))
    3 rows rejected (crowd.policy=report: the other rows were imported); every reject is in run/rejects.csv
      a.csv, rows 2, 5, field task_id (2 rows): unknown task 'x'
      a.csv, row 9, field task_id: empty task id
    """
    if not len(rejects):
        return []
    rows = rejects["row"].dropna().astype(int)
    n_rows = rows.nunique() + int(rejects["row"].isna().sum())
    outcome = "nothing was imported" if policy == Policy.strict else "the other rows were imported"
    where = f"every reject is in {rejects_csv}" if rejects_csv else "rejects.csv was not written"
    lines = [
        f"{n_rows} row{'s' if n_rows != 1 else ''} rejected (crowd.policy={policy}: "
        f"{outcome}); {where}"
    ]
    keyed = rejects.assign(reason=[reject_reason(str(p)) for p in rejects["problem"]])
    groups = list(keyed.groupby(["file", "field", "reason"], sort=False, dropna=False))
    for (file, fld, _), group in groups[:MAX_LISTED_REJECTS]:
        listed = [str(int(r)) for r in group["row"].dropna().head(5)]
        more = len(group) - len(listed)
        at = ("row " if len(group) == 1 else "rows ") + ", ".join(listed)
        if not listed:
            at = "no row"
        elif more > 0:
            at += f" and {more} more"
        count = f" ({len(group)} rows)" if len(group) > 1 else ""
        lines.append(f"  {file}, {at}, field {fld}{count}: {group['problem'].iloc[0]}")
    if len(groups) > MAX_LISTED_REJECTS:
        lines.append(f"  ... and {len(groups) - MAX_LISTED_REJECTS} more reasons")
    return lines


class RejectedRows(CrowdImportError):
    """Policy ``strict`` met rejects; ``rejects`` holds them (written to the run dir)."""

    def __init__(self, message: str, rejects: pd.DataFrame) -> None:
        super().__init__(message)
        self.rejects = rejects


def enforce_policy(rejects: pd.DataFrame, policy: str, source: str | Path) -> None:
    """``strict``: any reject is an error (:class:`RejectedRows`) listing the first ones;
    ``report``: go on."""
    if policy not in tuple(Policy):
        raise CrowdImportError(f"crowd.policy must be 'strict' or 'report', not {policy!r}")
    if policy == Policy.strict and len(rejects):
        listed = "\n".join(
            f"  {r.file}, row {'-' if pd.isna(r.row) else r.row}, field {r.field}: {r.problem}"
            for r in rejects.head(MAX_LISTED_REJECTS).itertuples()
        )
        more = len(rejects) - MAX_LISTED_REJECTS
        raise RejectedRows(
            f"{source}: {len(rejects)} problem(s) under policy 'strict'; nothing was imported:\n"
            f"{listed}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\n(policy 'report' imports the good rows and writes rejects.csv)",
            rejects,
        )


@dataclass
class CrowdImport:
    """Everything one import produces; the stage writes these as its outputs.

    ``annotations`` are the accepted answers that passed the quality filters
    (ANNOTATIONS); ``aggregated`` is A[i, j, k] (AGGREGATED); ``report`` the
    counts and settings written to ``import_report.json``.
    """

    annotations: pd.DataFrame
    aggregated: pd.DataFrame
    rejects: pd.DataFrame
    report: dict[str, Any]
    #: the accepted answers a quality filter took out, with the filter's name (written as
    #: ``filtered.csv``, even when empty); None: the source has no filters
    removed: pd.DataFrame | None = None
    #: the file says a simulated crowd answered (every later table then says SIMULATED)
    simulated: bool = False
    #: the other files read besides the source file (e.g. the task table), each as
    #: ``{"path", "sha256"}``, recorded in ``import_report.json``
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    #: why nothing is left to score, when so: the stage writes the outputs (they show
    #: where the answers went), then fails with this message
    failure: str | None = None


def empty_annotations() -> pd.DataFrame:
    """An ANNOTATIONS table without rows (a source that has no worker-level answers)."""
    cols = {**tables.ANNOTATIONS.columns}
    return tables.ANNOTATIONS.validate(
        pd.DataFrame({c: pd.Series(dtype="object") for c in cols}), where="<empty>"
    )
