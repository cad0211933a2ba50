"""Issue #46: saleval's ERASER convention against ERASER's own scorer, on the same predictions.

    python -m benchmarks eraser_agreement --scorer /path/to/eraserbenchmark [--n 40]
        [--max-length 256] [--methods random,all_attention,...] [--root DIR] [--python PY]
        [--split test] [--sample-ids negR_900,...] [--override metrics.plausibility.top_k=5]
    python -m benchmarks eraser_agreement --scorer /path/to/eraserbenchmark --metrics-run DIR

ERASER's scorer (DeYoung et al. 2020; ``rationale_benchmark/metrics.py`` of
github.com/jayded/eraserbenchmark) is not part of saleval: ``--scorer`` is the user's own
checkout of that repository. It needs numpy, scipy and scikit-learn and imports torch;
the saleval venv has all four, so by default it runs under this interpreter (``--python``
names another).

What runs, in ``--root`` (a fresh temporary directory by default):

1. a checkpoint: the embedded MiniLM with an untrained two-class head (seed 0) —
   agreement is about the scoring rules, not the model's quality;
2. ``saleval-explain`` on ``--n`` ERASER movies test documents (seeded, class-balanced),
   read in a ``--max-length`` window, with ``--methods``;
3. two methods added to that run's ``attributions.parquet``: ``oracle`` (1 on every word
   overlapping a human rationale span, 0 elsewhere: ties everywhere) and ``noisy_oracle``
   (the same plus Gaussian noise, σ 0.5, seed 0). Their top-k runs join annotated spans
   that touch across punctuation, and the rationale words past the window have no score
   — the cases where ERASER's rules and saleval's own part ways (docs/metrics.md#eraser);
4. ``saleval-metrics`` with ``metrics.plausibility.convention=eraser`` (and the cheapest
   faithfulness settings: the stage computes those too), which writes ``eraser/``;
5. per method, the scorer on ``eraser/<method>.jsonl`` against ``eraser/test.jsonl``.

``--metrics-run DIR`` skips 1–4 and scores a finished metrics run of the ERASER
convention. The script prints per method the scorer's and saleval's token F1, AUPRC and
IOU F1 (with IOU precision and recall) and their largest difference, and exits 1 when a
difference exceeds ``--tol`` (1e-4). docs/benchmarks.md#eraser-agreement holds a run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("random", "all_attention", "vanilla_gradient", "input_x_gradient")
ORACLES = ("oracle", "noisy_oracle")
#: saleval's metric name -> where the scorer's score file holds the same figure
#: (``iou_scores`` is a list, one entry per IOU threshold: the one at saleval's threshold)
FIGURES = {
    "eraser_token_f1": ("token_prf", "instance_macro", "f1"),
    "eraser_auprc": ("token_soft_metrics", "auprc"),
    "eraser_iou_f1": ("iou_scores", "macro", "f1"),
    "eraser_iou_precision": ("iou_scores", "macro", "p"),
    "eraser_iou_recall": ("iou_scores", "macro", "r"),
}
#: the issue's three figures: the agreement is judged on these
JUDGED = ("eraser_token_f1", "eraser_auprc", "eraser_iou_f1")
#: the cheapest faithfulness settings the metrics stage takes (it computes them too)
CHEAP_METRICS = (
    "metrics=quick",
    "metrics.ks=[5]",
    "metrics.eraser_grid=[0.2]",
    "metrics.aopc_k=1",
    "metrics.switching.max_fraction=0.01",
)


def scorer_figures(scores: Mapping[str, Any], threshold: float = 0.5) -> dict[str, float]:
    """saleval's names for the figures in one score file of ERASER's scorer (the JSON its
    ``--score_file`` writes). A file without hard or soft predictions' sections, or
    without the IOU threshold asked for, is an error naming what is missing.

    >>> figures = scorer_figures({
    ...     "token_prf": {"instance_macro": {"p": 0.5, "r": 0.5, "f1": 0.5}},
    ...     "token_soft_metrics": {"auprc": 0.75, "average_precision": 0.8},
    ...     "iou_scores": [{"threshold": 0.5, "macro": {"p": 1.0, "r": 0.5, "f1": 2 / 3}}]})
    >>> figures["eraser_token_f1"], figures["eraser_auprc"], round(figures["eraser_iou_f1"], 4)
    (0.5, 0.75, 0.6667)
    """
    out: dict[str, float] = {}
    for name, path in FIGURES.items():
        node: Any = scores
        for i, key in enumerate(path):
            if key == "iou_scores":
                at = [x for x in scores.get(key, []) if math.isclose(x["threshold"], threshold)]
                if not at:
                    raise ValueError(
                        f"the scorer's output has no iou_scores at threshold {threshold} "
                        "(run it with --iou_thresholds <metrics.plausibility.iou_threshold>)"
                    )
                node = at[0]
                continue
            if not isinstance(node, Mapping) or key not in node:
                raise ValueError(
                    f"the scorer's output has no {'.'.join(path[: i + 1])} (for {name}): did "
                    "it find hard and soft predictions in the results file's first line?"
                )
            node = node[key]
        out[name] = float(node)
    return out


def saleval_figures(metrics_csv: pd.DataFrame) -> pd.DataFrame:
    """Per method (rows) the ERASER figures of a metrics run's ``metrics.csv`` (columns)."""
    rows = metrics_csv[metrics_csv["metric"].isin(list(FIGURES))]
    if rows.empty:
        raise ValueError(
            "metrics.csv has no eraser_* rows: run saleval-metrics with "
            "metrics.plausibility.convention=eraser (or both)"
        )
    wide = rows.pivot_table(index="method", columns="metric", values="value", aggfunc="first")
    return wide.reindex(columns=list(FIGURES)).rename_axis(columns=None)


