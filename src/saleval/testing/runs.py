"""Run dirs for tests and benchmarks, written by the pipeline's own writers.

A test of the annotation app needs a ``saleval-tasks`` run dir. :func:`make_task_run`
makes one by running :func:`saleval.stages.tasks.run` (the function behind the
``saleval-tasks`` console script) on a small synthetic explain run
(:func:`make_explain_run`, written through :class:`saleval.pipeline.stage.Stage` and the
``tables.PREDICTIONS`` / ``tables.ATTRIBUTIONS`` writers). The files a test reads are
therefore the files the stage writes: the same columns, ids (``s000|random|k5``,
``b001``), 1-based positions, instructions, ``config.yaml`` and ``run.json``. A
hand-written copy of the format would be a second writer that drifts from the first
unnoticed; going through the stage makes every change to the writers reach the tests.

Both stages start an MLflow run: point ``MLFLOW_TRACKING_URI`` at a scratch store
first (the tests' ``mlflow_uri`` fixture does); without it the runs go to a SQLite
store beside the run dir, never to the project's ``outputs/``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, open_dict

from saleval.pipeline import tables
from saleval.pipeline.stage import Stage
from saleval.stages import tasks as tasks_stage
from saleval.stages.run import compose_stage
from saleval.vocab import PROBS
from saleval.words import word_spans

#: The most methods a synthetic study holds (:func:`study_grid`).
MAX_METHODS = 5
#: The k values a synthetic study draws from (``conf/kgrid/paper.yaml``).
KS = (5, 10, 20, 30, 40)
#: Markup inside a text (two words: ``<a`` and ``href="x">AT&T</a>``): pages must escape it.
TRICKY = '<a href="x">AT&T</a>'

_VOCABULARY = (
    "the",
    "market",
    "rallied",
    "after",
    "strong",
    "earnings",
    "from",
    "chip",
    "makers",
    "while",
    "the",
    "central",
    "bank",
    "held",
    "rates",
    "steady",
    "and",
    "the",
    "team",
    "won",
    "the",
    "final",
    "in",
    "extra",
    "time",
    "as",
    "rescue",
    "workers",
    "searched",
    "the",
    "coast",
    "after",
    "the",
    "storm",
)


def explain_frames(
    n_study: int,
    label_names: Sequence[str],
    methods: Sequence[str] | None = None,
    seed: int = 0,
    tricky_text: bool = True,
    n_gold: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions and attributions of synthetic texts, shaped as ``saleval-explain`` writes.

    ``n_study`` correctly classified samples ``s000, s001, ...`` (what a study with
    ``population: correct`` draws), then one misclassified sample per label
    (``x000, ...``) from which the instructions take their example texts, then ``n_gold``
    more correctly classified samples (``g000, ...``) for gold questions. Words and
    character spans come from :func:`saleval.words.word_spans`, so they are the words
    the explain stage would keep. Scores are uniform random per (sample, method, word).
    With ``tricky_text``, ``s000`` opens with :data:`TRICKY`, whose two words get the
    top score of every method: every task of ``s000`` shows markup. ``methods``: by
    default the first :data:`MAX_METHODS` of :func:`default_methods`.

    >>> preds, attrs = explain_frames(2, ["neg", "pos"], methods=["random"])
    >>> preds["sample_id"].tolist(), bool((preds["label"] == preds["pred"]).iloc[:2].all())
    (['s000', 's001', 'x000', 'x001'], True)
    >>> attrs[attrs["sample_id"] == "s000"]["word"].head(2).tolist()
    ['<a', 'href="x">AT&T</a>']
    """
    if methods is None:
        methods = default_methods()[:MAX_METHODS]
    rng = np.random.default_rng(seed)
    n_labels = len(label_names)
    samples = []
    for i in range(n_study):
        label = int(rng.integers(n_labels))
        samples.append((f"s{i:03d}", label, label))
    for i in range(n_labels):
        samples.append((f"x{i:03d}", i, (i + 1) % n_labels))
    for i in range(n_gold):
        label = i % n_labels
        samples.append((f"g{i:03d}", label, label))
    pred_rows: list[dict[str, Any]] = []
    attr_rows: list[dict[str, Any]] = []
    for sid, label, pred in samples:
        text = " ".join(rng.choice(_VOCABULARY, size=int(rng.integers(12, 30))))
        tricky = tricky_text and sid == "s000"
        if tricky:
            text = f"{TRICKY} {text}"
        probs = np.full(n_labels, 0.1 / max(n_labels - 1, 1))
        probs[pred] = 0.9
        pred_rows.append(
            {
                "sample_id": sid,
                "text": text,
                "label": label,
                "pred": pred,
                **dict(zip(PROBS.columns(label_names), map(float, probs))),
            }
        )
        spans = word_spans(text)
        for method in methods:
            scores = rng.uniform(size=len(spans))
            if tricky:
                scores[:2] = 2.0  # TRICKY's two words outrank every other word
            attr_rows.extend(
                {
                    "sample_id": sid,
                    "method": method,
                    "word_index": w,
                    "word": text[s:e],
                    "char_start": s,
                    "char_end": e,
                    "score": float(score),
                }
                for w, ((s, e), score) in enumerate(zip(spans, scores))
            )
    return pd.DataFrame(pred_rows), pd.DataFrame(attr_rows)


def _scratch_tracking(cfg: DictConfig, run_dir: Path) -> None:
    """Run dir as given; MLflow store and artifacts beside it unless the environment says."""
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
        cfg.tracking.artifact_root = str(run_dir.parent / "mlartifacts")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            cfg.tracking.uri = f"sqlite:///{run_dir.parent.resolve() / 'mlflow.db'}"


