"""A simulated crowd (docs/study-design.md): answers for every bundle so that every later stage runs
and is tested without people. Everything it produces is SIMULATED and says so.

A simulated worker reads only a task's ``display_text``. Its "understanding" is a
reading model (``simulation.reader``; by default
:class:`saleval.crowd.simulation.lexicon.AutoReader`: for sentiment labels the word
weights of people's own phrase judgments summed over the clearly polar words shown,
elsewhere TF-IDF + logistic regression trained on a split of the dataset disjoint from
the explained samples), so it never saw the explained classifier nor the study texts.
Per task a worker

1. lapses with its own noise rate (drawn per worker from a configured
   distribution) and then picks a label uniformly at random;
2. otherwise answers "I don't know" when the classifier's normalised confidence
   ``(p_max - 1/C) / (1 - 1/C)`` is below its threshold (the configured threshold
   plus per-worker jitter);
3. otherwise answers the classifier's label (``argmax``) or a label drawn from its
   probabilities (``sample``, a worker who is unsure disagrees with others).

A configured fraction of workers are spammers who answer fast and ignore the text:
uniformly random labels, "I don't know" throughout, or one constant label. The
quality filters of docs/aggregation.md (bundle under 2 minutes, all "I don't know", gold
accuracy) have them to find; ``workers.csv`` says who they are.

How close this comes to real people, and how the defaults were chosen:
``docs/simulated-crowd.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from saleval.config.crowd import (
    SPAMMER_KINDS,
    Decision,
    NoiseConfig,
    NoiseDistribution,
    SimulationConfig,
    SimulationError,
)
from saleval.crowd.seeding import seeded_rng
from saleval.crowd.simulation.lexicon import reader_name
from saleval.crowd.simulation.readers import build_reader
from saleval.progress import bar
from saleval.vocab import IDK

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------
# The reading model (saleval.crowd.simulation.readers)
# ---------------------------------------------------------------------------------


@dataclass
class Reading:
    """What the reading model made of a task set: class probabilities per task row, which
    reader read (by name), and how many texts it learnt from."""

    probs: np.ndarray
    reader: str
    train_size: int


def read_tasks(
    tasks: pd.DataFrame, train: pd.DataFrame, label_names: Sequence[str], cfg: SimulationConfig
) -> Reading:
    """The reading model (``simulation.reader``) learns from ``train`` and returns its class
    probabilities for every task's ``display_text``, with what it was trained on."""
    reader = build_reader(cfg.reader)
    if reader.max_train and len(train) > int(reader.max_train):
        train = train.sample(n=int(reader.max_train), random_state=int(cfg.seed))
    reader.fit(
        train["text"].astype(str).tolist(),
        train["label"].astype(int).tolist(),
        list(label_names),
        int(cfg.seed),
    )
    probs = reader.predict_proba(tasks["display_text"].astype(str).tolist())
    return Reading(probs, reader_used(reader), len(train))


def reader_used(reader: Any) -> str:
    """The reader that read, by name: the one ``simulation/reader=auto`` chose for the
    dataset's labels, else the configured one."""
    return str(getattr(reader, "chosen", None) or reader_name(reader))


def normalised_confidence(probs: np.ndarray) -> np.ndarray:
    """(p_max − 1/C)/(1 − 1/C): 0 at a uniform posterior, 1 when certain, for any C."""
    c = probs.shape[1]
    return (probs.max(axis=1) - 1.0 / c) / (1.0 - 1.0 / c)


def tempered(probs: np.ndarray, temperature: float) -> np.ndarray:
    """Each row ∝ p^(1/T), renormalised: T < 1 sharpens, T > 1 flattens the reader's
    probabilities before a worker draws a label from them."""
    out = np.power(np.clip(probs, 1e-12, 1.0), 1.0 / temperature)
    return out / out.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------


def _draw_noise(spec: NoiseConfig, rng: np.random.Generator) -> float:
    if spec.distribution == NoiseDistribution.beta:
        return float(rng.beta(float(spec.a), float(spec.b)))
    if spec.distribution == NoiseDistribution.uniform:
        return float(rng.uniform(float(spec.low), float(spec.high)))  # type: ignore[arg-type]
    return float(spec.value)  # type: ignore[arg-type]  # fixed (NoiseConfig checks the fields)


