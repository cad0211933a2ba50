"""The crowd study's design (SPEC §4): tasks t_ijk, what a worker sees, and bundles.

* **Tasks.** For every sample i, method j and k of the k-grid, the worker sees the
  sample's kept words in order, the top-k words of method j shown and every other
  word replaced by one "." (:func:`render`). Rankings break ties by word index, so
  top-k sets are nested across k (:func:`rank_words`). A text with fewer than k
  words is shown whole and flagged (``all_shown``). The answer that counts is the
  gold label (``target: gold``) or the model's prediction (``target: prediction``,
  the forward-prediction variant of SPEC §6). The noise ablation swaps a fraction
  of the shown words for other words of the same text (:func:`noisy_shown`).
* **Bundles.** Each worker answers one bundle; :func:`assign_bundles` builds them so
  that every task is answered R times, no bundle holds two tasks of one sample and
  every bundle mixes methods and k evenly. :func:`check_design` verifies all of it
  and reports every violation, so a broken design never reaches workers.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from saleval.crowd.sampling import SamplingError, interleave, select_samples
from saleval.words import word_spans

log = logging.getLogger(__name__)

IDK = "I don't know"
"""The answer option for "I cannot tell from the shown words" (SPEC §4)."""

GOLD_METHOD = "gold"
TARGETS = ("gold", "prediction")


class DesignError(ValueError):
    """The study cannot be built as configured, or a built design breaks a constraint."""


def answer_options(label_names: Sequence[str]) -> list[str]:
    """What a worker can answer: every label name, then "I don't know"."""
    return [*label_names, IDK]


# ---------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------


@dataclass
class StudyConfig:
    """``conf/study/*.yaml``; see ``conf/study/main.yaml`` for what each field means."""

    name: str = "main"
    n_samples: int = 100
    population: str = "correct"
    balance_by: str = "label"
    target: str = "gold"
    methods: list[str] | None = None
    baseline: str = "random"
    require_baseline: bool = True
    bundle_size: int | None = 100
    repeats: int = 5
    balance_tolerance: int = 0
    gold_rate: float = 0.0
    gold_pool: int = 20
    gold_max_words: int = 60
    noise: float = 0.0
    seed: int = 42

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any] | Any) -> StudyConfig:
        conf = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(conf) - known)
        if unknown:
            raise DesignError(
                f"study config has unknown field(s) {unknown}; known: {sorted(known)}"
            )
        out = cls(**{k: v for k, v in conf.items()})
        out.methods = None if out.methods is None else [str(m) for m in out.methods]
        if out.target not in TARGETS:
            raise DesignError(f"study.target must be one of {TARGETS}, got {out.target!r}")
        if not 0.0 <= float(out.noise) <= 1.0:
            raise DesignError(f"study.noise must lie in [0, 1], got {out.noise}")
        if out.repeats < 1:
            raise DesignError(f"study.repeats must be at least 1, got {out.repeats}")
        if not 0.0 <= float(out.gold_rate) < 1.0:
            raise DesignError(f"study.gold_rate must lie in [0, 1), got {out.gold_rate}")
        return out


def seeded_rng(seed: int, *keys: object) -> np.random.Generator:
    """A generator determined by the seed and the keys (stable across processes,
    unlike ``hash``), so each task's randomness does not depend on iteration order."""
    words = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(str(k).encode()) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(words))


# ---------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------


def rank_words(
    word_index: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Word indices from most to least salient; ties go to the earlier word.

    Because one ranking serves every k, top-k sets are nested across k.
    """
    idx = np.asarray(word_index, dtype=np.int64)
    sc = np.asarray(scores, dtype=np.float64)
    if np.isnan(sc).any():
        raise DesignError("saliency scores contain NaN; cannot rank words")
    return idx[np.lexsort((idx, -sc))]


def render(words: Sequence[str], shown: Sequence[int] | set[int] | np.ndarray) -> str:
    """SPEC §4's rendering rule: a hidden word becomes ".", a shown word becomes the
    word followed by one space (``..jason .....creative writing just .....crush ``).

    ``words`` are a sample's kept words in text order (punctuation-only words and
    special tokens were dropped upstream and are never shown); ``shown`` holds
    positions into ``words``.
    """
    keep = set(int(i) for i in shown)
    bad = [i for i in keep if not 0 <= i < len(words)]
    if bad:
        raise DesignError(f"shown word positions {sorted(bad)[:5]} outside 0..{len(words) - 1}")
    return "".join(f"{w} " if i in keep else "." for i, w in enumerate(words))


def noisy_shown(
    ranking: np.ndarray, k: int, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """Noise ablation (SPEC §6): the top-k set with round(fraction·|top-k|) of its words
    swapped for random words of the same text outside the top-k (fewer when the text
    has too few other words). Nesting across k is not kept under noise."""
    top = ranking[:k]
    rest = ranking[k:]
    m = min(round(fraction * len(top)), len(rest))
    if m == 0:
        return np.sort(top)
    drop = rng.choice(len(top), size=m, replace=False)
    add = rng.choice(len(rest), size=m, replace=False)
    kept = np.delete(top, drop)
    return np.sort(np.concatenate([kept, rest[add]]))


def task_id(sample_id: str, method: str, k: int) -> str:
    """Stable, readable task id: ``<sample_id>|<method>|k<k>``."""
    return f"{sample_id}|{method}|k{int(k)}"


def gold_task_id(sample_id: str) -> str:
    return f"{sample_id}|{GOLD_METHOD}"


def _word_table(
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
            try:
                ranks[m] = rank_words(idx, g["score"].to_numpy(dtype=np.float64))
            except DesignError as err:
                raise DesignError(f"{where}: sample {sid!r}, method {m!r}: {err}") from err
        assert ref_words is not None
        out[sid] = {"words": ref_words, "ranks": ranks}
    return out


def build_tasks(
    samples: pd.DataFrame,
    attributions: pd.DataFrame,
    methods: Sequence[str],
    ks: Sequence[int],
    target: str = "gold",
    noise: float = 0.0,
    seed: int = 0,
    where: str = "attributions",
) -> pd.DataFrame:
    """Every task t_ijk of the study (SPEC §4), one row per (sample, method, k).

    ``samples`` has ``sample_id, label, pred``. Columns follow ``tables.TASKS``;
    ``shown_words`` lists the shown word positions so that nesting, overlap and the
    annotation app's highlights need no re-parsing of the display text.
    """
    if target not in TARGETS:
        raise DesignError(f"study.target must be one of {TARGETS}, got {target!r}")
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise DesignError(f"the k-grid must hold positive integers, got {list(ks)}")
    ids = samples["sample_id"].astype(str).tolist()
    words = _word_table(attributions, ids, methods, where)
    rows = []
    for rec in tqdm(samples.itertuples(index=False), total=len(samples), desc="tasks", leave=False):
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
                        "label": gold if target == "gold" else pred,
                        "display_text": render(ws, shown),
                        "n_words_shown": len(shown),
                        "n_words": n,
                        "all_shown": n <= k,
                        "is_gold": False,
                        "target": target,
                        "gold_label": gold,
                        "pred": pred,
                        "shown_words": " ".join(str(int(i)) for i in shown),
                    }
                )
    return pd.DataFrame(rows)


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
    prob_cols = [f"prob_{name}" for name in label_names]
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
                "target": "gold",
                "gold_label": int(r["label"]),
                "pred": int(r["pred"]),
                "shown_words": " ".join(str(i) for i in range(len(ws))),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------
# Bundles
# ---------------------------------------------------------------------------------


def _divisors_up_to(total: int, limit: int) -> list[int]:
    return [d for d in range(limit, 0, -1) if total % d == 0][:4]


def assign_bundles(
    tasks: pd.DataFrame,
    orders: Sequence[Sequence[str]],
    methods: Sequence[str],
    ks: Sequence[int],
    bundle_size: int,
    repeats: int,
    seed: int = 0,
    gold_ids: Sequence[str] = (),
    gold_per_bundle: int = 0,
) -> pd.DataFrame:
    """Bundles in which every task appears ``repeats`` times (SPEC §4).

    Construction. Think of the study as ``P·R`` *laps*, each a pass over the N samples
    in a fixed order; lap ``c`` (``c1 = c mod M``, ``c2 = c div M``) gives the sample
    at position j the method ``(j + c1) mod M`` and the k ``(j + c2) mod K``. Over the
    P laps of one repeat a sample gets every (method, k) pair exactly once; any run
    of consecutive positions in a lap cycles through methods and ks, so it is
    balanced in both. Bundles are consecutive runs of B slots of the laps: with
    B ≤ N a run never holds a sample twice. ``orders`` holds one sample order per
    repeat (class-interleaved), so the R copies of a task land in different company;
    when the laps of one repeat do not fill whole bundles, the first order serves all
    repeats, which keeps runs that cross a repeat free of duplicate samples.
    Positions inside a bundle are shuffled (seeded); ``gold_per_bundle`` gold
    questions, cycling through ``gold_ids``, are mixed in.
    """
    methods, ks = list(methods), sorted({int(k) for k in ks})
    n_m, n_k = len(methods), len(ks)
    n_pairs = n_m * n_k
    n = len(orders[0])
    total = n * n_pairs * repeats
    if bundle_size > n:
        raise DesignError(
            f"bundle size B={bundle_size} exceeds the N={n} samples: a bundle may not hold two "
            f"tasks of one sample; use B <= {n}"
        )
    if total % bundle_size:
        raise DesignError(
            f"{n} samples x {n_m} methods x {n_k} k values x R={repeats} = {total} answers do "
            f"not fill bundles of B={bundle_size}; choose B dividing {total}, at most {n} "
            f"(e.g. {_divisors_up_to(total, n)})"
        )
    if gold_per_bundle > len(gold_ids):
        raise DesignError(
            f"{gold_per_bundle} gold questions per bundle need at least as many gold items; "
            f"have {len(gold_ids)} (study.gold_pool)"
        )
    per_repeat = (n * n_pairs) % bundle_size == 0 and len(orders) >= repeats
    lookup = {
        (s, m, int(k)): t
        for t, s, m, k in tasks[["task_id", "sample_id", "method", "k"]].itertuples(index=False)
    }
    stream: list[str] = []
    for a in range(repeats):
        order = orders[a] if per_repeat else orders[0]
        if len(order) != n or len(set(order)) != n:
            raise DesignError("every repeat's sample order must list the same N distinct samples")
        for c in range(n_pairs):
            c1, c2 = c % n_m, c // n_m
            for j, sid in enumerate(order):
                key = (sid, methods[(j + c1) % n_m], ks[(j + c2) % n_k])
                if key not in lookup:
                    raise DesignError(
                        f"no task for sample {key[0]!r}, method {key[1]!r}, k={key[2]}"
                    )
                stream.append(lookup[key])
    n_bundles = total // bundle_size
    width = max(3, len(str(n_bundles)))
    rows = []
    for b in range(n_bundles):
        bid = f"b{b + 1:0{width}d}"
        items = [(t, False) for t in stream[b * bundle_size : (b + 1) * bundle_size]]
        items += [
            (gold_ids[(b * gold_per_bundle + g) % len(gold_ids)], True)
            for g in range(gold_per_bundle)
        ]
        perm = seeded_rng(seed, "bundle", bid).permutation(len(items))
        rows.extend(
            {"bundle_id": bid, "position": pos + 1, "task_id": items[i][0], "is_gold": items[i][1]}
            for pos, i in enumerate(perm)
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------


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
    """Every constraint of SPEC §4 on a design; returns all violations (empty = valid).

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
    out: list[Violation] = []
    for tid in tasks["task_id"][tasks["task_id"].duplicated()].unique():
        out.append(Violation("duplicate_task", str(tid), "task id appears more than once"))
    t = tasks.drop_duplicates("task_id").set_index("task_id", drop=False)
    if "is_gold" in t.columns:
        t_gold = t["is_gold"].astype(bool)
    else:
        t_gold = pd.Series(False, index=t.index)
    study = t[~t_gold]

    for tid in t.index[t_gold & (t["method"] != GOLD_METHOD)]:
        out.append(Violation("gold_flag", tid, "gold task whose method is not 'gold'"))
    for tid in t.index[~t_gold & (t["method"] == GOLD_METHOD)]:
        out.append(Violation("gold_flag", tid, "method 'gold' but is_gold is false"))

    known = bundles["task_id"].isin(t.index)
    for r in bundles[~known].itertuples(index=False):
        out.append(
            Violation(
                "unknown_task",
                r.bundle_id,
                f"position {r.position}: task {r.task_id!r} is not in tasks",
            )
        )
    b = bundles[known].copy()
    for col in ("sample_id", "method", "k"):
        b[col] = t.loc[b["task_id"], col].to_numpy()
    b["task_gold"] = t_gold.loc[b["task_id"]].to_numpy()
    for r in b[b["is_gold"].astype(bool) != b["task_gold"]].itertuples(index=False):
        out.append(
            Violation(
                "gold_flag",
                r.bundle_id,
                f"position {r.position}: is_gold={r.is_gold} but task {r.task_id!r} has is_gold={r.task_gold}",
            )
        )

    pos = bundles.groupby("bundle_id")["position"].agg(["min", "max", "size", "nunique"])
    bad_pos = pos[(pos["min"] != 1) | (pos["max"] != pos["size"]) | (pos["nunique"] != pos["size"])]
    for bid, r in bad_pos.iterrows():
        out.append(Violation("positions", str(bid), f"positions are not 1..{r['size']}"))

    dup = b[b.duplicated(["bundle_id", "sample_id"], keep=False)]
    for (bid, sid), g in dup.groupby(["bundle_id", "sample_id"], sort=True):
        out.append(Violation("same_sample", str(bid), f"holds {len(g)} tasks of sample {sid!r}"))

    s = b[~b["task_gold"]]
    sizes = (
        s.groupby("bundle_id").size().reindex(sorted(bundles["bundle_id"].unique()), fill_value=0)
    )
    for bid, n in sizes[sizes != bundle_size].items():
        out.append(Violation("bundle_size", str(bid), f"{n} study tasks, expected B={bundle_size}"))

    tol = int(balance_tolerance)
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

    counts = s["task_id"].value_counts().reindex(study.index, fill_value=0)
    for tid, c in counts[counts != repeats].items():
        out.append(Violation("repeats", str(tid), f"answered {c} times, expected R={repeats}"))

    methods, ks = sorted(study["method"].unique()), sorted(int(k) for k in study["k"].unique())
    per_sample = study.groupby("sample_id").size()
    have = set(zip(study["sample_id"], study["method"], study["k"].astype(int)))
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

    if "n_words" in study.columns:
        expect = np.minimum(study["k"].to_numpy(dtype=int), study["n_words"].to_numpy(dtype=int))
        shown_n = study["n_words_shown"].to_numpy(dtype=int)
        for tid, got, exp in zip(
            study.index[shown_n != expect], shown_n[shown_n != expect], expect[shown_n != expect]
        ):
            out.append(
                Violation(
                    "shown_count", str(tid), f"{got} words shown, expected min(k, n_words) = {exp}"
                )
            )
    if nested and "shown_words" in study.columns:
        ordered = study.sort_values(["sample_id", "method", "k"], kind="stable")
        prev_key, prev = None, set()
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


# ---------------------------------------------------------------------------------
# The whole study
# ---------------------------------------------------------------------------------


@dataclass
class StudyDesign:
    """Everything ``saleval-tasks`` writes, plus the drawn samples and a summary."""

    samples: pd.DataFrame
    tasks: pd.DataFrame
    bundles: pd.DataFrame
    methods: list[str]
    ks: list[int]
    info: dict[str, Any] = field(default_factory=dict)


def choose_methods(available: Sequence[str], study: StudyConfig, where: str) -> list[str]:
    """The study's methods: configured ones (or all available), baseline required."""
    available = sorted(set(available))
    if GOLD_METHOD in available:
        raise DesignError(f"{where}: method name {GOLD_METHOD!r} is reserved for gold questions")
    methods = list(study.methods) if study.methods else available
    missing = [m for m in methods if m not in available]
    if missing:
        raise DesignError(
            f"{where}: study.methods {missing} have no attributions; available: {available}"
        )
    if len(set(methods)) != len(methods):
        raise DesignError(f"study.methods lists a method twice: {methods}")
    if study.require_baseline and study.baseline not in methods:
        raise DesignError(
            f"{where}: the study needs the baseline method {study.baseline!r} "
            f"(methods: {methods}); explain with it or set study.require_baseline=false"
        )
    return methods


def build_study(
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    label_names: Sequence[str],
    study: StudyConfig,
    ks: Sequence[int],
    where: str = "explain run",
) -> StudyDesign:
    """Samples → tasks → bundles → verified design (SPEC §4)."""
    methods = choose_methods(attributions["method"].unique(), study, where)
    ks = sorted({int(k) for k in ks})
    # A sample is eligible when every study method explained it with at least one word.
    cover = (
        attributions[attributions["method"].isin(methods)].groupby("sample_id")["method"].nunique()
    )
    eligible = set(cover.index[cover == len(methods)])
    if len(eligible) < predictions["sample_id"].nunique():
        log.warning(
            "%d explained samples lack attributions for some of %s and are not eligible",
            predictions["sample_id"].nunique() - len(eligible),
            methods,
        )
    try:
        samples = select_samples(
            predictions,
            int(study.n_samples),
            label_names,
            population=study.population,
            balance_by=study.balance_by,
            seed=int(study.seed),
            eligible=eligible,
            where=f"{where}: predictions",
        )
    except SamplingError as err:
        raise DesignError(str(err)) from err
    n = len(samples)
    bundle_size = int(study.bundle_size) if study.bundle_size else n
    tasks = build_tasks(
        samples,
        attributions,
        methods,
        ks,
        study.target,
        float(study.noise),
        int(study.seed),
        f"{where}: attributions",
    )

    gold_per_bundle = round(float(study.gold_rate) * bundle_size)
    if study.gold_rate > 0 and gold_per_bundle == 0:
        gold_per_bundle = 1
    gold = pd.DataFrame()
    if gold_per_bundle:
        gold = select_gold(
            predictions,
            set(samples["sample_id"]),
            label_names,
            max(int(study.gold_pool), gold_per_bundle),
            int(study.gold_max_words),
        )
    orders = [
        interleave(samples, seeded_rng(int(study.seed), "order", a))
        for a in range(int(study.repeats))
    ]
    bundles = assign_bundles(
        tasks,
        orders,
        methods,
        ks,
        bundle_size,
        int(study.repeats),
        int(study.seed),
        gold_ids=gold["task_id"].tolist() if len(gold) else [],
        gold_per_bundle=gold_per_bundle,
    )
    all_tasks = pd.concat([tasks, gold], ignore_index=True) if len(gold) else tasks
    violations = check_design(
        all_tasks,
        bundles,
        int(study.repeats),
        bundle_size,
        int(study.balance_tolerance),
        nested=float(study.noise) == 0.0,
    )
    try:
        assert_design(violations)
    except DesignError as err:
        only_balance = {v.constraint for v in violations} <= {"method_balance", "k_balance"}
        if only_balance and n % bundle_size:
            raise DesignError(
                f"{err}\nB={bundle_size} does not divide N={n}, so bundles straddle two passes "
                "over the samples and their method/k mix can be off by one; choose B dividing N "
                "or allow it with study.balance_tolerance=1"
            ) from err
        raise
    info = {
        "n_samples": n,
        "n_methods": len(methods),
        "n_k": len(ks),
        "n_tasks": len(tasks),
        "n_gold_tasks": len(gold),
        "n_bundles": int(bundles["bundle_id"].nunique()),
        "bundle_size": bundle_size,
        "gold_per_bundle": gold_per_bundle,
        "repeats": int(study.repeats),
        "n_all_shown": int(tasks["all_shown"].sum()),
    }
    log.info("study design: %s", info)
    return StudyDesign(samples, all_tasks, bundles, methods, ks, info)
