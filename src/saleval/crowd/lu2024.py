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

from saleval.config.crowd import LU2024_METHODS
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.reading import Rejects, read_rows

_LU_COLUMNS = ("Text", "Label", "Saliency", "Words", "Correct")


def read_lu2024(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    methods: Mapping[str, str] = LU2024_METHODS,
    encoding: str = "utf-8",
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Read the published aggregated results; returns (aggregated, rejects, info).

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
    methods: Mapping[str, str] = LU2024_METHODS,
    encoding: str = "utf-8",
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """:func:`read_lu2024` keeping what workers saw (``display_text``, ``n_words_shown``)
    and the samples' texts and labels (``info["samples"]``: id -> (label, text))."""
    path = Path(path)
    header, rows, undecodable = read_rows(
        path, delimiter="\t", quoting=csv.QUOTE_NONE, encoding=encoding
    )
    col = {h: i for i, h in enumerate(header)}
    for name in _LU_COLUMNS:
        if name not in col:
            raise CrowdImportError(
                f"{path}, row header, field {name}: missing column; the file has {header} "
                f"(expected tab-separated {' '.join(_LU_COLUMNS)})"
            )
    rejects = Rejects(str(path))
    n_labels = len(label_names)
    out: list[dict[str, Any]] = []
    block = -1
    block_ok = False
    block_label = -1
    block_row = 0
    seen: dict[tuple[int, str, int], int] = {}
    n_samples = 0
    sample_text = ""
    samples: dict[str, tuple[int, str]] = {}
    for r, values in enumerate(rows, start=1):
        if r in undecodable:
            rejects.add(r, *undecodable[r])
            continue
        if len(values) != len(header):
            rejects.add(r, "*", f"expected {len(header)} fields, found {len(values)}")
            continue
        get = {name: values[col[name]].strip() for name in _LU_COLUMNS}
        label: int | None = None
        try:
            label = int(get["Label"])
            if not 0 <= label < n_labels:
                raise ValueError
        except ValueError:
            label = None
        if get["Saliency"] in ("N/A", "") and get["Words"].lower() == "all":
            block += 1
            block_row = r
            block_ok = label is not None
            block_label = -1 if label is None else label
            sample_text = values[col["Text"]]
            if label is None:
                rejects.add(r, "Label", f"not a label index 0..{n_labels - 1}: {get['Label']!r}")
            else:
                n_samples += 1
            continue
        problems: list[tuple[str, str]] = []
        if block < 0:
            problems.append(("Saliency", "task row before any sample row"))
        elif not block_ok:
            problems.append(("Label", f"its sample (row {block_row}) was rejected"))
        if label is None:
            problems.append(("Label", f"not a label index 0..{n_labels - 1}: {get['Label']!r}"))
        elif block_ok and label != block_label:
            problems.append(("Label", f"{label} differs from its sample's label {block_label}"))
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
        shown = sum(1 for w in values[col["Text"]].split(" ") if w.strip("."))
        if k > 0 and shown > k:
            problems.append(("Text", f"shows {shown} words, more than Words={k}"))
        if not problems and (block, str(method), k) in seen:
            problems.append(
                (
                    "Words",
                    f"{get['Saliency']} k={k} repeated in this sample (row {seen[(block, str(method), k)]})",
                )
            )
        if problems:
            for fld, problem in problems:
                rejects.add(r, fld, problem)
            continue
        assert method is not None and label is not None
        seen[(block, method, k)] = r
        out.append(
            {
                "sample_id": f"lu2024-{dataset}-{block}",
                "method": method,
                "k": k,
                "correct": int(get["Correct"]),
                "label": label,
                "n_words_shown": shown,
                "display_text": values[col["Text"]],
            }
        )
        samples.setdefault(f"lu2024-{dataset}-{block}", (block_label, sample_text))
    agg = pd.DataFrame(
        out,
        columns=["sample_id", "method", "k", "correct", "label", "n_words_shown", "display_text"],
    )
    cells = agg.groupby("sample_id").size()
    grid = agg[["method", "k"]].drop_duplicates()
    info = {
        "n_rows": len(rows),
        "n_samples": n_samples,
        "n_tasks": len(agg),
        "n_rejected_rows": len(rejects.bad_rows),
        "methods": sorted(agg["method"].unique().tolist()),
        "ks": sorted(int(k) for k in agg["k"].unique()),
        "incomplete_samples": sorted(cells[cells < len(grid)].index.tolist()),
        "columns": header,
        "samples": samples,
    }
    return agg, rejects.frame(), info