def draw_workers(bundle_ids: Sequence[str], n_labels: int, cfg: SimulationConfig) -> pd.DataFrame:
    """One simulated worker per bundle, with kind, noise rate, IDK threshold and speed."""
    n = len(bundle_ids)
    width = max(4, len(str(n)))
    ids = [f"sim-{i + 1:0{width}d}" for i in range(n)]
    rng = seeded_rng(cfg.seed, "spammers")
    n_spam = round(float(cfg.spammers.fraction) * n)
    spam = set(rng.choice(n, size=n_spam, replace=False).tolist()) if n_spam else set()
    kinds = {k: float(getattr(cfg.spammers.kinds, k)) for k in SPAMMER_KINDS}
    names = [k for k in SPAMMER_KINDS if kinds[k] > 0]
    weights = np.array([float(kinds[k]) for k in names]) if names else np.array([])
    rows = []
    for i, (wid, bid) in enumerate(zip(ids, bundle_ids)):
        r = seeded_rng(cfg.seed, "worker", wid)
        noise = min(max(_draw_noise(cfg.noise, r), 0.0), 1.0)
        threshold = float(cfg.idk_threshold) + float(cfg.idk_jitter) * float(r.standard_normal())
        speed = float(np.exp(float(cfg.timing.speed_sigma) * r.standard_normal()))
        kind, constant = "honest", -1
        if i in spam:
            kind = str(names[int(r.choice(len(names), p=weights / weights.sum()))])
            constant = int(r.integers(n_labels)) if kind == "constant" else -1
        rows.append(
            {
                "worker_id": wid,
                "bundle_id": bid,
                "kind": kind,
                "noise_rate": noise if kind == "honest" else 1.0,
                "idk_threshold": min(max(threshold, 0.0), 1.0),
                "speed": speed,
                "constant_label": constant,
                "simulated": True,
            }
        )
    return pd.DataFrame(rows)


def expected_seconds(timing: Any, words_shown: float) -> float:
    """Mean seconds an honest simulated worker spends on a task showing ``words_shown``
    words: E[speed] · (base_s + per_word_s · words) · E[lognormal(0, sigma)], the timing
    rule of :func:`simulate_answers` in expectation (both factors are lognormal, mean
    exp(σ²/2)). The study planner's default seconds per task (docs/planning.md#cost)."""
    spread = np.exp(float(timing.speed_sigma) ** 2 / 2) * np.exp(float(timing.sigma) ** 2 / 2)
    return float(spread * (float(timing.base_s) + float(timing.per_word_s) * words_shown))


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds")


def simulate_answers(
    tasks: pd.DataFrame,
    bundles: pd.DataFrame,
    probs: np.ndarray,
    workers: pd.DataFrame,
    label_names: Sequence[str],
    cfg: SimulationConfig,
) -> pd.DataFrame:
    """Every worker answers its bundle in position order (``tables.ANSWERS`` columns).

    ``probs`` holds the reading model's class probabilities per row of ``tasks``.
    """
    n_labels = len(label_names)
    row_of = {t: i for i, t in enumerate(tasks["task_id"])}
    conf = normalised_confidence(probs)
    if cfg.decision == Decision.sample:
        draw_p = tempered(probs, float(cfg.temperature))
    n_shown = tasks["n_words_shown"].to_numpy(dtype=np.float64)
    timing, spam = cfg.timing, cfg.spammers
    start0 = datetime.fromisoformat(str(timing.start))
    if start0.tzinfo is None:
        start0 = start0.replace(tzinfo=UTC)
    by_bundle = {b: g.sort_values("position") for b, g in bundles.groupby("bundle_id", sort=True)}
    out: list[dict[str, Any]] = []
    for w in bar(
        workers.itertuples(index=False),
        total=len(workers),
        desc="simulated workers",
        leave=False,
        disable=None,  # a bar on a terminal; none in a file (a SLURM job's .err)
    ):
        g = by_bundle.get(w.bundle_id)
        if g is None:
            raise SimulationError(f"worker {w.worker_id}: bundle {w.bundle_id!r} not in bundles")
        r = seeded_rng(cfg.seed, "answers", w.worker_id)
        # times on a millisecond grid, so ISO stamps and duration_s agree exactly
        offset_ms = round(float(r.uniform(0.0, float(timing.spread_hours))) * 3_600_000)
        cursor = start0.replace(microsecond=0) + timedelta(milliseconds=offset_ms)
        for pos, tid in zip(g["position"], g["task_id"]):
            i = row_of[tid]
            if w.kind == "honest":
                if r.random() < w.noise_rate:
                    answer = label_names[int(r.integers(n_labels))]
                elif conf[i] < w.idk_threshold:
                    answer = IDK
                elif cfg.decision == Decision.sample:
                    answer = label_names[int(r.choice(n_labels, p=draw_p[i]))]
                else:
                    answer = label_names[int(np.argmax(probs[i]))]
                seconds = w.speed * (float(timing.base_s) + float(timing.per_word_s) * n_shown[i])
                seconds *= float(np.exp(float(timing.sigma) * r.standard_normal()))
            else:
                if w.kind == "random":
                    answer = label_names[int(r.integers(n_labels))]
                elif w.kind == "idk":
                    answer = IDK
                else:
                    answer = label_names[int(w.constant_label)]
                seconds = float(spam.seconds_median) * float(
                    np.exp(float(spam.seconds_sigma) * r.standard_normal())
                )
            seconds = max(round(seconds, 3), 0.001)
            started = cursor
            submitted = started + timedelta(seconds=seconds)
            cursor = submitted + timedelta(milliseconds=round(float(timing.gap_s) * 1000))
            out.append(
                {
                    "worker_id": w.worker_id,
                    "task_id": tid,
                    "answer": answer,
                    "bundle_id": w.bundle_id,
                    "position": int(pos),
                    "started_at": _iso(started),
                    "submitted_at": _iso(submitted),
                    "duration_s": seconds,
                    "simulated": True,
                }
            )
    return pd.DataFrame(out)