def compare(ours: pd.DataFrame, theirs: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """One row per method and figure: the scorer's value, saleval's and |difference|
    (infinite where only one side is NaN). A method on one side only is an error (the two
    were not run on the same predictions).

    >>> ours = pd.DataFrame({"eraser_auprc": [0.5]}, index=["random"])
    >>> compare(ours, {"random": {"eraser_auprc": 0.50002}})["diff"].round(6).tolist()
    [2e-05]
    >>> compare(ours, {"random": {"eraser_auprc": float("nan")}})["diff"].tolist()
    [inf]
    """
    if set(ours.index) != set(theirs):
        raise ValueError(
            f"methods differ: saleval has {sorted(ours.index)}, the scorer {sorted(theirs)}"
        )
    rows = []
    for method in ours.index:
        for name in ours.columns:
            a, b = float(theirs[method][name]), float(ours.loc[method, name])
            diff = abs(a - b) if math.isnan(a) == math.isnan(b) else math.inf
            rows.append({"method": method, "figure": name, "eraser": a, "saleval": b,
                         "diff": 0.0 if math.isnan(diff) else diff})  # fmt: skip
    return pd.DataFrame(rows)


def table(diffs: pd.DataFrame) -> str:
    """Markdown: per method the judged figures, the scorer's beside saleval's, and the
    largest |difference| over all five figures."""
    head = ["method", *(f"{n.removeprefix('eraser_')} (ERASER / saleval)" for n in JUDGED),
            "max \\|diff\\|"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for method, g in diffs.groupby("method", sort=False):
        by = g.set_index("figure")
        cells = [f"{by.loc[n, 'eraser']:.6f} / {by.loc[n, 'saleval']:.6f}" for n in JUDGED]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {g['diff'].max():.1e} |")
    return "\n".join(lines)


def iou_threshold(run: Path) -> float:
    """The IOU threshold the metrics run used (its ``config.yaml``)."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(
        OmegaConf.load(run / "config.yaml"), "metrics.plausibility.iou_threshold"
    )
    if value is None:
        raise SystemExit(f"{run}/config.yaml: no metrics.plausibility.iou_threshold")
    return float(value)


def run_scorer(
    scorer: Path,
    python: str,
    eraser_dir: Path,
    method: str,
    split: str,
    threshold: float,
    scores_dir: Path,
) -> dict[str, Any]:
    """ERASER's scorer on one method's results file; its score file (kept in
    ``scores_dir``), parsed."""
    out = scores_dir / f"{method}.json"
    cmd = [python, "-m", "rationale_benchmark.metrics", "--split", split,
           "--data_dir", str(eraser_dir), "--results", str(eraser_dir / f"{method}.jsonl"),
           "--iou_thresholds", str(threshold), "--score_file", str(out)]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(scorer), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(cmd, cwd=scorer, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ERASER's scorer failed on {method}:\n{done.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def _stage(name: str, root: Path, run_dir: Path, *overrides: str) -> Path:
    script = Path(sys.executable).parent / f"saleval-{name}"
    cmd = [str(script), f"paths.output_root={root}", f"run_dir={run_dir}", "progress=false",
           *overrides]  # fmt: skip
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    if code != 0:
        raise SystemExit(f"saleval-{name} exited {code}")
    print(f"  {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def checkpoint(path: Path) -> Path:
    """The embedded MiniLM with an untrained head for ERASER movies' two classes."""
    from saleval.modeling.models import build_model, load_tokenizer
    from saleval.stages.run import compose_stage

    if (path / "config.json").is_file():
        return path
    model_cfg = compose_stage("train", ["model=minilm"]).model
    model = build_model(model_cfg, ["negative", "positive"], seed=0)
    model.save_pretrained(path)
    load_tokenizer(model_cfg).save_pretrained(path)
    return path


def add_oracles(explain_dir: Path, split: str = "test", sigma: float = 0.5, seed: int = 0) -> None:
    """``oracle`` and ``noisy_oracle`` rows in the explain run's attributions, on the words
    the run kept (inside the window), from the dataset's rationale spans."""
    from saleval.metrics.plausibility import rationale_word_mask
    from saleval.modeling.data import load_dataset
    from saleval.pipeline import tables
    from saleval.stages.run import compose_stage

    attrs = tables.ATTRIBUTIONS.read(explain_dir)
    attrs = attrs[~attrs["method"].isin(ORACLES)]
    rows = load_dataset(compose_stage("train", ["dataset=eraser_movies"]).dataset)[split]
    spans = dict(zip(rows["sample_id"].astype(str), rows["rationale_spans"]))
    rng = np.random.default_rng(seed)
    first = attrs[attrs["method"] == attrs["method"].iloc[0]]
    added = []
    for sid, words in first.groupby("sample_id", sort=True):
        words = words.sort_values("word_index")
        human = rationale_word_mask(list(zip(words.char_start, words.char_end)), spans[str(sid)])
        added.append(words.assign(method="oracle", score=human.astype(float)))
        noisy = human + rng.normal(0.0, sigma, size=len(human))
        added.append(words.assign(method="noisy_oracle", score=noisy))
    tables.ATTRIBUTIONS.write(pd.concat([attrs, *added], ignore_index=True), explain_dir)


def produce(
    root: Path,
    n: int,
    max_length: int,
    methods: list[str],
    split: str = "test",
    sample_ids: list[str] | None = None,
    overrides: list[str] | None = None,
) -> Path:
    """Steps 1–4 of the module docstring; the metrics run's directory. ``sample_ids``
    (without ``.txt``) win over ``n``; ``overrides`` go to the metrics stage."""
    model = checkpoint(root / "model")
    which = f"data.sample_ids=[{','.join(sample_ids)}]" if sample_ids else f"data.n_samples={n}"
    explain = _stage(
        "explain", root, root / "explain", f"inputs.model={model}", "dataset=eraser_movies",
        f"data.split={split}", which, f"max_length={max_length}",
        f"method=[{','.join(methods)}]", "view.samples=0",
    )  # fmt: skip
    add_oracles(explain, split)
    return _stage(
        "metrics", root, root / "metrics", f"inputs.model={model}", f"inputs.explain={explain}",
        "metrics.plausibility.convention=eraser", *CHEAP_METRICS, *(overrides or []),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks eraser_agreement")
    ap.add_argument("--scorer", type=Path, required=True,
                    help="a checkout of github.com/jayded/eraserbenchmark (its root)")  # fmt: skip
    ap.add_argument("--python", default=sys.executable, help="the interpreter for the scorer")
    ap.add_argument(
        "--root",
        type=Path,
        default=None,
        help="where the runs and the scorer's score files go (default: a new temporary dir)",
    )
    ap.add_argument("--metrics-run", type=Path, default=None,
                    help="score this finished metrics run instead of making one")  # fmt: skip
    ap.add_argument("--n", type=int, default=40, help="ERASER movies test documents")
    ap.add_argument("--max-length", type=int, default=256, help="the model's window (pieces)")
    ap.add_argument("--methods", default=",".join(METHODS), help="saleval methods, comma-separated")
    ap.add_argument("--split", default="test", choices=("train", "validation", "test"))
    ap.add_argument(
        "--sample-ids",
        default=None,
        help="documents to explain, comma-separated (e.g. negR_900): wins over --n",
    )
    ap.add_argument("--override", action="append", default=[],
                    help="a Hydra override for the metrics stage (repeatable), e.g. "
                    "metrics.plausibility.top_k=5")  # fmt: skip
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    if not (args.scorer / "rationale_benchmark" / "metrics.py").is_file():
        ap.error(f"--scorer {args.scorer}: no rationale_benchmark/metrics.py there")
    if os.sep in args.python:  # a path: the scorer runs from its checkout (not resolve():
        args.python = str(Path(args.python).absolute())  # a venv's python is a link)
    root = (args.root or Path(tempfile.mkdtemp(prefix="eraser_agreement_"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.metrics_run is None:
        ids = args.sample_ids.split(",") if args.sample_ids else None
        run = produce(root, args.n, args.max_length, args.methods.split(","),
                      args.split, ids, args.override)  # fmt: skip
    else:
        run = args.metrics_run
    eraser_dir = run / "eraser"
    if not eraser_dir.is_dir():
        raise SystemExit(f"{run}: no eraser/ (run the metrics with convention=eraser or both)")
    threshold = iou_threshold(run)
    splits = [p.stem for p in eraser_dir.glob("*.jsonl") if p.stem in ("train", "val", "test")]
    if len(splits) != 1:
        raise SystemExit(f"{eraser_dir}: expected one split file, found {splits}")
    ours = saleval_figures(pd.read_csv(run / "metrics.csv", keep_default_na=False))
    scores_dir = root / "eraser_scores"
    scores_dir.mkdir(exist_ok=True)
    theirs = {
        m: scorer_figures(
            run_scorer(
                args.scorer, args.python, eraser_dir, str(m), splits[0], threshold, scores_dir
            ),
            threshold,
        )
        for m in ours.index
    }
    diffs = compare(ours, theirs)
    print(f"\nERASER's scorer ({args.scorer}; its score files in {scores_dir}) and saleval "
          f"({run}), split {splits[0]}, IOU threshold {threshold}:\n")  # fmt: skip
    print(table(diffs))
    worst = diffs.loc[diffs["diff"].idxmax()]
    print(f"\nlargest |difference|: {worst['diff']:.2e} ({worst['method']}, {worst['figure']})")
    return int(worst["diff"] > args.tol)


if __name__ == "__main__":
    raise SystemExit(main())
