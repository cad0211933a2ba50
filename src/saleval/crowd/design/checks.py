"""Verification of a built design (docs/study-design.md#bundles): every constraint, every
violation reported, so a broken design never reaches workers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import DesignError
from saleval.crowd.design.gold import GOLD_METHOD


@dataclass(frozen=True)
class Violation:
    """One broken constraint: which, where (a bundle or task id), and how."""

    constraint: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.constraint}] {self.where}: {self.detail}"


def _parse_shown(value: Any) -> set[int]:
    text = "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    return {int(x) for x in text.split()} if text.strip() else set()


def check_design(
    tasks: pd.DataFrame,
    bundles: pd.DataFrame,
    repeats: int,
    bundle_size: int,
    balance_tolerance: int = 0,
    nested: bool = True,
) -> list[Violation]:
    """Every constraint of docs/study-design.md on a design; returns all violations (empty = valid).

    * ``duplicate_task`` / ``unknown_task`` / ``gold_flag``: task ids are unique,
      bundles name only known tasks, flagged as the tasks are; gold tasks have
      method ``gold``.
    * ``positions``: positions of a bundle are 1..n without gaps or repeats.
    * ``bundle_size``: every bundle holds exactly B study tasks (gold come on top).
    * ``same_sample``: no bundle holds two tasks of one sample.
    * ``repeats``: every study task is answered exactly R times (0 = missing).
    * ``method_balance`` / ``k_balance``: a bundle holds each method floor(B/M) to
      ceil(B/M) times, each k floor(B/K) to ceil(B/K) times (± tolerance).
    * ``grid``: every sample has a task for every method × k.
    * ``shown_count`` / ``nested``: min(k, n_words) words shown; shown sets grow with k
      (checked when ``nested`` and the tasks carry ``shown_words``).
    """
    out = _duplicate_tasks(tasks)
    t = tasks.drop_duplicates("task_id").set_index("task_id", drop=False)
    if "is_gold" in t.columns:
        t_gold = t["is_gold"].astype(bool)
    else:
        t_gold = pd.Series(False, index=t.index)
    study = t[~t_gold]
    out += _gold_methods(t, t_gold)
    known = bundles["task_id"].isin(t.index)
    out += _unknown_tasks(bundles[~known])
    b = _with_tasks(bundles[known], t, t_gold)
    out += _bundle_gold_flags(b)
    out += _positions(bundles)
    out += _same_sample(b)
    s = b[~b["task_gold"]]
    out += _bundle_sizes(s, bundles, bundle_size)
    out += _balance(study, s, bundle_size, int(balance_tolerance))
    out += _repeats(study, s, repeats)
    out += _grid(study)
    if "n_words" in study.columns:
        out += _shown_counts(study)
    if nested and "shown_words" in study.columns:
        out += _nested(study)
    return out


def _duplicate_tasks(tasks: pd.DataFrame) -> list[Violation]:
    """``duplicate_task``: each task id once in the task table."""
    return [
        Violation("duplicate_task", str(tid), "task id appears more than once")
        for tid in tasks["task_id"][tasks["task_id"].duplicated()].unique()
    ]


def _gold_methods(t: pd.DataFrame, t_gold: pd.Series) -> list[Violation]:
    """``gold_flag`` in the task table: gold tasks, and only they, have method ``gold``."""
    out = [
        Violation("gold_flag", tid, "gold task whose method is not 'gold'")
        for tid in t.index[t_gold & (t["method"] != GOLD_METHOD)]
    ]
    out += [
        Violation("gold_flag", tid, "method 'gold' but is_gold is false")
        for tid in t.index[~t_gold & (t["method"] == GOLD_METHOD)]
    ]
    return out


def _unknown_tasks(unknown: pd.DataFrame) -> list[Violation]:
    """``unknown_task``: one per bundle row naming a task the task table lacks."""
    return [
        Violation(
            "unknown_task",
            r.bundle_id,
            f"position {r.position}: task {r.task_id!r} is not in tasks",
        )
        for r in unknown.itertuples(index=False)
    ]


def _with_tasks(b: pd.DataFrame, t: pd.DataFrame, t_gold: pd.Series) -> pd.DataFrame:
    """Bundle rows of known tasks with their task's sample, method, k and gold flag
    (``task_gold``), which the per-bundle constraints are checked on."""
    b = b.copy()
    for col in ("sample_id", "method", "k"):
        b[col] = t.loc[b["task_id"], col].to_numpy()
    b["task_gold"] = t_gold.loc[b["task_id"]].to_numpy()
    return b


def _bundle_gold_flags(b: pd.DataFrame) -> list[Violation]:
    """``gold_flag`` in the bundles: a bundle row is flagged gold as its task is."""
    return [
        Violation(
            "gold_flag",
            r.bundle_id,
            f"position {r.position}: is_gold={r.is_gold} but task {r.task_id!r} has is_gold={r.task_gold}",
        )
        for r in b[b["is_gold"].astype(bool) != b["task_gold"]].itertuples(index=False)
    ]


def _positions(bundles: pd.DataFrame) -> list[Violation]:
    """``positions``: a bundle's positions are 1..n without gaps or repeats."""
    pos = bundles.groupby("bundle_id")["position"].agg(["min", "max", "size", "nunique"])
    bad_pos = pos[(pos["min"] != 1) | (pos["max"] != pos["size"]) | (pos["nunique"] != pos["size"])]
    return [
        Violation("positions", str(bid), f"positions are not 1..{r['size']}")
        for bid, r in bad_pos.iterrows()
    ]


