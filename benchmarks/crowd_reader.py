"""The simulated crowd's readers against the published crowds, fitted and out of sample
(docs/simulated-crowd.md#calibration, issue #36).

    python -m benchmarks crowd_reader [--data-root DIR] [--out DIR] [--replicates 8]

1. **Why people get a task right** (IMDB): the published crowd's accuracy by the number
   of shown words that a word model of SST-2's human-labelled phrases calls clearly
   polar (|weight| > 1) and that agree with the label, beside the former default
   simulated crowd (corpus reader) and the new default, and those counts per method.
2. **The calibration grid**: every reader setting (the lexicon reader's
   ``polar_threshold`` on IMDB, the corpus reader's ``dot_weight`` on AG News, and the
   corpus reader on IMDB for comparison) × every worker setting (lapse, "I don't know",
   temperature), each read once and answered by the vectorised twin of the worker model
   (:func:`benchmarks.calibrate_crowd.fast_crowd`: expected accuracies of
   ``--replicates`` crowds).
3. **Fitted and out of sample**: one worker setting shared by both datasets with each
   dataset's reader setting (the defaults); leave one method out on each dataset (every
   setting refitted on the other seven methods of that dataset, the eighth measured); fit
   on one dataset, measure on the other (the other dataset's reader at its a-priori
   setting: lexicon threshold 1.0, the issue's "clearly polar"; corpus ``dot_weight`` 1.0,
   the former default).
4. **Residuals**: the out-of-sample method-score errors (simulated minus real s_j, in
   points), which the planner draws its discrepancy from (docs/planning.md#discrepancy),
   written as ``residuals.yaml`` in the form ``conf/simulation/default.yaml`` takes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.metrics import roc_auc_score

from benchmarks.calibrate_crowd import DATASETS, KEY, Published, fast_crowd, load, true_first
from saleval.analysis import scoring
from saleval.crowd.simulation.lexicon import TOKEN_PATTERN, LexiconReader
from saleval.crowd.simulation.readers import BowReader

ROOT = Path(__file__).resolve().parents[1]
WORKER_KEYS = ("lapse", "idk", "temperature")


@dataclass(frozen=True)
class Grid:
    """The settings tried: each reader's, and the worker model's (lapse mean, "I don't
    know" threshold, temperature)."""

    thresholds: tuple[float, ...] = (0.75, 1.0, 1.25, 1.5, 2.0, 2.5)  # lexicon, IMDB
    dot_weights: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)  # corpus reader
    lapse: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3)
    idk: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3)
    temperature: tuple[float, ...] = (0.35, 0.5, 0.7, 1.0, 1.5, 2.0)

    def workers(self) -> list[tuple[float, ...]]:
        return list(itertools.product(self.lapse, self.idk, self.temperature))


#: smoke size: the defaults and a neighbour or two, every table in well under a minute
QUICK = Grid((1.0, 1.5), (1.0, 2.0), (0.15, 0.2), (0.0, 0.2), (1.0,))
A_PRIORI = {"lexicon": 1.0, "corpus": 1.0}  # the other dataset's reader, cross-dataset
DEFAULT_READER = {"imdb": "lexicon", "ag_news": "corpus"}  # what simulation/reader=auto picks
FORMER = {"reader": ("corpus", 1.0), "lapse": 0.2, "idk": 0.2, "temperature": 1.0}


def readings(p: Published, root: Path, seed: int, g: Grid) -> dict[tuple[str, float], np.ndarray]:
    """Per reader setting (family, parameter), the probabilities of every task, true class
    first. The corpus reader is fitted once (``dot_weight`` acts only when reading)."""
    texts, y = p.tasks["display_text"].tolist(), p.tasks["label"].to_numpy()
    out: dict[tuple[str, float], np.ndarray] = {}
    bow = BowReader().fit(p.train["text"].tolist(), p.train["label"].tolist(), p.labels, seed)
    for dw in g.dot_weights:
        bow.dot_weight = dw
        out[("corpus", dw)] = true_first(bow.predict_proba(texts), y)
    lexicon = LexiconReader(phrases=str(root / "sst2/train.tsv"))
    if lexicon.covers(p.labels):
        for tau in g.thresholds:
            lexicon.polar_threshold = tau
            lexicon.fit([], [], p.labels, seed)
            out[("lexicon", tau)] = true_first(lexicon.predict_proba(texts), y)
    return out


