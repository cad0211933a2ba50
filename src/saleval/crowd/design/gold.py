"""Gold questions (attention checks, docs/study-design.md): short full texts outside the study whose
label is not in doubt, mixed into bundles to find workers who do not read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import DesignError
from saleval.crowd.design.rendering import render
from saleval.vocab import PROBS, Target
from saleval.words import word_spans

GOLD_METHOD = "gold"
"""The ``method`` of gold tasks; reserved, no saliency method may be called so."""


def gold_task_id(sample_id: str) -> str:
    return f"{sample_id}|{GOLD_METHOD}"


def select_gold(
    predictions: pd.DataFrame,
    exclude: set[str],
    label_names: Sequence[str],
    n: int,
    max_words: int = 60,
) -> pd.DataFrame:
    """Gold questions (attention checks): unambiguous full texts, not in the study.

    Unambiguous = the model got it right with high confidence and the text is short;
    the most confident per class are taken round-robin so every label appears.
    Returns task rows (``method='gold'``, ``is_gold=True``, every word shown).
    """
    prob_cols = PROBS.columns(label_names)
    pool = predictions[
        (predictions["label"] == predictions["pred"]) & ~predictions["sample_id"].isin(exclude)
    ].copy()
    pool["words"] = [[t[s:e] for s, e in word_spans(str(t))] for t in pool["text"]]
    pool["n_words"] = pool["words"].map(len)
    pool = pool[(pool["n_words"] > 0) & (pool["n_words"] <= max_words)]
    if all(c in pool.columns for c in prob_cols):
        probs = pool[prob_cols].to_numpy()
        pool["confidence"] = probs[np.arange(len(pool)), pool["label"].to_numpy(dtype=int)]
    else:
        pool["confidence"] = 1.0
    pool = pool.sort_values(["confidence", "sample_id"], ascending=[False, True], kind="stable")
    per_class = [g for _, g in pool.groupby("label", sort=True)]
    picked: list[Any] = []
    depth = 0
    while len(picked) < n and any(depth < len(g) for g in per_class):
        picked.extend(g.iloc[depth] for g in per_class if depth < len(g))
        depth += 1
    picked = picked[:n]
    if len(picked) < n:
        raise DesignError(
            f"gold questions: only {len(picked)} correctly classified samples of at most "
            f"{max_words} words outside the study are available, {n} needed (study.gold_pool); "
            "explain more samples or lower study.gold_pool / raise study.gold_max_words"
        )
    rows = []
    for r in picked:
        ws = list(r["words"])
        rows.append(
            {
                "task_id": gold_task_id(str(r["sample_id"])),
                "sample_id": str(r["sample_id"]),
                "method": GOLD_METHOD,
                "k": len(ws),
                "label": int(r["label"]),
                "display_text": render(ws, range(len(ws))),
                "n_words_shown": len(ws),
                "n_words": len(ws),
                "all_shown": True,
                "is_gold": True,
                "target": Target.gold.value,
                "gold_label": int(r["label"]),
                "pred": int(r["pred"]),
                "shown_words": " ".join(str(i) for i in range(len(ws))),
            }
        )
    return pd.DataFrame(rows)
