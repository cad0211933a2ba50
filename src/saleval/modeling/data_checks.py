"""The one error of dataset loading and the checks every reader shares.

Every problem with a dataset's files is one :class:`DataError` line that names the file,
the rows (counted and listed: :func:`count_rows`, :func:`row_numbers`) and the fix
(docs/own-data.md). A reader's file must exist (:func:`require_file`); labels are given
by name or by class index (:func:`labels_from_names`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from saleval.errors import UserError


class DataError(UserError, RuntimeError):
    """A dataset cannot be loaded; the message names the file, row or package."""


def count_rows(n: int, has: str = "", verb_n: int | None = None) -> str:
    """``1 row``, ``3 rows``; with ``has``: ``1 row has <has>``, ``3 rows have <has>``
    (the verb agreeing with ``verb_n``, default ``n``: ``1 of 40 rows has ...``)."""
    words = f"{n} row{'' if n == 1 else 's'}"
    if has:
        words += f" {'has' if (n if verb_n is None else verb_n) == 1 else 'have'} {has}"
    return words


def require_file(path: Path, dataset: str) -> Path:
    if not path.exists():
        raise DataError(
            f"dataset {dataset}: file {path} not found (data root from dataset.data_root / "
            "SALEVAL_DATA_ROOT; see ../shared/data/README.md)"
        )
    return path


def labels_from_names(
    values: pd.Series, label_names: Sequence[str], where: str, column: str = "label"
) -> pd.Series:
    """Label names (any case) or class indices as class indices; every row that is neither
    is counted in one error naming the first and the values seen."""
    lookup = {n.lower(): i for i, n in enumerate(label_names)}
    out: list[int] = []
    bad: list[bool] = []
    for v in values.tolist():
        key = "" if v is None or (isinstance(v, float) and v != v) else str(v).strip().lower()
        if key in lookup:
            out.append(lookup[key])
        elif key.lstrip("-").isdigit() and 0 <= int(key) < len(label_names):
            out.append(int(key))
        else:
            out.append(-1)
        bad.append(out[-1] < 0)
    if any(bad):
        first = bad.index(True)
        seen = pd.Series(values.tolist())[bad].astype(str).value_counts()
        shown = ", ".join(f"{v!r} ×{c}" for v, c in seen.head(5).items())
        raise DataError(
            f"{where}: row {first + 1}, field {column}: {values.tolist()[first]!r} is not one "
            f"of {list(label_names)} ({count_rows(sum(bad))} in all: {shown}); fix those rows or "
            "list every label in dataset.label_names"
        )
    return pd.Series(out, index=values.index, dtype="int64")


def row_numbers(mask: Sequence[bool] | pd.Series, first: int = 5) -> str:
    """``rows 3, 8, 11, ...``: the first few 1-based row numbers where ``mask`` holds
    (rows count data records; a CSV's header is not a row)."""
    hits = [i + 1 for i, m in enumerate(list(mask)) if m]
    shown = ", ".join(str(i) for i in hits[:first])
    return f"row{'s' if len(hits) > 1 else ''} {shown}{', ...' if len(hits) > first else ''}"


def is_blank(values: pd.Series) -> pd.Series:
    """True where a cell is null or only whitespace."""
    return values.isna() | (values.astype(str).str.strip() == "")
