"""The published aggregated format of the original study (Lu et al. 2024).

Tab-separated ``Text Label Saliency Words Correct`` in blocks of 41 rows: a sample row,
then its 40 tasks, whose ``Correct`` (the published majority vote) is A[i, j, k]
directly. No worker-level answers are published.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from saleval.attribution import published_names
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.rows import Rejects, read_rows

_LU_COLUMNS = ("Text", "Label", "Saliency", "Words", "Correct")


def read_lu2024(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    methods: Mapping[str, str] | None = None,
    encoding: str = "utf-8",
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Read the published aggregated results; returns (aggregated, rejects, info).

    ``methods`` (``crowd.methods``): published method names read as saleval methods, over
    those the methods declare themselves (:func:`method_names`).

    Blocks of rows: a sample row (``Saliency`` N/A, ``Words`` All) followed by its
    tasks, whose ``Correct`` is A[i, j, k]. Sample ids are ``lu2024-<dataset>-<block>``
    (block counted from 0). Checked per row: field count, label in range and equal to
    its sample's, known method, integer k, Correct in {0, 1}, no repeated (method, k)
    within a sample, and no more shown words than k.
    """
    agg, rejects, info = _read_blocks(path, label_names, dataset, methods, encoding)
    info.pop("samples")
    return agg.drop(columns=["n_words_shown", "display_text"]), rejects, info


