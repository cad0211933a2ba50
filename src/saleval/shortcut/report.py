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

from saleval.pipeline import tables
from saleval.shortcut.rules import KINDS


def published_table(results: pd.DataFrame) -> pd.DataFrame:
    """Rows (method, config) × columns (dataset, shortcut, P@k | rank) from
    ``shortcut_results`` rows; shortcut types in the order st, tic, op. Rows ranked in
    more than one unit (word, piece) get the unit in the shortcut label (``st/piece``)."""
    if "unit" in results and results["unit"].nunique() > 1:
        results = results.assign(shortcut=results["shortcut"] + "/" + results["unit"])
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
        key=lambda c: (
            str(c[0]),
            kind_order.get(str(c[1]).split("/")[0], 99),
            str(c[1]),
            c[2] != "P@k",
        ),
    )
    return wide[cols]


def to_markdown(table: pd.DataFrame, title: str | None = None, unit: str = "word") -> str:
    """Markdown of :func:`published_table`: P@k with 2 decimals, mean rank with 1;
    ``unit`` (word | piece) names what the rankings ordered."""
    flat = table.copy()
    flat.columns = [f"{d} {s} {m}" for d, s, m in table.columns]
    for col, (_, _, metric) in zip(flat.columns, table.columns):
        digits = 2 if metric == "P@k" else 1
        flat[col] = flat[col].map(lambda v, n=digits: "" if pd.isna(v) else f"{v:.{n}f}")
    flat = flat.reset_index()
    body = flat.to_markdown(index=False, disable_numparse=True)
    note = (
        "\n\nP@k: precision@k of the planted shortcut tokens (k = 1 for st, 2 for tic/op; "
        f"higher is better). rank: mean smallest r whose top-r {unit}s hold every shortcut "
        f"token (best = k; lower is better). Ranked unit: {unit} (docs/shortcut.md#units). "
        "Ties count against the method."
    )
    return (f"## {title}\n\n" if title else "") + body + note + "\n"


def uncertainty_markdown(results: pd.DataFrame, level: float = 0.95) -> str:
    """Each cell's n and interval (docs/shortcut.md#uncertainty): one line per
    configuration × dataset × shortcut, so a cell computed on the CPU budget's 10
    examples is not read like one computed on 50."""
    df = results
    if "precision_ci_low" not in df:
        return ""

    def span(v: float, lo: float, hi: float, digits: int) -> str:
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    out = pd.DataFrame(
        {
            "config": df["config"],
            "dataset": df["dataset"],
            "shortcut": df["shortcut"],
            "unit": df.get("unit", "word"),
            "n": df["n"].astype(str),
            "P@k [CI]": [
                span(*v, 2)
                for v in zip(df["precision"], df["precision_ci_low"], df["precision_ci_high"])
            ],
            "rank [CI]": [
                span(*v, 1)
                for v in zip(df["mean_rank"], df["mean_rank_ci_low"], df["mean_rank_ci_high"])
            ],
        }
    )
    body = out.to_markdown(index=False, disable_numparse=True)
    pct = f"{100 * level:g} %"
    return (
        f"\n### n and {pct} intervals per cell\n\n{body}\n\nP@k: Wilson score interval over "
        f"n·k top slots; rank: Student-t interval of the mean, cut at k. Cells on fewer "
        "examples (explain.budget) have wider intervals; 'explain.budget=[]' "
        "'explain.skip=[]' runs every configuration on explain.n_samples.\n"
    )


REFERENCE_COLUMNS = ("dataset", "shortcut", "config", "precision", "mean_rank")


def read_reference(path: str | Path) -> pd.DataFrame:
    """Published results to set beside ours (docs/shortcut.md#reference): a CSV with
    ``dataset, shortcut, config, precision, mean_rank`` (empty cells allowed: a slot not
    yet filled), ``config`` named as ours (``grad_l2_logits``, ``ig_zero_100_logits``)."""
    df = pd.read_csv(path, dtype={"dataset": str, "shortcut": str, "config": str})
    missing = [c for c in REFERENCE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: reference results lack the columns {missing}; the file needs "
            f"{list(REFERENCE_COLUMNS)} (one row per configuration, dataset and shortcut)"
        )
    if df.empty:
        raise ValueError(f"{path}: no reference rows")
    return df[list(REFERENCE_COLUMNS)]


def beside_reference(results: pd.DataFrame, reference: pd.DataFrame, source: str) -> str:
    """Markdown: our precision and rank (with n) next to the published ones, per
    configuration × dataset × shortcut that either side has; a missing side shows "—".

    Only the reference rows of the datasets and shortcut types the results cover are
    shown (a published table spans datasets a run never used); one line says how many
    were left out, and which unit the reference ranks where ours ranks another.
    """
    ours = results.assign(n=results["n"].astype(int))[
        ["dataset", "shortcut", "config", "precision", "mean_rank", "n"]
    ]
    pairs = set(zip(ours["dataset"].astype(str), ours["shortcut"].astype(str)))
    keep = [(d, k) in pairs for d, k in zip(reference["dataset"], reference["shortcut"])]
    left_out = reference[[not k for k in keep]]
    reference = reference[keep]
    both = ours.merge(
        reference,
        on=["dataset", "shortcut", "config"],
        how="outer",
        suffixes=("", "_ref"),
        sort=False,
    )

    def fmt(v: object, digits: int) -> str:
        return "—" if pd.isna(v) else f"{float(v):.{digits}f}"  # type: ignore[arg-type]

    out = pd.DataFrame(
        {
            "config": both["config"],
            "dataset": both["dataset"],
            "shortcut": both["shortcut"],
            "n": both["n"].map(lambda v: "—" if pd.isna(v) else str(int(v))),
            "P@k ours": both["precision"].map(lambda v: fmt(v, 2)),
            "P@k ref": both["precision_ref"].map(lambda v: fmt(v, 2)),
            "rank ours": both["mean_rank"].map(lambda v: fmt(v, 1)),
            "rank ref": both["mean_rank_ref"].map(lambda v: fmt(v, 1)),
        }
    )
    body = out.to_markdown(index=False, disable_numparse=True)
    notes = []
    if len(left_out):
        other = sorted(set(zip(left_out["dataset"], left_out["shortcut"])))
        rows = "1 reference row" if len(left_out) == 1 else f"{len(left_out)} reference rows"
        notes.append(
            f"{rows} of datasets or shortcut types this run did not use left out "
            f"({', '.join(f'{d}/{k}' for d, k in other)})."
        )
    units = set(results["unit"].astype(str)) if "unit" in results else {"word"}
    if units != {"piece"}:
        notes.append(
            f"This run ranks {' and '.join(sorted(units))}s; the protocol's published results "
            "(Bastings et al. 2022) rank word pieces: shortcut.unit=piece compares like with like."
        )
    tail = "\n\n" + " ".join(notes) if notes else ""
    return f"\n### Beside the reference ({source})\n\n{body}{tail}\n"


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
    if "unit" in out:  # runs from before the unit existed ranked words
        out["unit"] = out["unit"].fillna("word")
    key = ["dataset", "shortcut", "method", "config"] + (["unit"] if "unit" in out else [])
    return out.drop_duplicates(key, keep="last")