def cells(p: Published, expected: np.ndarray) -> pd.DataFrame:
    """Real and expected simulated accuracy (points) per (method, k)."""
    c = (
        p.real.assign(s=expected)
        .groupby(["method", "k"])
        .agg(r=("correct", "mean"), s=("s", "mean"))
    )
    return 100 * c


def figures(c: pd.DataFrame) -> dict[str, float]:
    """Cell MAE, largest accuracy-vs-k gap, Spearman of s_j, over the methods in ``c``."""
    mae = float((c["r"] - c["s"]).abs().mean())
    curve = c.groupby("k").mean()
    gap = float((curve["r"] - curve["s"]).abs().max())
    pr, ps = (c[col].unstack("k").to_numpy() / 100 for col in ("r", "s"))
    sr, ss = scoring.method_scores(pr), scoring.method_scores(ps)
    rho = float(stats.spearmanr(sr, ss).statistic) if len(sr) > 2 else float("nan")
    return {"mae": mae, "gap": gap, "rho": rho, "objective": mae + gap}


def score_errors(c: pd.DataFrame) -> pd.Series:
    """Simulated minus real method score s_j (points), per method."""
    methods = list(c.index.get_level_values("method").unique())
    pr, ps = (c[col].unstack("k").reindex(methods).to_numpy() / 100 for col in ("r", "s"))
    return pd.Series(100 * (scoring.method_scores(ps) - scoring.method_scores(pr)), index=methods)


def grid(
    studies: dict[str, Published],
    reads: dict[str, dict[tuple[str, float], np.ndarray]],
    reps: int,
    g: Grid,
) -> dict[tuple[str, tuple[str, float], tuple[float, ...]], pd.DataFrame]:
    """Cells of every (dataset, reader setting, worker setting), common random numbers."""
    out = {}
    for name, per_reader in reads.items():
        for reader, probs in per_reader.items():
            for w in g.workers():
                rng = np.random.default_rng(0)
                exp = fast_crowd(probs, w[0], w[1], w[2], rng, replicates=reps)
                out[(name, reader, w)] = cells(studies[name], exp)
    return out


def best(
    table: dict[Any, pd.DataFrame], keys: list[Any], loss: Callable[[pd.DataFrame], float]
) -> Any:
    return min(keys, key=lambda key: loss(table[key]))


def fit_report(
    table: dict[tuple[str, tuple[str, float], tuple[float, ...]], pd.DataFrame],
    family: dict[str, str],
) -> dict[str, Any]:
    """The joint fit (one worker setting, each dataset's reader setting), leave one method
    out per dataset, and each dataset fitted alone and measured on the other."""
    workers = sorted({w for (_, _, w) in table})
    settings = {
        d: sorted({r for (dd, r, _) in table if dd == d and r[0] == family[d]}) for d in family
    }

    def best_reader(d: str, w: tuple[float, ...]) -> tuple[str, float]:
        return min(settings[d], key=lambda r: figures(table[(d, r, w)])["objective"])

    joint_w = min(
        workers,
        key=lambda w: sum(figures(table[(d, best_reader(d, w), w)])["objective"] for d in family),
    )
    report: dict[str, Any] = {"workers": dict(zip(WORKER_KEYS, joint_w)), "datasets": {}}
    residuals: dict[str, dict[str, dict[str, float]]] = {}
    for d in family:
        r = best_reader(d, joint_w)
        c = table[(d, r, joint_w)]
        methods = list(c.index.get_level_values("method").unique())
        lomo_cells, lomo_err, lomo_bias = [], {}, {}
        for m in methods:
            keys = [(d, rr, w) for rr in settings[d] for w in workers]
            k = best(table, keys, lambda cc, m=m: figures(cc.drop(m, level="method"))["objective"])
            held = table[k].xs(m, level="method")
            lomo_cells.extend((held["s"] - held["r"]).abs().tolist())
            lomo_bias[m] = float((held["s"] - held["r"]).mean())
            lomo_err[m] = float(score_errors(table[k])[m])
        report["datasets"][d] = {
            "reader": {"family": r[0], "setting": r[1]},
            "fitted": figures(c),
            "bias": (c["s"] - c["r"]).groupby(level="method").mean().round(2).to_dict(),
            "lomo_mae": float(np.mean(lomo_cells)),
            "lomo_bias": lomo_bias,
        }
        residuals.setdefault(d, {})["leave_one_method_out"] = lomo_err
    for fit_on, other in itertools.permutations(family, 2):
        keys = [(fit_on, r, w) for r in settings[fit_on] for w in workers]
        k = best(table, keys, lambda cc: figures(cc)["objective"])
        there = (other, (family[other], A_PRIORI[family[other]]), k[2])
        c = table[there]
        report["datasets"][other][f"from_{fit_on}"] = {
            "fitted_on": fit_on,
            "setting": {"reader": list(k[1]), **dict(zip(WORKER_KEYS, k[2]))},
            "other_reader": list(there[1]),
            **figures(c),
        }
        residuals[other][f"fitted_on_{fit_on}"] = score_errors(c).to_dict()
    report["residuals"] = residuals
    return report