def make_explain_run(
    run_dir: str | Path,
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    dataset: str = "ag_news",
) -> Path:
    """An explain run dir holding the given frames, written as ``saleval-explain`` does.

    The frames go through ``tables.PREDICTIONS`` / ``tables.ATTRIBUTIONS`` (validated),
    and :class:`~saleval.pipeline.stage.Stage` writes ``config.yaml`` (the explain config of
    ``dataset`` and the frame's methods) and ``run.json``; the MLflow run is tagged
    ``synthetic=true``. No model is involved: ``inputs.model`` stays unset.
    """
    run_dir = Path(run_dir)
    methods = sorted(attributions["method"].unique())
    cfg = compose_stage("explain", [f"dataset={dataset}", f"method=[{','.join(methods)}]"])
    _scratch_tracking(cfg, run_dir)
    with Stage(cfg, "explain", tags={"synthetic": "true"}) as st:
        st.write(tables.PREDICTIONS, predictions)
        st.write(tables.ATTRIBUTIONS, attributions)
    return run_dir


def make_result_run(
    run_dir: str | Path,
    stage: str,
    frame: pd.DataFrame,
    dataset: str = "ag_news",
    model: str = "tiny",
) -> Path:
    """A ``saleval-score`` (``scores.csv``) or ``saleval-metrics`` (``metrics.csv``) run
    dir holding ``frame``, written through :class:`~saleval.pipeline.stage.Stage` and the table's
    writer, about ``dataset`` and ``model`` (its provenance), tagged ``synthetic=true``.
    What ``saleval-report`` gathers, without a model or a crowd."""
    spec = {"score": tables.SCORES, "metrics": tables.METRICS}[stage]
    run_dir = Path(run_dir)
    cfg = compose_stage(stage, [f"dataset={dataset}"])
    _scratch_tracking(cfg, run_dir)
    with Stage(cfg, stage, tags={"synthetic": "true"}) as st:
        st.provide(model=model)
        st.write(spec, frame)
    return run_dir


@functools.cache
def default_methods() -> tuple[str, ...]:
    """The explain stage's default methods (``conf/explain.yaml``), in its order: the
    baseline, ``random``, first. The synthetic runs take their method names from it, so
    each is a method a real run has.

    >>> default_methods()[0]
    'random'
    """
    return tuple(compose_stage("explain", []).method)


def study_grid(n_bundles: int) -> tuple[int, int, int]:
    """(methods M, ks K, repeats R) with M·K·R = ``n_bundles``, M and K as large as allowed.

    A study of N samples in bundles of B = N tasks has N·M·K·R / B = M·K·R bundles.

    >>> study_grid(4), study_grid(50), study_grid(1)
    ((4, 1, 1), (5, 5, 2), (1, 1, 1))
    """
    if n_bundles < 1:
        raise ValueError(f"n_bundles must be positive, got {n_bundles}")
    m = max(d for d in range(1, MAX_METHODS + 1) if n_bundles % d == 0)
    k = max(d for d in range(1, len(KS) + 1) if (n_bundles // m) % d == 0)
    return m, k, n_bundles // (m * k)


def make_task_run(
    run_dir: str | Path,
    n_bundles: int = 4,
    bundle_size: int = 5,
    dataset: str = "ag_news",
    seed: int = 0,
    tricky_text: bool = True,
    gold_rate: float = 0.0,
) -> Path:
    """A ``saleval-tasks`` run dir with ``n_bundles`` bundles of ``bundle_size`` tasks
    (and ``gold_rate`` × ``bundle_size`` gold questions on top of each: ``study.gold_rate``).

    Runs :func:`saleval.stages.tasks.run` on a synthetic explain run written to
    ``<run_dir>.explain`` (:func:`explain_frames`, :func:`make_explain_run`). The study
    has N = ``bundle_size`` samples, so every bundle holds each sample once: with
    ``tricky_text`` every bundle shows the markup of ``s000`` exactly once.
    ``study_grid(n_bundles)`` picks the methods, ks and repeats; ``dataset`` is a
    ``conf/dataset`` option and gives the labels.
    """
    run_dir = Path(run_dir)
    explain_dir = run_dir.with_name(run_dir.name + ".explain")
    n_methods, n_ks, repeats = study_grid(n_bundles)
    methods = default_methods()[:n_methods]
    cfg = compose_stage(
        "tasks",
        [
            f"inputs.explain={explain_dir.resolve()}",
            f"dataset={dataset}",
            f"study.n_samples={bundle_size}",
            "study.population=correct",
            "study.balance_by=none",
            f"study.methods=[{','.join(methods)}]",
            f"study.bundle_size={bundle_size}",
            f"study.repeats={repeats}",
            f"study.seed={seed}",
            f"study.gold_rate={gold_rate}",
            f"study.gold_pool={max(2, math.ceil(gold_rate * bundle_size))}",
            f"kgrid.ks=[{','.join(str(k) for k in KS[:n_ks])}]",
        ],
    )
    _scratch_tracking(cfg, run_dir)
    labels = [str(n) for n in cfg.dataset.label_names]
    n_gold = max(2, math.ceil(gold_rate * bundle_size)) if gold_rate else 0
    predictions, attributions = explain_frames(
        bundle_size, labels, methods, seed, tricky_text, n_gold
    )
    make_explain_run(explain_dir, predictions, attributions, dataset)
    tasks_stage.run(cfg)
    return run_dir