@dataclass
class SimulatedCrowd:
    """The answers (``tables.ANSWERS``), who the workers were, and a summary."""

    answers: pd.DataFrame
    workers: pd.DataFrame
    summary: dict[str, float]
    by_k: pd.DataFrame
    reader: str = ""  # which reader read, by name (simulation/reader=auto chooses per dataset)


def simulate_crowd(
    tasks: pd.DataFrame,
    bundles: pd.DataFrame,
    train: pd.DataFrame,
    label_names: Sequence[str],
    cfg: SimulationConfig,
    read: Reading | None = None,
) -> SimulatedCrowd:
    """Train the reading model on ``train`` and let one worker answer each bundle.

    ``read``: the reading model's output for ``tasks`` (:func:`read_tasks`) when it was
    already computed, so several crowds (seeds) can answer what one reader read.
    """
    overlap = sorted(set(tasks["sample_id"]) & set(train["sample_id"]))
    if overlap:
        split = cfg.reader.get("split", "train")
        raise SimulationError(
            f"{len(overlap)} task samples (e.g. {overlap[:3]}) are in the simulated workers' "
            f"training split {split!r}; the reading model must not have seen study texts "
            "(explain test samples, or set simulation.reader.split to a disjoint split)"
        )
    bad = ~tasks["label"].between(0, len(label_names) - 1)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise SimulationError(
            f"tasks: row {row + 1}, field label: {tasks['label'].iloc[row]!r} is not an index of "
            f"dataset.label_names {list(label_names)}"
        )
    reading = read if read is not None else read_tasks(tasks, train, label_names, cfg)
    probs = reading.probs
    bundle_ids = sorted(bundles["bundle_id"].unique())
    workers = draw_workers(bundle_ids, len(label_names), cfg)
    answers = simulate_answers(tasks, bundles, probs, workers, label_names, cfg)
    summary, by_k = summarise(answers, tasks, workers, label_names)
    summary["reader_train_size"] = float(reading.train_size)
    log.info("SIMULATED crowd (%s): %s", reading.reader, summary)
    return SimulatedCrowd(answers, workers, summary, by_k, reading.reader)


def summarise(
    answers: pd.DataFrame, tasks: pd.DataFrame, workers: pd.DataFrame, label_names: Sequence[str]
) -> tuple[dict[str, float], pd.DataFrame]:
    """Answer-level accuracy and "I don't know" rate of the simulated crowd, overall and
    per k (study tasks only), for the run's metrics; the study's scores come from
    the import and score stages."""
    a = answers.merge(
        tasks[["task_id", "k", "label", "is_gold", "method"]],
        on="task_id",
        how="left",
        validate="many_to_one",
    ).merge(workers[["worker_id", "kind"]], on="worker_id", how="left")
    a["correct"] = a["answer"] == a["label"].map(lambda c: label_names[int(c)])
    a["idk"] = a["answer"] == IDK
    study = a[~a["is_gold"].astype(bool)]
    honest = study[study["kind"] == "honest"]
    by_k = (
        study.groupby("k")
        .agg(accuracy=("correct", "mean"), idk_rate=("idk", "mean"), n=("correct", "size"))
        .reset_index()
    )
    summary = {
        "sim_accuracy": float(study["correct"].mean()),
        "sim_accuracy_honest": float(honest["correct"].mean()) if len(honest) else float("nan"),
        "sim_idk_rate": float(study["idk"].mean()),
        "sim_n_answers": float(len(a)),
        "sim_n_workers": float(workers["worker_id"].nunique()),
        "sim_n_spammers": float((workers["kind"] != "honest").sum()),
    }
    gold = a[a["is_gold"].astype(bool)]
    if len(gold):
        summary["sim_gold_accuracy"] = float(gold["correct"].mean())
    for rec in by_k.itertuples(index=False):
        summary[f"sim_accuracy_k{int(rec.k)}"] = float(rec.accuracy)
        summary[f"sim_idk_rate_k{int(rec.k)}"] = float(rec.idk_rate)
    return summary, by_k
