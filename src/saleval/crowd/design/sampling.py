"""Which test samples enter a crowd study (docs/study-design.md#samples).

N samples, balanced over classes and drawn with a seed, from the samples the model
classified correctly (main study), incorrectly (misclassified study) or from all of
them (forward-prediction study, balanced over the prediction outcome so that
TP/TN/FP/FN all have samples). When a cell of the balance cannot be filled the
draw fails and says which cell, how many it had and how many it needed: a study
that is silently unbalanced would bias every accuracy computed from it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

from saleval.config.crowd import BalanceBy
from saleval.crowd.errors import SamplingError
from saleval.vocab import Population

log = logging.getLogger(__name__)


def outcome_name(label: int, pred: int, label_names: Sequence[str]) -> str:
    """Prediction outcome of one sample: ``TP``/``TN``/``FP``/``FN`` for binary tasks
    (class 1 positive), ``correct:<pred>``/``wrong:<pred>`` otherwise."""
    if len(label_names) == 2:
        return ("T" if label == pred else "F") + ("P" if pred == 1 else "N")
    return f"{'correct' if label == pred else 'wrong'}:{label_names[pred]}"


def allocate(n: int, cells: Sequence[str], rng: np.random.Generator) -> dict[str, int]:
    """Split ``n`` draws over ``cells`` as evenly as possible; the remainder goes to
    cells chosen at random (seeded), so no class is favoured by its position."""
    if not cells:
        raise SamplingError("nothing to balance over: no cells")
    base, extra = divmod(n, len(cells))
    bonus = set(rng.choice(len(cells), size=extra, replace=False).tolist()) if extra else set()
    return {c: base + (1 if i in bonus else 0) for i, c in enumerate(cells)}


def select_samples(
    predictions: pd.DataFrame,
    n: int,
    label_names: Sequence[str],
    population: str = "correct",
    balance_by: str = "label",
    seed: int = 0,
    eligible: Collection[str] | None = None,
    where: str = "predictions",
) -> pd.DataFrame:
    """Draw the study's samples.

    Returns the chosen rows of ``predictions`` (in draw order, cell by cell) with
    two added columns: ``outcome`` (see :func:`outcome_name`) and ``cell`` (the
    balance cell a sample was drawn for). ``eligible`` restricts the candidates
    (e.g. to samples that have attributions for every method).
    """
    if population not in tuple(Population):
        raise SamplingError(
            f"study.population must be one of {[str(p) for p in Population]}, got {population!r}"
        )
    if balance_by not in tuple(BalanceBy):
        raise SamplingError(
            f"study.balance_by must be one of {[str(b) for b in BalanceBy]}, got {balance_by!r}"
        )
    if n < 1:
        raise SamplingError(f"study.n_samples must be positive, got {n}")
    n_labels = len(label_names)
    df = predictions.copy()
    for col in ("label", "pred"):
        bad = ~df[col].between(0, n_labels - 1)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise SamplingError(
                f"{where}: row {row + 1}, field {col}: {df[col].iloc[row]!r} is not a label "
                f"index of {list(label_names)}"
            )
    df["outcome"] = [
        outcome_name(int(y), int(p), label_names) for y, p in zip(df["label"], df["pred"])
    ]
    correct = df["label"] == df["pred"]
    if population == "correct":
        pool = df[correct]
    elif population == "misclassified":
        pool = df[~correct]
    else:
        pool = df
    if eligible is not None:
        pool = pool[pool["sample_id"].isin(set(eligible))]
    pool = pool.sort_values("sample_id", kind="stable")

    if balance_by == "none":
        pool = pool.assign(cell="all")
        cells = ["all"]
    elif balance_by in ("label", "pred"):
        pool = pool.assign(cell=[label_names[int(v)] for v in pool[balance_by]])
        cells = list(label_names)
    else:  # outcome: every predicted class × correct/wrong the population admits
        pool = pool.assign(cell=pool["outcome"])
        cells = []
        for pred in range(n_labels):
            for ok in (True, False):
                if (population == "correct" and not ok) or (population == "misclassified" and ok):
                    continue
                cells.append(outcome_name(pred if ok else (pred + 1) % n_labels, pred, label_names))

    rng = np.random.default_rng(seed)
    want = allocate(n, cells, rng)
    short = {c: (int((pool["cell"] == c).sum()), k) for c, k in want.items()}
    short = {c: v for c, v in short.items() if v[0] < v[1]}
    if short:
        detail = ", ".join(
            f"{c}: {have} available, {need} needed" for c, (have, need) in short.items()
        )
        raise SamplingError(
            f"{where}: not enough {population} samples for a study of N={n} balanced by "
            f"{balance_by} ({detail}); {len(pool)} eligible {population} samples in all. "
            "Explain more test samples (data.n_samples), lower study.n_samples, or change "
            "study.population / study.balance_by."
        )
    chosen = []
    for c in cells:
        members = pool[pool["cell"] == c]
        if want[c]:
            picks = rng.choice(len(members), size=want[c], replace=False)
            chosen.append(members.iloc[np.sort(picks)])
    out = pd.concat(chosen, ignore_index=True)
    log.info(
        "drew %d %s samples balanced by %s: %s",
        len(out),
        population,
        balance_by,
        out["cell"].value_counts().to_dict(),
    )
    return out


def interleave(samples: pd.DataFrame, rng: np.random.Generator, by: str = "cell") -> list[str]:
    """Sample ids shuffled within each ``by`` group, then dealt round-robin over groups,
    so any run of consecutive ids (a bundle) mixes the groups evenly."""
    groups = [g["sample_id"].tolist() for _, g in samples.groupby(by, sort=True, observed=True)]
    groups = [[g[i] for i in rng.permutation(len(g))] for g in groups]
    out: list[str] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out