def _same_sample(b: pd.DataFrame) -> list[Violation]:
    """``same_sample``: no bundle holds two tasks of one sample."""
    dup = b[b.duplicated(["bundle_id", "sample_id"], keep=False)]
    return [
        Violation("same_sample", str(bid), f"holds {len(g)} tasks of sample {sid!r}")
        for (bid, sid), g in dup.groupby(["bundle_id", "sample_id"], sort=True)
    ]


def _bundle_sizes(s: pd.DataFrame, bundles: pd.DataFrame, bundle_size: int) -> list[Violation]:
    """``bundle_size``: every bundle holds exactly B study tasks (``s``: its study rows)."""
    sizes = (
        s.groupby("bundle_id").size().reindex(sorted(bundles["bundle_id"].unique()), fill_value=0)
    )
    return [
        Violation("bundle_size", str(bid), f"{n} study tasks, expected B={bundle_size}")
        for bid, n in sizes[sizes != bundle_size].items()
    ]


def _balance(study: pd.DataFrame, s: pd.DataFrame, bundle_size: int, tol: int) -> list[Violation]:
    """``method_balance`` / ``k_balance``: each of the M methods floor(B/M) to ceil(B/M)
    times per bundle, each of the K ks floor(B/K) to ceil(B/K) times (± ``tol``)."""
    out: list[Violation] = []
    for col, name, label in (("method", "method_balance", "method"), ("k", "k_balance", "k")):
        values = sorted(study[col].unique())
        if not values:
            continue
        lo, hi = bundle_size // len(values) - tol, -(-bundle_size // len(values)) + tol
        counts = pd.crosstab(s["bundle_id"], s[col]).reindex(columns=values, fill_value=0)
        stacked = counts.stack()
        for (bid, value), c in stacked[(stacked < lo) | (stacked > hi)].items():
            shown = f"{label} {value!r}" if col == "method" else f"k={value}"
            out.append(Violation(name, str(bid), f"{shown} {c} times, expected {lo}..{hi}"))
    return out


def _repeats(study: pd.DataFrame, s: pd.DataFrame, repeats: int) -> list[Violation]:
    """``repeats``: every study task is answered exactly R times (0 = missing)."""
    counts = s["task_id"].value_counts().reindex(study.index, fill_value=0)
    return [
        Violation("repeats", str(tid), f"answered {c} times, expected R={repeats}")
        for tid, c in counts[counts != repeats].items()
    ]


def _grid(study: pd.DataFrame) -> list[Violation]:
    """``grid``: every sample has a study task for every method × k."""
    methods, ks = sorted(study["method"].unique()), sorted(int(k) for k in study["k"].unique())
    per_sample = study.groupby("sample_id").size()
    have = set(zip(study["sample_id"], study["method"], study["k"].astype(int)))
    out: list[Violation] = []
    for sid in per_sample.index:
        missing = [(m, k) for m in methods for k in ks if (sid, m, k) not in have]
        if missing:
            out.append(
                Violation(
                    "grid",
                    str(sid),
                    f"missing {len(missing)} (method, k) tasks, e.g. {missing[:3]}",
                )
            )
    return out


def _shown_counts(study: pd.DataFrame) -> list[Violation]:
    """``shown_count``: a task shows min(k, n_words) words."""
    expect = np.minimum(study["k"].to_numpy(dtype=int), study["n_words"].to_numpy(dtype=int))
    shown_n = study["n_words_shown"].to_numpy(dtype=int)
    return [
        Violation("shown_count", str(tid), f"{got} words shown, expected min(k, n_words) = {exp}")
        for tid, got, exp in zip(
            study.index[shown_n != expect], shown_n[shown_n != expect], expect[shown_n != expect]
        )
    ]


def _nested(study: pd.DataFrame) -> list[Violation]:
    """``nested``: a method's shown words on a sample only grow with k."""
    ordered = study.sort_values(["sample_id", "method", "k"], kind="stable")
    out: list[Violation] = []
    prev_key: tuple[str, str] | None = None
    prev: set[int] = set()
    for tid, sid, m, shown in zip(
        ordered["task_id"], ordered["sample_id"], ordered["method"], ordered["shown_words"]
    ):
        cur = _parse_shown(shown)
        if (sid, m) == prev_key and not prev <= cur:
            out.append(
                Violation(
                    "nested",
                    str(tid),
                    f"top-k set of {m!r} on {sid!r} drops words shown at a smaller k",
                )
            )
        prev_key, prev = (sid, m), cur
    return out


def assert_design(violations: Sequence[Violation], limit: int = 20) -> None:
    """Raise :class:`DesignError` listing the violations (first ``limit``) if any."""
    if violations:
        kinds = pd.Series([v.constraint for v in violations]).value_counts().to_dict()
        lines = "\n".join(f"  {v}" for v in violations[:limit])
        more = f"\n  ... and {len(violations) - limit} more" if len(violations) > limit else ""
        raise DesignError(
            f"the study design breaks {len(violations)} constraint(s) {kinds}:\n{lines}{more}"
        )
