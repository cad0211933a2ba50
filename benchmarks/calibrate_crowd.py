"""Calibrate the simulated crowd's worker model against the original study's real crowd.

    python -m benchmarks.calibrate_crowd [--reader bow|embedding] [--out calibration.csv]
        [--data-root DIR]

For each dataset (IMDB, AG News) the reader learns from the shared dataset's texts with
the study's samples removed (at most the reader's ``max_train`` of them, drawn as
``saleval-simulate`` draws them), then reads every published task once per reader
setting (the reader grid: ``READER_GRIDS``, narrowed by ``--dots``, ``--dot-weights``,
``--bow-weights``, ``--views``).
A vectorised twin of the worker model (:mod:`saleval.crowd.simulation.workers`: per
answer a lapse drawn from Beta, an "I don't know" threshold with jitter, a label drawn from
the tempered probabilities; a spammer's answer dropped, as the import's speed filter drops them; the
strict majority) gives the expected accuracy per (method, k) over ``--replicates``
simulated crowds. Objective (docs/simulated-crowd.md): the mean absolute error per
(method, k) cell, in points, plus the largest gap of the accuracy-vs-k curve (mean over
methods). Each setting is fitted on one dataset and reported on the other.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from saleval.analysis import scoring
from saleval.crowd.importing.published_study import exclude_texts, read_study
from saleval.crowd.simulation.readers import BowReader, EmbeddingReader, shared_encoder
from saleval.crowd.simulation.workers import normalised_confidence, tempered
from saleval.modeling.data import load_dataset

KEY = ["sample_id", "method", "k"]
DATASETS = {
    "imdb": ("IMDB.csv", ["negative", "positive"]),
    "ag_news": ("AGNEWS.csv", ["World", "Sports", "Business", "Sci/Tech"]),
}


@dataclass
class Published:
    """One published study: its tasks in the order of ``real`` (A per task), the reader's
    training texts (study samples removed) and the label names. Both calibration
    benchmarks read the published studies through :func:`load`."""

    name: str
    tasks: pd.DataFrame
    real: pd.DataFrame
    train: pd.DataFrame
    labels: list[str]
    excluded: int = 0  # study texts removed from the reader's training texts


def load(name: str, root: Path) -> Published:
    file, labels = DATASETS[name]
    study = read_study(root / "published/lu2024" / file, labels, name)
    ds_cfg = {
        "name": name,
        "label_names": labels,
        "data_root": str(root),
        "_target_": f"saleval.modeling.data.read_{name}",
        "files": {"all": "imdb/imdb_small_3000.csv"}
        if name == "imdb"
        else {"test": "ag_news/test.csv"},
    }
    data = load_dataset(ds_cfg)
    pool = pd.concat([data[s] for s in ("train", "validation", "test")], ignore_index=True)
    train, excluded = exclude_texts(pool, study.samples["text"])
    real = study.aggregated.sort_values(KEY).reset_index(drop=True)
    tasks = study.tasks.set_index(KEY).loc[pd.MultiIndex.from_frame(real[KEY])].reset_index()
    return Published(name, tasks, real, train, labels, excluded)


# The reader settings tried per dataset (fields of the reader class); the worker grid is
# the same for every reader.
READER_GRIDS: dict[str, dict[str, list[Any]]] = {
    "bow": {"C": [10.0], "dot_weight": [0.0, 0.5, 1.0, 2.0, 3.0, 5.0]},
    "embedding": {
        "dots": ["collapse", "keep"],
        "dot_weight": [0.0, 0.5, 1.0, 2.0, 3.0],
        "bow_weight": [0.0, 0.5],
        "dotted_views": [1],
    },
}
WORKER_GRID: dict[str, list[float]] = {
    "lapse_mean": [0.05, 0.1, 0.2, 0.3],
    "idk": [0.0, 0.1, 0.2, 0.3, 0.45, 0.6],
    "temperature": [0.5, 1.0, 2.0],
}


def read_all(
    kind: str,
    grid: dict[str, list[Any]],
    texts: list[str],
    labels: list[int],
    label_names: list[str],
    tasks: list[str],
    seed: int,
    holdout: float,
) -> Iterator[tuple[dict[str, Any], np.ndarray, int]]:
    """Per reader setting: its fields, its probabilities for ``tasks`` and how many texts
    the encoder ran on for it (0 for BoW). BoW fits once per C: ``dot_weight`` only acts
    when reading a view."""
    fitted: dict[float, BowReader] = {}
    for values in itertools.product(*grid.values()):
        params = dict(zip(grid, values))
        if kind == "bow":
            c_reg = float(params["C"])
            if c_reg not in fitted:
                fitted[c_reg] = BowReader(C=c_reg, calibration_holdout=holdout).fit(
                    texts, labels, label_names, seed
                )
            bow = fitted[c_reg]
            bow.dot_weight = float(params["dot_weight"])
            yield params, bow.predict_proba(tasks), 0
        else:
            emb = EmbeddingReader(calibration_holdout=holdout, **params)
            emb.fit(texts, labels, label_names, seed)
            probs = emb.predict_proba(tasks)
            yield params, probs, emb.n_encoded


def fast_crowd(
    probs: np.ndarray,
    lapse_mean: float,
    idk: float,
    temperature: float,
    rng: np.random.Generator,
    replicates: int = 8,
    workers: int = 5,
    spam: float = 0.1,
    jitter: float = 0.05,
    lapse_a: float = 2.0,
) -> np.ndarray:
    """Per task, the share of ``replicates`` simulated crowds whose strict majority is the
    true label (label 0 after reindexing: ``probs[:, 0]`` is the true class)."""
    t, c = probs.shape
    conf = normalised_confidence(probs)
    cum = np.cumsum(tempered(probs, temperature), axis=1)
    shape = (replicates, t, workers)
    b = lapse_a / max(lapse_mean, 1e-6) - lapse_a
    lapse = rng.beta(lapse_a, b, size=shape)
    thr = idk + jitter * rng.standard_normal(shape)
    u = rng.random(shape)
    drawn = (u[..., None] > cum[None, :, None, :]).sum(axis=-1)
    drawn = np.minimum(drawn, c - 1) + 1
    code = np.where(conf[None, :, None] < thr, 0, drawn)
    lapsed = rng.random(shape) < lapse
    code = np.where(lapsed, rng.integers(1, c + 1, size=shape), code)
    present = rng.random(shape) >= spam
    counts = np.stack([((code == a) & present).sum(axis=-1) for a in range(c + 1)], axis=-1)
    right = counts[..., 1]
    others = np.delete(counts, 1, axis=-1).max(axis=-1)
    return (right > others).mean(axis=0)


def true_first(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Columns reordered so that column 0 is each task's true class."""
    c = probs.shape[1]
    order = (labels[:, None] + np.arange(c)[None, :]) % c
    return np.take_along_axis(probs, order, axis=1)