def lomo_same_protocol(
    table: dict[tuple[str, tuple[str, float], tuple[float, ...]], pd.DataFrame],
    d: str,
    fam: str,
) -> float:
    """Leave-one-method-out cell MAE of one reader family on one dataset (every setting
    refitted without the method), for comparing readers under the same protocol."""
    keys = [k for k in table if k[0] == d and k[1][0] == fam]
    c0 = table[keys[0]]
    errs: list[float] = []
    for m in c0.index.get_level_values("method").unique():
        k = best(table, keys, lambda cc, m=m: figures(cc.drop(m, level="method"))["objective"])
        held = table[k].xs(m, level="method")
        errs.extend((held["s"] - held["r"]).abs().tolist())
    return float(np.mean(errs))


def polar_counts(p: Published, root: Path) -> pd.DataFrame:
    """Per task, the shown words with |weight| > 1 in the SST-2 word model that agree with
    the label (the issue's count) and that disagree."""
    polar = LexiconReader(phrases=str(root / "sst2/train.tsv")).lexicon().polar(1.0)
    sign = polar.weights[:, 1] - polar.weights[:, 0]  # > 0: positive
    token = re.compile(TOKEN_PATTERN)
    agree, disagree = [], []
    for text, label in zip(p.tasks["display_text"], p.tasks["label"]):
        s = np.array(
            [
                sign[polar.vocabulary[w]]
                for w in token.findall(text.lower())
                if w in polar.vocabulary
            ]
        )
        direction = 1.0 if int(label) == 1 else -1.0
        agree.append(int((s * direction > 0).sum()))
        disagree.append(int((s * direction < 0).sum()))
    return p.tasks[KEY].assign(agree=agree, disagree=disagree)


