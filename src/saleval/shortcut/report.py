"""The shortcut results in the published layout (Bastings et al. 2022, Table 2 shape).

Rows are method configurations; columns are dataset × shortcut type, each with
precision@k and mean rank. One experiment fills one column pair; a sweep
(``-m shortcut=st,tic,op dataset=...``) fills the rest: :func:`combine_runs` reads
every job's ``shortcut_results.csv`` and :func:`published_table` lays them out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from saleval import tables
from saleval.shortcut.generate import KINDS


def published_table(results: pd.DataFrame) -> pd.DataFrame:
    """Rows (method, config) × columns (dataset, shortcut, P@k | rank) from
    ``shortcut_results`` rows; shortcut types in the order st, tic, op."""
    df = tables.SHORTCUT_RESULTS.validate(results)
    long = df.melt(
        id_vars=["dataset", "shortcut", "method", "config"],
        value_vars=["precision", "mean_rank"],
        var_name="metric",
    )
    long["metric"] = long["metric"].map({"precision": "P@k", "mean_rank": "rank"})
    wide = long.pivot_table(
        index=["method", "config"],
        columns=["dataset", "shortcut", "metric"],
        values="value",
        aggfunc="first",
        sort=False,
    )
    kind_order = {k: i for i, k in enumerate(KINDS)}
    cols = sorted(
        wide.columns,
        key=lambda c: (str(c[0]), kind_order.get(str(c[1]), 99), str(c[1]), c[2] != "P@k"),
    )
    return wide[cols]


def to_markdown(table: pd.DataFrame, title: str | None = None) -> str:
    """Markdown of :func:`published_table`: P@k with 2 decimals, mean rank with 1."""
    flat = table.copy()
    flat.columns = [f"{d} {s} {m}" for d, s, m in table.columns]
    for col, (_, _, metric) in zip(flat.columns, table.columns):
        digits = 2 if metric == "P@k" else 1
        flat[col] = flat[col].map(lambda v, n=digits: "" if pd.isna(v) else f"{v:.{n}f}")
    flat = flat.reset_index()
    body = flat.to_markdown(index=False, disable_numparse=True)
    note = (
        "\n\nP@k: precision@k of the planted shortcut tokens (k = 1 for st, 2 for tic/op; "
        "higher is better). rank: mean smallest r whose top-r words hold every shortcut "
        "token (best = k; lower is better). Ties count against the method."
    )
    return (f"## {title}\n\n" if title else "") + body + note + "\n"


def combine_runs(run_dirs: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate the ``shortcut_results.csv`` of several runs (e.g. a sweep's jobs)."""
    dirs = [Path(d) for d in run_dirs]
    frames = []
    for d in dirs:
        path = tables.SHORTCUT_RESULTS.path(d)
        if path.is_file():
            frames.append(tables.SHORTCUT_RESULTS.read(path))
    if not frames:
        raise FileNotFoundError(
            f"no {tables.SHORTCUT_RESULTS.filename} in {[str(d) for d in dirs]}"
        )
    out = pd.concat(frames, ignore_index=True)
    return out.drop_duplicates(["dataset", "shortcut", "method", "config"], keep="last")
