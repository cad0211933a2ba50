"""Crowd tables made by hand for the crowd tests: synthetic explain runs (predictions and
word attributions shaped like ``saleval-explain``'s) and a hand-made task run with the
answers a hand-made crowd gives it (``saleval-tasks``' and an answer file's shape).

Kept here, not in a test module, so every test that needs them imports them from one
support module (``tests/test_import_graph.py``: no test module imports another).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from saleval.attribution import published_names
from saleval.pipeline import tables
from saleval.testing.runs import default_methods
from saleval.vocab import PROBS
from tests.conftest import compose_config

AG_LABELS = ["World", "Sports", "Business", "Sci/Tech"]
# the published study's methods, in the explain stage's order (the baseline first)
METHODS = [m for m in default_methods() if m in published_names().values()]


# --- synthetic explain runs ---------------------------------------------------------


def synthetic_explain(
    n_samples: int = 140,
    n_words: int | Sequence[int] = 60,
    methods: Sequence[str] = METHODS,
    labels: Sequence[str] = AG_LABELS,
    wrong_every: int = 7,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions + word attributions shaped like an explain run's tables.

    Sample i has class i mod C; every ``wrong_every``-th sample is misclassified.
    """
    rng = np.random.default_rng(seed)
    c = len(labels)
    preds, attrs = [], []
    for i in range(n_samples):
        sid = f"syn-{i:03d}"
        label = i % c
        pred = (label + 1) % c if i % wrong_every == 0 else label
        nw = n_words if isinstance(n_words, int) else n_words[i % len(n_words)]
        words = [f"w{i}x{j}" for j in range(nw)]
        prob = np.full(c, 0.2 / (c - 1))
        prob[pred] = 0.8
        preds.append(
            {
                "sample_id": sid,
                "text": " ".join(words) + ".",
                "label": label,
                "pred": pred,
                **dict(zip(PROBS.columns(labels), map(float, prob))),
            }
        )
        start = 0
        spans = []
        for w in words:
            spans.append((start, start + len(w)))
            start += len(w) + 1
        for m in methods:
            scores = rng.normal(size=nw)
            for j, (w, (s, e)) in enumerate(zip(words, spans)):
                attrs.append((sid, m, j, w, s, e, float(scores[j])))
    return pd.DataFrame(preds), pd.DataFrame(
        attrs,
        columns=["sample_id", "method", "word_index", "word", "char_start", "char_end", "score"],
    )


def write_explain_run(
    run_dir: Path, preds: pd.DataFrame, attrs: pd.DataFrame, dataset: str = "ag_news"
) -> Path:
    """An explain run dir as the explain stage leaves it (tables, run.json, config.yaml)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tables.PREDICTIONS.write(preds, run_dir)
    tables.ATTRIBUTIONS.write(attrs, run_dir)
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "stage": "explain",
                "run_id": "",
                "fingerprint": "synthetic",
                "simulated": "false",
                "status": "FINISHED",
            }
        )
    )
    labels = PROBS.names(preds.columns)
    # the dataset's whole config node, as a real explain run records it (later stages adopt it)
    composed = OmegaConf.to_container(compose_config("train", [f"dataset={dataset}"]), resolve=True)
    node = composed["dataset"]  # type: ignore[index]
    assert list(node["label_names"]) == labels, (node["label_names"], labels)
    OmegaConf.save(OmegaConf.create({"dataset": node}), run_dir / "config.yaml")
    return run_dir


# --- a hand-made task run and its crowd -----------------------------------------------


LABELS = ["negative", "positive"]
SAMPLES = {"s0": 0, "s1": 1, "s2": 0, "s3": 1}
COMBOS = [("vanilla_gradient", 2), ("vanilla_gradient", 5), ("random", 2), ("random", 5)]
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def hand_made_task_id(sample: str, method: str, k: int) -> str:
    return f"{sample}-{method}-k{k}"


def hand_made_task_run(root: Path, target: str = "gold") -> Path:
    """A hand-made saleval-tasks run: 4 samples × 2 methods × k ∈ {2, 5} + 1 gold item,
    12 bundles (3 replicates × 4 method/k rotations), each with one task per sample."""
    run = root / "tasks_run"
    run.mkdir(parents=True)
    tasks = [
        {
            "task_id": hand_made_task_id(s, m, k),
            "sample_id": s,
            "method": m,
            "k": k,
            "label": y,
            "display_text": "word . other ",
            "n_words_shown": 2,
            "is_gold": False,
            "target": target,
        }
        for s, y in SAMPLES.items()
        for m, k in COMBOS
    ]
    tasks.append(
        {
            "task_id": "gold-1",
            "sample_id": "g1",
            "method": "gold",
            "k": 0,
            "label": 1,
            "display_text": "a wonderful film ",
            "n_words_shown": 3,
            "is_gold": True,
            "target": target,
        }
    )
    bundles = []
    for r in range(3):
        for c in range(4):
            b = f"b{r}{c}"
            for pos, s in enumerate(SAMPLES):
                m, k = COMBOS[(c + pos) % 4]
                bundles.append(
                    {
                        "bundle_id": b,
                        "position": pos,
                        "task_id": hand_made_task_id(s, m, k),
                        "is_gold": False,
                    }
                )
            bundles.append({"bundle_id": b, "position": 4, "task_id": "gold-1", "is_gold": True})
    tables.TASKS.write(pd.DataFrame(tasks), run)
    tables.BUNDLES.write(pd.DataFrame(bundles), run)
    (run / "config.yaml").write_text(
        "dataset:\n  name: imdb\n  label_names: [negative, positive]\n"
        f"study:\n  target: {target}\n  population: correct\n"
    )
    (run / "run.json").write_text(
        json.dumps({"run_id": "hand-made-tasks", "fingerprint": "t", "status": "FINISHED"})
    )
    return run


def intended(bundle: str, pos: int, worker: int) -> str:
    """What the hand-made crowd answers: vanilla_gradient is recognised, random is not,
    except that one of three replicates answers 'I don't know' on random k=5."""
    s = list(SAMPLES)[pos]
    m, k = COMBOS[(int(bundle[2]) + pos) % 4]
    y = SAMPLES[s]
    if m == "vanilla_gradient":
        return [LABELS[y].upper(), str(y), f" {LABELS[y]} "][worker % 3]
    if k == 5 and worker % 3 == 0:
        return "I don't know"
    return LABELS[1 - y]


def hand_made_answers(bundles: pd.DataFrame, spam: bool = True) -> pd.DataFrame:
    rows = []
    for w, (b, g) in enumerate(bundles.groupby("bundle_id", sort=True)):
        t = T0 + timedelta(hours=w)
        for pos, task in zip(g["position"], g["task_id"]):
            ans = "positive" if task == "gold-1" else intended(b, pos, int(b[1]))
            rows.append(
                {
                    "worker_id": f"w{w:02d}",
                    "task_id": task,
                    "answer": ans,
                    "started_at": t.isoformat(),
                    "submitted_at": (t + timedelta(seconds=40)).isoformat(),
                }
            )
            t += timedelta(seconds=41)
    if spam:  # takes bundle b00 again in 5 seconds, answers "I don't know" everywhere
        for task in bundles.loc[bundles["bundle_id"] == "b00", "task_id"]:
            rows.append(
                {
                    "worker_id": "spammer",
                    "task_id": task,
                    "answer": "idk",
                    "started_at": T0.isoformat(),
                    "submitted_at": (T0 + timedelta(seconds=1)).isoformat(),
                }
            )
    return pd.DataFrame(rows)
