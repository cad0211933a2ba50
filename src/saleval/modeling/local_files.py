"""A user's own data files (docs/own-data.md): CSV, TSV, JSON lines and Parquet, compressed
or not, read with every cell a string, their columns and label values checked.

:func:`saleval.modeling.data.read_local` (the reader ``dataset=local`` names) is built on
these; :func:`label_names_in_data` gives the label names when the config does not.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from saleval.config import DatasetConfig
from saleval.modeling.data_checks import (
    DataError,
    count_rows,
    is_blank,
    row_numbers,
)
from saleval.modeling.splits import SPLITS

#: compression suffixes pandas undoes by itself (``reviews.csv.gz``)
_COMPRESSION = (".gz", ".bz2", ".xz", ".zip", ".zst")


#: what ``read_local`` reads, by file suffix
_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
}


def read_table(path: Path) -> pd.DataFrame:
    """A CSV, TSV, JSON Lines, JSON or Parquet file as a table with at least one row.

    CSV and TSV cells are read as strings (an empty cell is ``""``, never NaN), so labels
    and ids keep their spelling. A file that is missing, empty, unparsable or holds no
    rows fails naming the file.
    """
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    fmt = _FORMATS.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise DataError(
            f"{path}: unknown file type {path.suffix!r}; read_local reads "
            f"{', '.join(_FORMATS)} files (optionally compressed: {', '.join(_COMPRESSION)})"
        )
    if not path.is_file():
        raise DataError(f"{path}: file not found; check dataset.data_root and dataset.files")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); point dataset.files at your data")
    try:
        if fmt in ("csv", "tsv"):
            raw = pd.read_csv(
                path, sep="\t" if fmt == "tsv" else ",", dtype=str, keep_default_na=False
            )
        elif fmt == "parquet":
            raw = pd.read_parquet(path)
        else:
            raw = pd.read_json(path, lines=fmt == "jsonl", dtype=False)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        reason = " ".join(str(err).split())[:300]
        raise DataError(f"{path}: cannot be read as {fmt}: {reason}") from err
    if raw.empty:
        what = f"only a header ({', '.join(map(str, raw.columns))})" if len(raw.columns) else ""
        raise DataError(f"{path}: no data rows{' — ' + what if what else ''}; add rows to it")
    return raw


def check_columns(raw: pd.DataFrame, dc: DatasetConfig, path: Path) -> None:
    """The configured text, label and id columns exist, or the error lists what does."""
    wanted = {
        "text_column": dc.text_column,
        "label_column": dc.label_column,
        "id_column": dc.id_column,
    }
    found = [str(c) for c in raw.columns]
    for key, col in wanted.items():
        if col is not None and col not in raw.columns:
            raise DataError(
                f"{path}: no column {col!r} (dataset.{key}); the file has columns {found}: "
                f"set dataset.{key}=<one of them>"
            )


def files_of(dc: DatasetConfig) -> dict[str, Path]:
    """``dataset.files`` of a local dataset: ``all``, or the splits, paths resolved."""
    given = {s: getattr(dc.files, s) for s in (*SPLITS, "all") if getattr(dc.files, s)}
    if not given:
        raise DataError(
            f"dataset {dc.name}: no files given; set dataset.files.all=<file> (split here) "
            "or dataset.files.train/validation/test"
        )
    if "all" in given and len(given) > 1:
        raise DataError(
            f"dataset {dc.name}: dataset.files gives 'all' and {sorted(set(given) - {'all'})}; "
            "give either one file to split (all) or one file per split"
        )
    if "all" not in given and not {"train", "test"} <= set(given):
        raise DataError(
            f"dataset {dc.name}: dataset.files gives {sorted(given)}; give train and test "
            "(validation is optional: without it, part of train is held out) or all"
        )
    return {
        key: Path(rel) if Path(rel).is_absolute() else Path(dc.data_root, rel)
        for key, rel in given.items()
    }


def label_names_in_data(dc: DatasetConfig) -> list[str]:
    """The label values of a local dataset's files, sorted (numerically when every value
    is an integer): its label names when ``dataset.label_names`` is not given."""
    if dc._target_ != "saleval.modeling.data.read_local":
        raise DataError(
            f"dataset {dc.name}: set dataset.label_names (only saleval.modeling.data.read_local "
            "reads them from the data)"
        )
    values: set[str] = set()
    for path in files_of(dc).values():
        raw = read_table(path)
        check_columns(raw, dc, path)
        labels = raw[dc.label_column]
        blank = is_blank(labels)
        if blank.any():
            raise DataError(
                f"{path}: {count_rows(int(blank.sum()), 'no')} {dc.label_column} "
                f"({row_numbers(blank)}); fill them in or remove them"
            )
        values.update(labels.astype(str).str.strip())
    if all(v.lstrip("-").isdigit() for v in values):
        return sorted(values, key=int)
    return sorted(values)
