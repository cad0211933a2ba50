"""From individual answers to A[i, j, k] (docs/aggregation.md), agreement, and the expert check.

Aggregators follow crowd-kit's contract: ``fit(data) -> self`` and
``fit_predict(data) -> Series`` over one long frame with columns ``task, worker,
label`` (label = answer code: 0 "I don't know", c + 1 for label c), returning a
task-indexed Series named ``agg_label``. :class:`StrictMajority` is the study's
rule; Dawid–Skene, MACE, GLAD and plain majority vote come from crowd-kit. The
configured one is built by ``hydra.utils.instantiate`` from ``crowd.aggregator``
(``_target_`` plus its parameters; the options are ``conf/crowd/aggregator/*.yaml``).
A task is *correct* when its aggregated answer is the target's code.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np
import pandas as pd

from saleval.crowd.answers import IDK_CODE, AnswerParser
from saleval.pipeline import tables

log = logging.getLogger(__name__)


def unique_winner(counts: np.ndarray) -> np.ndarray:
    """The strict-majority rule on answer counts ``(..., options)``: the index of the one
    most frequent option, or −1 where the top count is shared (a tie names nothing).

    One function for :class:`StrictMajority` and the study planner's resampled crowds
    (saleval.analysis.planning), so both aggregate by the same rule.

    >>> unique_winner(np.array([[0, 3, 1], [0, 2, 2], [1, 0, 0]])).tolist()
    [1, -1, 0]
    """
    top = counts.max(axis=-1, keepdims=True)
    unique = (counts == top).sum(axis=-1) == 1
    return np.where(unique, counts.argmax(axis=-1), -1)


class Aggregator(Protocol):
    """crowd-kit's aggregator contract, which :class:`StrictMajority` follows too."""

    def fit(self, data: pd.DataFrame) -> Any: ...

    def fit_predict(self, data: pd.DataFrame) -> pd.Series: ...


class StrictMajority:
    r"""The study's aggregation rule (docs/aggregation.md#strict-majority).

    .. math:: A_{ijk} = 1 \iff \#\{m : L_{ijkm} = y_i\} > \#\{m : L_{ijkm} = a\}
              \quad \forall a \ne y_i,\ a \in \{0, 1, \dots, C\}

    i.e. the true label must *strictly* beat every other option, "I don't know"
    (code 0) included. Equivalently: the aggregated answer is the unique most
    frequent answer, and a tie yields no answer (``<NA>``), which is never correct.

    >>> data = pd.DataFrame({"task": ["t"] * 4, "worker": list("abcd"), "label": [1, 1, 0, 0]})
    >>> bool(StrictMajority().fit_predict(data).isna().all())
    True
    """

    labels_: pd.Series

    def fit(self, data: pd.DataFrame) -> StrictMajority:
        counts = data.groupby(["task", "label"]).size().unstack(fill_value=0)
        won = unique_winner(counts.to_numpy())
        codes = np.asarray(counts.columns, dtype="int64")
        winner = pd.Series(
            np.where(won >= 0, codes[np.maximum(won, 0)], 0), index=counts.index, dtype="Int64"
        ).where(won >= 0)
        winner.index.name = "task"
        self.labels_ = winner.rename("agg_label")
        return self

    def fit_predict(self, data: pd.DataFrame) -> pd.Series:
        return self.fit(data).labels_


def aggregate(
    annotations: pd.DataFrame, tasks: pd.DataFrame, aggregator: Aggregator | None = None
) -> pd.DataFrame:
    """A[i, j, k] for every non-gold task of ``tasks`` (AGGREGATED).

    All answers (gold included) are fitted, so model-based aggregators learn worker
    skill from every answer; gold tasks are then left out. Tasks nobody answered get
    ``n_answers = 0`` and ``correct = 0`` (no label beats the others).
    ``frac_correct`` is the share of answers naming the target (per-explanation crowd
    accuracy for instance-level analyses).
    """
    aggregator = aggregator or StrictMajority()
    data = pd.DataFrame(
        {
            "task": annotations["task_id"].astype(str),
            "worker": annotations["worker_id"].astype(str),
            "label": annotations["answer_code"].astype("int64"),
        }
    )
    pred = aggregator.fit_predict(data) if len(data) else pd.Series(dtype="Int64", name="agg_label")
    scored = tasks
    if "is_gold" in tasks:
        scored = tasks[~tasks["is_gold"].astype(bool)]
    out = scored[["task_id", "sample_id", "method", "k", "label"]].copy()
    for extra in ("gold_label", "pred"):
        if extra in scored:
            out[extra] = scored[extra].astype("Int64")
    hit = annotations["answer_code"] == annotations["label"] + 1
    per_task = pd.DataFrame(
        {
            "n_answers": annotations.groupby("task_id").size(),
            "n_hit": hit.groupby(annotations["task_id"]).sum(),
        }
    )
    out = out.join(per_task, on="task_id")
    out["n_answers"] = out["n_answers"].fillna(0).astype("Int64")
    out["frac_correct"] = (out["n_hit"] / out["n_answers"].replace(0, np.nan)).astype("float64")
    agg = out["task_id"].map(pred.astype("Int64"))
    out["correct"] = (agg == out["label"] + 1).fillna(False).astype("int64")
    out = out.drop(columns=["task_id", "n_hit"])
    return tables.AGGREGATED.validate(out.reset_index(drop=True), where="aggregate")