def evaluate(real: pd.DataFrame, expected: np.ndarray) -> dict[str, float]:
    """Cell MAE, curve gap and Spearman of s_j: real A vs expected simulated accuracy."""
    df = real.assign(sim=expected)
    cells = df.groupby(["method", "k"]).agg(real=("correct", "mean"), sim=("sim", "mean"))
    cells *= 100
    mae = float((cells["real"] - cells["sim"]).abs().mean())
    curve = cells.groupby("k").mean()
    gap = float((curve["real"] - curve["sim"]).abs().max())
    pr = cells["real"].unstack("k").to_numpy() / 100
    ps = cells["sim"].unstack("k").to_numpy() / 100
    rho = float(stats.spearmanr(scoring.method_scores(pr), scoring.method_scores(ps)).statistic)
    bias = float((cells["sim"] - cells["real"]).mean())
    return {"mae": mae, "gap": gap, "rho": rho, "bias": bias, "objective": mae + gap}


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="calibration.csv")
    ap.add_argument("--data-root", default=os.environ.get("SALEVAL_DATA_ROOT", "../shared/data"))
    ap.add_argument("--reader", choices=sorted(READER_GRIDS), default="bow")
    ap.add_argument("--max-train", type=int, default=None, help="default: the reader's own")
    ap.add_argument("--dots", default=None, help="embedding: comma-separated renderings")
    ap.add_argument("--dot-weights", default=None, help="comma-separated dot_weight values")
    ap.add_argument("--bow-weights", default=None, help="embedding: comma-separated bow_weight")
    ap.add_argument("--views", default=None, help="embedding: comma-separated dotted_views")
    ap.add_argument("--replicates", type=int, default=8)
    ap.add_argument("--seed", type=int, default=42, help="the reader's seed (simulation.seed)")
    ap.add_argument("--holdout", type=float, default=0.2, help="calibration_holdout")
    ap.add_argument(
        "--embedding-cache", default=None, help="embedding: .npz of encoded texts, read and updated"
    )
    args = ap.parse_args()
    root = Path(args.data_root)
    grid = dict(READER_GRIDS[args.reader])
    default = EmbeddingReader()
    encoder = shared_encoder(default.package, default.max_length)
    if args.embedding_cache and Path(args.embedding_cache).is_file():
        print(f"{encoder.load(args.embedding_cache)} encoded texts read", flush=True)
    for key, val in (
        ("dots", None if args.dots is None else args.dots.split(",")),
        ("dot_weight", _floats(args.dot_weights)),
        ("bow_weight", _floats(args.bow_weights)),
        ("dotted_views", None if args.views is None else [int(v) for v in args.views.split(",")]),
    ):
        if val is not None and key in grid:
            grid[key] = val
    max_train = args.max_train
    if max_train is None:
        max_train = (BowReader if args.reader == "bow" else EmbeddingReader)().max_train
    rows = []
    for name, (_, labels) in DATASETS.items():
        published = load(name, root)
        train = published.train
        n_excl = published.excluded
        if max_train and len(train) > max_train:  # as simulation.workers.read_tasks draws
            train = train.sample(n=max_train, random_state=args.seed)
        print(f"{name}: {len(train)} training texts, {n_excl} study texts excluded", flush=True)
        real, tasks = published.real, published.tasks
        y = tasks["label"].to_numpy()
        for params, raw, n_enc in read_all(
            args.reader,
            grid,
            train["text"].tolist(),
            train["label"].tolist(),
            labels,
            tasks["display_text"].tolist(),
            args.seed,
            args.holdout,
        ):
            probs = true_first(raw, y)
            for lm, idk, temp in itertools.product(*WORKER_GRID.values()):
                rng = np.random.default_rng(0)
                exp = fast_crowd(probs, lm, idk, temp, rng, replicates=args.replicates)
                rows.append(
                    {
                        "dataset": name,
                        **params,
                        "lapse_mean": lm,
                        "idk": idk,
                        "temperature": temp,
                        **evaluate(real, exp),
                    }
                )
            print(f"  {params}: {n_enc} texts encoded", flush=True)
        if args.embedding_cache and args.reader == "embedding":
            encoder.save(args.embedding_cache)
    out = pd.DataFrame(rows)
    out.to_csv(args.out, index=False)
    params = [*grid, *WORKER_GRID]
    wide = out.pivot_table(
        index=params, columns="dataset", values=["objective", "mae", "gap", "rho"]
    )
    for fit_on, report_on in (("imdb", "ag_news"), ("ag_news", "imdb")):
        best = wide[("objective", fit_on)].idxmin()
        r = wide.loc[best]
        print(f"fit on {fit_on} -> {dict(zip(params, best))}")
        for d in (fit_on, report_on):
            print(
                f"   {d}: mae {r[('mae', d)]:.2f} gap {r[('gap', d)]:.2f} rho {r[('rho', d)]:.3f}"
            )
    both = (wide[("objective", "imdb")] + wide[("objective", "ag_news")]).idxmin()
    print("best on both:", dict(zip(params, both)), wide.loc[both].round(3).to_dict())


if __name__ == "__main__":
    main()
