"""The tasks t_ijk of a study (docs/study-design.md): per sample i, method j and k of the k-grid,
the sample's words with the top-k words of method j shown.

Rankings come from :func:`saleval.words.rank_words` (ties go to the earlier word), and
one ranking serves every k, so top-k sets are nested across k. A text with fewer than k
words is shown whole and flagged (``all_shown``). The answer that counts is the gold
label (``target: gold``) or the model's prediction (``target: prediction``, the
forward-prediction variant of docs/study-design.md). The noise ablation swaps a fraction of the
shown words for other words of the same text (:func:`noisy_shown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import DesignError
from saleval.crowd.design.rendering import render
from saleval.crowd.seeding import seeded_rng
from saleval.progress import bar
from saleval.vocab import Target
from saleval.words import rank_words


def task_id(sample_id: str, method: str, k: int) -> str:
    """Stable, readable task id: ``<sample_id>|<method>|k<k>``."""
    return f"{sample_id}|{method}|k{int(k)}"


def noisy_shown(
    ranking: np.ndarray, k: int, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """Noise ablation (docs/study-design.md#study-variants): the top-k set with
    round(fraction·|top-k|) of its words swapped for random words of the same text
    outside the top-k (fewer when the text has too few other words). Nesting across k
    is not kept under noise."""
    top = ranking[:k]
    rest = ranking[k:]
    m = min(round(fraction * len(top)), len(rest))
    if m == 0:
        return np.sort(top)
    drop = rng.choice(len(top), size=m, replace=False)
    add = rng.choice(len(rest), size=m, replace=False)
    kept = np.delete(top, drop)
    return np.sort(np.concatenate([kept, rest[add]]))


def word_table(
    attributions: pd.DataFrame, sample_ids: Sequence[str], methods: Sequence[str], where: str
) -> dict[str, dict[str, Any]]:
    """Per sample: its words in order, and each method's ranking over them.

    Fails when a method lacks a sample or methods disagree on a sample's words:
    rankings over different word lists could not be compared.
    """
    wanted = attributions[
        attributions["sample_id"].isin(set(sample_ids)) & attributions["method"].isin(set(methods))
    ].sort_values(["sample_id", "method", "word_index"], kind="stable")
    out: dict[str, dict[str, Any]] = {}
    groups = {key: g for key, g in wanted.groupby(["sample_id", "method"], sort=False)}
    for sid in sample_ids:
        ref_words: list[str] | None = None
        ref_idx: np.ndarray | None = None
        ranks: dict[str, np.ndarray] = {}
        for m in methods:
            g = groups.get((sid, m))
            if g is None or g.empty:
                raise DesignError(f"{where}: no attribution rows for sample {sid!r}, method {m!r}")
            idx = g["word_index"].to_numpy(dtype=np.int64)
            words = g["word"].astype(str).tolist()
            if ref_idx is None:
                ref_idx, ref_words = idx, words
                if not np.array_equal(idx, np.arange(len(idx))):
                    raise DesignError(
                        f"{where}: sample {sid!r}, method {m!r}: word_index is not 0..n-1 "
                        f"(got {idx[:8].tolist()}...)"
                    )
            elif not (np.array_equal(idx, ref_idx) and words == ref_words):
                raise DesignError(
                    f"{where}: sample {sid!r}: method {m!r} covers other words than "
                    f"method {methods[0]!r}; every method must rank the same words"
                )
            try:  # positions are word indices here (checked above): ties go to the earlier word
                ranks[m] = rank_words(g["score"].to_numpy(dtype=np.float64))
            except ValueError as err:
                raise DesignError(f"{where}: sample {sid!r}, method {m!r}: {err}") from err
        assert ref_words is not None
        out[sid] = {"words": ref_words, "ranks": ranks}
    return out


def build_tasks(
    samples: pd.DataFrame,
    attributions: pd.DataFrame,
    methods: Sequence[str],
    ks: Sequence[int],
    target: str = Target.gold,
    noise: float = 0.0,
    seed: int = 0,
    where: str = "attributions",
) -> pd.DataFrame:
    """Every task t_ijk of the study (docs/study-design.md#tasks), one row per (sample, method, k).

    ``samples`` has ``sample_id, label, pred``. Columns follow ``tables.TASKS``;
    ``shown_words`` lists the shown word positions so that nesting, overlap and the
    annotation app's highlights need no re-parsing of the display text.
    """
    if target not in tuple(Target):
        raise DesignError(f"study.target must be one of {[str(t) for t in Target]}, got {target!r}")
    target = Target(target)
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise DesignError(f"the k-grid must hold positive integers, got {list(ks)}")
    ids = samples["sample_id"].astype(str).tolist()
    words = word_table(attributions, ids, methods, where)
    rows = []
    for rec in bar(
        samples.itertuples(index=False), total=len(samples), desc="tasks", leave=False, disable=None
    ):
        sid = str(rec.sample_id)
        ws = words[sid]["words"]
        n = len(ws)
        gold, pred = int(rec.label), int(rec.pred)
        for m in methods:
            ranking = words[sid]["ranks"][m]
            for k in ks:
                if noise > 0:
                    shown = noisy_shown(ranking, k, noise, seeded_rng(seed, "noise", sid, m, k))
                else:
                    shown = np.sort(ranking[:k])
                rows.append(
                    {
                        "task_id": task_id(sid, m, k),
                        "sample_id": sid,
                        "method": m,
                        "k": k,
                        "label": gold if target == Target.gold else pred,
                        "display_text": render(ws, shown),
                        "n_words_shown": len(shown),
                        "n_words": n,
                        "all_shown": n <= k,
                        "is_gold": False,
                        "target": target.value,
                        "gold_label": gold,
                        "pred": pred,
                        "shown_words": " ".join(str(int(i)) for i in shown),
                    }
                )
    return pd.DataFrame(rows)