def label_tensor(
    annotations: pd.DataFrame,
) -> tuple[np.ndarray, dict[str, list[Any]]]:
    """L[i, j, k, m] of docs/aggregation.md: −1 = worker m did not do the task, 0 = "I don't know",
    c in 1..C = label c (0-based label c − 1). Non-gold answers only.

    Returns the int8 array and its axes (``sample_id``, ``method``, ``k``, ``worker_id``).
    """
    a = annotations
    if "is_gold" in a:
        a = a[~a["is_gold"].astype(bool)]
    axes = {c: sorted(a[c].unique().tolist()) for c in ("sample_id", "method", "k", "worker_id")}
    L = np.full(tuple(len(v) for v in axes.values()), -1, dtype=np.int8)
    pos = [a[c].map({v: i for i, v in enumerate(axes[c])}).to_numpy() for c in axes]
    L[tuple(pos)] = a["answer_code"].to_numpy()
    return L, axes


def answer_matrix(annotations: pd.DataFrame, idk: str = "category") -> pd.DataFrame:
    """Workers × tasks matrix of answer codes (NaN = not answered), non-gold tasks only.

    The L[i, j, k, m] encoding of docs/aggregation.md with (i, j, k) flattened to the task:
    ``idk="missing"`` turns "I don't know" into NaN instead of category 0.
    """
    a = annotations
    if "is_gold" in a:
        a = a[~a["is_gold"].astype(bool)]
    m = a.pivot(index="worker_id", columns="task_id", values="answer_code").astype("float64")
    if idk == "missing":
        m = m.mask(m == IDK_CODE)
    elif idk != "category":
        raise ValueError(f"crowd.agreement.idk must be 'category' or 'missing', not {idk!r}")
    return m


def krippendorff_alpha(annotations: pd.DataFrame, idk: str = "category") -> float:
    """Krippendorff's alpha (nominal) over workers × tasks; NaN when undefined."""
    import krippendorff

    m = answer_matrix(annotations, idk)
    m = m.loc[:, m.notna().sum(axis=0) >= 2]  # units with one answer carry no agreement
    if m.shape[1] == 0 or np.unique(m.to_numpy()[~np.isnan(m.to_numpy())]).size < 2:
        return float("nan")
    return float(krippendorff.alpha(reliability_data=m.to_numpy(), level_of_measurement="nominal"))


def agreement(annotations: pd.DataFrame, idk: str = "category") -> dict[str, Any]:
    """Inter-annotator agreement for the dataset and per method (docs/aggregation.md#agreement)."""
    if annotations.empty:
        return {"krippendorff_alpha": None, "idk": idk}
    per_method = {
        str(m): _none_if_nan(krippendorff_alpha(g, idk))
        for m, g in annotations.groupby("method")
        if str(m) != "gold"
    }
    return {
        "krippendorff_alpha": _none_if_nan(krippendorff_alpha(annotations, idk)),
        "idk": idk,
        "per_method": per_method,
    }


def _none_if_nan(x: float) -> float | None:
    return None if np.isnan(x) else x


def draw_expert_subset(tasks: pd.DataFrame, n: int = 100, seed: int = 0) -> pd.DataFrame:
    """A seeded random subset of non-gold tasks for experts to answer (docs/aggregation.md)."""
    pool = tasks[~tasks["is_gold"].astype(bool)] if "is_gold" in tasks else tasks
    return pool.sample(n=min(n, len(pool)), random_state=seed).reset_index(drop=True)


def expert_check(
    expert: pd.DataFrame,
    aggregated: pd.DataFrame,
    tasks: pd.DataFrame,
    parse: AnswerParser,
) -> dict[str, Any]:
    """Agreement rate between experts and the crowd on the tasks experts answered.

    docs/aggregation.md: the fraction of those tasks where "expert correct" equals "crowd
    (aggregated) correct". Several experts per task are combined by the strict
    majority. ``expert`` has ``task_id, answer`` (optionally ``expert_id``).
    """
    for c in ("task_id", "answer"):
        if c not in expert:
            raise ValueError(f"expert answers: missing column {c!r}; has {list(expert.columns)}")
    e = expert.copy()
    e["task_id"] = e["task_id"].astype(str)
    unknown = sorted(set(e["task_id"]) - set(tasks["task_id"]))
    if unknown:
        raise ValueError(f"expert answers name unknown task(s) {unknown[:5]}")
    codes = []
    for i, raw in enumerate(e["answer"].astype(str), start=1):
        try:
            codes.append(parse(raw))
        except ValueError as err:
            raise ValueError(f"expert answers, row {i}, field answer: {err}") from err
    e["label"] = codes
    e["worker"] = e["expert_id"].astype(str) if "expert_id" in e else "expert"
    verdict = StrictMajority().fit_predict(e.rename(columns={"task_id": "task"}))
    target = tasks.set_index("task_id")["label"] + 1
    expert_correct = (verdict == target.reindex(verdict.index)).fillna(False).astype(int)
    key = tasks.set_index("task_id")[["sample_id", "method", "k"]].loc[verdict.index]
    crowd = aggregated.set_index(["sample_id", "method", "k"])["correct"]
    crowd_correct = crowd.reindex(pd.MultiIndex.from_frame(key)).to_numpy()
    keep = ~pd.isna(crowd_correct)
    agree = expert_correct.to_numpy()[keep] == crowd_correct[keep].astype(int)
    return {
        "n_tasks": int(keep.sum()),
        "agreement": float(agree.mean()) if keep.any() else None,
        "expert_accuracy": float(expert_correct.to_numpy()[keep].mean()) if keep.any() else None,
        "crowd_accuracy": float(crowd_correct[keep].astype(int).mean()) if keep.any() else None,
    }