def markdown(frame: pd.DataFrame, digits: int = 1) -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + " --- |" * len(cols)]
    for row in frame.itertuples(index=False):
        cells_ = [f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def why_people_are_right(
    imdb: Published,
    reads: dict[tuple[str, float], np.ndarray],
    report: dict[str, Any],
    args: argparse.Namespace,
) -> list[str]:
    """Section 1 of the module docstring: people, the former and the new simulated crowd by
    the polar words shown; polar words per method; per-method bias; the report's lines
    (``report["analysis"]`` gets the task AUCs and the k = 5 figures)."""
    counts = polar_counts(imdb, args.data_root)
    former = (FORMER["lapse"], FORMER["idk"], FORMER["temperature"])
    w = tuple(report["workers"][k] for k in WORKER_KEYS)
    r = report["datasets"]["imdb"]["reader"]
    settings = {
        "former (corpus reader)": (reads[FORMER["reader"]], former),  # type: ignore[index]
        "new (lexicon reader)": (reads[(r["family"], r["setting"])], w),
    }
    expected = {
        name: fast_crowd(probs, *ws, np.random.default_rng(0), replicates=args.replicates)
        for name, (probs, ws) in settings.items()
    }
    by = counts.assign(people=imdb.real["correct"].to_numpy(), **expected)
    by["shown"] = by["agree"].clip(upper=3).map(lambda n: "≥ 3" if n == 3 else str(n))
    per_count = (100 * by.groupby("shown")[["people", *expected]].mean()).reset_index()
    per_count.insert(1, "tasks", by.groupby("shown").size().to_numpy())
    per_method = (
        by.groupby("method")
        .agg(
            agree=("agree", "mean"),
            disagree=("disagree", "mean"),
            none=("agree", lambda a: 100 * (a == 0).mean()),
        )
        .reset_index()
    )
    cell = by.groupby(["method", "k"])
    bias = pd.DataFrame(
        {
            name: (cell[name].mean() - cell["people"].mean()).groupby("method").mean() * 100
            for name in expected
        }
    ).reset_index()
    auc = {name: float(roc_auc_score(by["people"], by[name])) for name in expected}
    k5 = by[(by["k"] == 5) & (by["agree"] == 0)][["people", *expected]].mean() * 100
    report["analysis"] = {"task_auc": auc, "k5_no_polar": k5.round(1).to_dict()}
    return [
        "## People vs simulated crowds by polar words shown (IMDB, |weight| > 1, agreeing "
        "with the label)",
        markdown(per_count),
        f"k = 5 with no such word: {k5.round(1).to_dict()}",
        "## Polar words per task, by method (IMDB)",
        markdown(per_method, 2),
        "## Per-method bias, simulated minus real accuracy (points, mean over k)",
        markdown(bias),
        f"task AUC (expected accuracy vs the real verdict): {auc}",
    ]


def write_residuals(report: dict[str, Any], out: Path) -> str:
    """``residuals.yaml`` in the form ``simulation.discrepancy.residuals`` takes."""
    lines = ["residuals:"]
    for d, kinds in report["residuals"].items():
        lines.append(f"  {d}:")
        for kind, errs in kinds.items():
            inner = ", ".join(f"{m}: {v:.1f}" for m, v in errs.items())
            lines.append(f"    {kind}: {{{inner}}}")
    text = "\n".join(lines) + "\n"
    (out / "residuals.yaml").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks crowd_reader", description=__doc__)
    ap.add_argument(
        "--data-root",
        type=Path,
        default=Path(os.environ.get("SALEVAL_DATA_ROOT", ROOT.parent / "shared/data")),
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replicates", type=int, default=8)
    ap.add_argument(
        "--seed", type=int, default=42, help="the corpus reader's seed (simulation.seed)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke size (QUICK): seconds, not minutes")
    args = ap.parse_args(argv)
    out = args.out or ROOT / "outputs" / "benchmarks" / "crowd_reader" / time.strftime(
        "%Y%m%d-%H%M%S"
    )
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    studies = {d: load(d, args.data_root) for d in DATASETS}
    g = QUICK if args.quick else Grid()
    reads = {d: readings(p, args.data_root, args.seed, g) for d, p in studies.items()}
    print(f"readers read both studies in {time.perf_counter() - t0:.0f} s", flush=True)
    table = grid(studies, reads, 2 if args.quick else args.replicates, g)
    print(
        f"{len(table)} (dataset, reader, worker) settings in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    report = fit_report(table, DEFAULT_READER)
    report["same_protocol_lomo"] = {
        d: {
            fam: lomo_same_protocol(table, d, fam)
            for fam in ("lexicon", "corpus")
            if any(k[0] == d and k[1][0] == fam for k in table)
        }
        for d in DATASETS
    }
    text = why_people_are_right(studies["imdb"], reads["imdb"], report, args)
    text += [
        "## Calibration",
        json.dumps({k: v for k, v in report.items() if k != "residuals"}, indent=2, default=float),
    ]
    print("\n\n".join(text), flush=True)
    (out / "report.md").write_text("\n\n".join(text) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    print(write_residuals(report, out))
    print(f"written to {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