def _read_blocks(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    methods: Mapping[str, str] | None = None,
    encoding: str = "utf-8",
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """:func:`read_lu2024` keeping what workers saw (``display_text``, ``n_words_shown``)
    and the samples' texts and labels (``info["samples"]``: id -> (label, text))."""
    path = Path(path)
    methods = method_names(methods)
    header, rows, undecodable = read_rows(
        path, delimiter="\t", quoting=csv.QUOTE_NONE, encoding=encoding
    )
    col = _lu_columns(path, header)
    rejects = Rejects(str(path))
    n_labels = len(label_names)
    blocks = _Blocks(dataset)
    for r, values in enumerate(rows, start=1):
        if r in undecodable:
            rejects.add(r, *undecodable[r])
            continue
        if len(values) != len(header):
            rejects.add(r, "*", f"expected {len(header)} fields, found {len(values)}")
            continue
        get = {name: values[col[name]].strip() for name in _LU_COLUMNS}
        text = values[col["Text"]]
        label = _label(get["Label"], n_labels)
        if get["Saliency"] in ("N/A", "") and get["Words"].lower() == "all":
            blocks.start(r, label, text)
            if label is None:
                rejects.add(r, "Label", _not_a_label(get["Label"], n_labels))
            continue
        problems = blocks.label_problems(label, get["Label"], n_labels)
        method, k, shown = _task_fields(get, text, methods, problems)
        if not problems:
            repeated = blocks.repeated(str(method), k)
            if repeated:
                problems.append(
                    ("Words", f"{get['Saliency']} k={k} repeated in this sample (row {repeated})")
                )
        for fld, problem in problems:
            rejects.add(r, fld, problem)
        if problems:
            continue
        assert method is not None and label is not None
        blocks.add(r, method, k, int(get["Correct"]), label, shown, text)
    agg = pd.DataFrame(
        blocks.out,
        columns=["sample_id", "method", "k", "correct", "label", "n_words_shown", "display_text"],
    )
    cells = agg.groupby("sample_id").size()
    grid = agg[["method", "k"]].drop_duplicates()
    info = {
        "n_rows": len(rows),
        "n_samples": blocks.n_samples,
        "n_tasks": len(agg),
        "n_rejected_rows": len(rejects.bad_rows),
        "methods": sorted(agg["method"].unique().tolist()),
        "ks": sorted(int(k) for k in agg["k"].unique()),
        "incomplete_samples": sorted(cells[cells < len(grid)].index.tolist()),
        "columns": header,
        "samples": blocks.samples,
    }
    return agg, rejects.frame(), info


def method_names(given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Published method name -> saleval method name: the published name each method
    declares where it registers (:func:`saleval.attribution.base.register`), then
    ``given`` (``crowd.methods``: another study's names, or a name read differently).

    >>> method_names({"IG": "integrated_gradients"})["IG"], method_names()["InputXGrad"]
    ('integrated_gradients', 'input_x_gradient')
    """
    return {**published_names(), **(given or {})}


def _lu_columns(path: Path, header: list[str]) -> dict[str, int]:
    """Where each published column sits; a missing one fails the whole file."""
    col = {h: i for i, h in enumerate(header)}
    for name in _LU_COLUMNS:
        if name not in col:
            raise CrowdImportError(
                f"{path}, row header, field {name}: missing column; the file has {header} "
                f"(expected tab-separated {' '.join(_LU_COLUMNS)})"
            )
    return col


def _label(text: str, n_labels: int) -> int | None:
    """A ``Label`` field as a label index 0..n_labels-1; None where it is not one."""
    try:
        label = int(text)
    except ValueError:
        return None
    return label if 0 <= label < n_labels else None


def _not_a_label(text: str, n_labels: int) -> str:
    """The problem of a ``Label`` field that :func:`_label` refused."""
    return f"not a label index 0..{n_labels - 1}: {text!r}"


def _task_fields(
    get: dict[str, str], text: str, methods: Mapping[str, str], problems: list[tuple[str, str]]
) -> tuple[str | None, int, int]:
    """A task row's method (None: unknown), k (-1: no positive integer) and number of
    shown words, each checked: Correct must be 0 or 1, and no more words shown than k.
    Problems are appended to ``problems``."""
    method = methods.get(get["Saliency"])
    if method is None:
        problems.append(
            ("Saliency", f"unknown method {get['Saliency']!r}; expected one of {list(methods)}")
        )
    k = -1
    try:
        k = int(get["Words"])
        if k <= 0:
            raise ValueError
    except ValueError:
        problems.append(("Words", f"not a positive integer: {get['Words']!r}"))
    if get["Correct"] not in ("0", "1"):
        problems.append(("Correct", f"not 0 or 1: {get['Correct']!r}"))
    shown = sum(1 for w in text.split(" ") if w.strip("."))
    if k > 0 and shown > k:
        problems.append(("Text", f"shows {shown} words, more than Words={k}"))
    return method, k, shown


class _Blocks:
    """The blocks read so far: the current one (its number, counted from 0, -1 before the
    first sample row; its sample row, whether that was accepted, its label and text), the
    (method, k) cells of each block and the accepted task rows."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.block = -1
        self.ok = False
        self.label = -1
        self.row = 0
        self.text = ""
        self.n_samples = 0
        self.seen: dict[tuple[int, str, int], int] = {}
        self.samples: dict[str, tuple[int, str]] = {}
        self.out: list[dict[str, Any]] = []

    def start(self, r: int, label: int | None, text: str) -> None:
        """A sample row (row ``r``) opens the next block; it counts as a sample when its
        label is valid."""
        self.block += 1
        self.row = r
        self.ok = label is not None
        self.label = -1 if label is None else label
        self.text = text
        if label is not None:
            self.n_samples += 1

    def label_problems(self, label: int | None, raw: str, n_labels: int) -> list[tuple[str, str]]:
        """A task row's problems with its block: none opened yet, its sample rejected, its
        own label invalid or not its sample's."""
        problems: list[tuple[str, str]] = []
        if self.block < 0:
            problems.append(("Saliency", "task row before any sample row"))
        elif not self.ok:
            problems.append(("Label", f"its sample (row {self.row}) was rejected"))
        if label is None:
            problems.append(("Label", _not_a_label(raw, n_labels)))
        elif self.ok and label != self.label:
            problems.append(("Label", f"{label} differs from its sample's label {self.label}"))
        return problems

    def repeated(self, method: str, k: int) -> int:
        """The row of an earlier task of this block with the same method and k (0: none)."""
        return self.seen.get((self.block, method, k), 0)

    def add(
        self, r: int, method: str, k: int, correct: int, label: int, shown: int, text: str
    ) -> None:
        """Accept task row ``r`` into the current block."""
        self.seen[(self.block, method, k)] = r
        sample_id = f"lu2024-{self.dataset}-{self.block}"
        self.out.append(
            {
                "sample_id": sample_id,
                "method": method,
                "k": k,
                "correct": correct,
                "label": label,
                "n_words_shown": shown,
                "display_text": text,
            }
        )
        self.samples.setdefault(sample_id, (self.label, self.text))
