"""How close a simulated crowd comes to real people on the same tasks.

Both sides are A[i, j, k] tables (``tables.AGGREGATED``): the published verdicts of the
original study's workers and the simulated crowd's, on the very texts those workers saw.
Every score comes from :mod:`saleval.analysis.scoring`, the code that scores any crowd result:

* per (method, k): accuracy real vs simulated, and the mean absolute cell error;
* per k: the accuracy-vs-k curve (mean over methods) and its largest gap;
* per method: the scores s_j, their ranks and Spearman's rho; flips and aids;
* per task: discrimination (ROC AUC of the simulated share of correct answers against
  the real verdict), calibration (Brier score of that share), and the correlation of
  the two verdicts.

:func:`published_ranking_agreement` sets a whole pipeline's scores beside the published
crowd's on the same samples (``saleval-run`` reports it).

The figures of the shipped calibration are in ``docs/simulated-crowd.md``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from scipy import stats
from sklearn.metrics import brier_score_loss, roc_auc_score

from saleval.analysis import scoring
from saleval.analysis.reports import SIMULATED, display_name
from saleval.crowd.importing.published_study import LU2024_READERS, published_verdicts
from saleval.modeling.data import dataset_config
from saleval.pipeline import tables
from saleval.pipeline.records.run_record import ancestry

VALIDATION_FILE = "validation.csv"
VALIDATION_JSON = "validation.json"
VALIDATION_PLOT = "validation.png"
READER_FILE = "reader.json"  # a simulate run's reader, by name (what simulation/reader=auto chose)


@dataclass
class Validation:
    """``table``: method, k, real, simulated, n (accuracy in percent); ``summary``: the
    figures (JSON-ready); ``methods``: per method real/simulated score, rank, flips, aids."""

    table: pd.DataFrame
    methods: pd.DataFrame
    summary: dict[str, Any]


def _cube(aggregated: pd.DataFrame, like: scoring.Cube | None = None) -> scoring.Cube:
    cube = scoring.Cube.from_aggregated(aggregated)
    if like is None:
        return cube
    idx = pd.MultiIndex.from_product(
        [like.samples, like.methods, like.ks], names=["sample_id", "method", "k"]
    )
    a = aggregated.set_index(["sample_id", "method", "k"])["correct"].astype("float64")
    a = a.reindex(idx)
    shape = (len(like.samples), len(like.methods), len(like.ks))
    return scoring.Cube(a.to_numpy().reshape(shape), like.samples, like.methods, like.ks)


def compare_crowds(
    real: pd.DataFrame, simulated: pd.DataFrame | Sequence[pd.DataFrame]
) -> Validation:
    """Compare simulated A with the real A on the real one's samples, methods and ks.

    ``simulated`` may hold several simulated crowds (seeds) on the same tasks: cell
    accuracies, scores and flips are then their means, and a task's simulated verdict is
    the share of crowds that recognised it. One real crowd of 100 samples carries about
    3.5 points of binomial noise per cell; averaging the simulated side keeps it from
    adding as much again.

    >>> real = pd.DataFrame({"sample_id": ["a", "a", "b", "b"], "method": ["m", "random"] * 2,
    ...                      "k": [5] * 4, "correct": [1, 0, 1, 1]})
    >>> v = compare_crowds(real, real.assign(frac_correct=real["correct"] * 1.0))
    >>> v.summary["mae_cell"], v.summary["task_auc"]
    (0.0, 1.0)
    """
    real = tables.AGGREGATED.validate(real, where="validation (real)")
    sims = [simulated] if isinstance(simulated, pd.DataFrame) else list(simulated)
    sims = [tables.AGGREGATED.validate(s, where="validation (simulated)") for s in sims]
    rc = _cube(real)
    cubes = [_cube(s, like=rc) for s in sims]
    if not cubes or any(np.isnan(c.A).all() for c in cubes):
        raise ValueError(
            "validation: a simulated crowd answered none of the real tasks "
            "(no common sample_id, method, k)"
        )
    p_real = scoring.accuracy(rc.A)
    p_sim = np.mean([scoring.accuracy(c.A) for c in cubes], axis=0)
    n = (~np.isnan(rc.A) & ~np.isnan(cubes[0].A)).sum(axis=0)
    table = pd.DataFrame(
        [
            {
                "method": m,
                "k": k,
                "real": 100 * p_real[j, c],
                "simulated": 100 * p_sim[j, c],
                "n": int(n[j, c]),
            }
            for j, m in enumerate(rc.methods)
            for c, k in enumerate(rc.ks)
        ]
    )
    err = np.abs(table["real"] - table["simulated"])
    curve = table.groupby("k")[["real", "simulated"]].mean()
    gap = (curve["simulated"] - curve["real"]).abs()
    s_real = scoring.method_scores(np.nan_to_num(p_real))
    s_sim = scoring.method_scores(np.nan_to_num(p_sim))
    f_real = scoring.flip_analysis(rc.A)
    f_each = [scoring.flip_analysis(c.A) for c in cubes]
    f_sim = {key: np.mean([f[key] for f in f_each], axis=0) for key in ("flips", "aids")}
    bias = table.assign(d=table["simulated"] - table["real"]).groupby("method")["d"].mean()
    methods = pd.DataFrame(
        {
            "method": rc.methods,
            "bias": bias.reindex(rc.methods).to_numpy(),
            "score_real": 100 * s_real,
            "score_simulated": 100 * s_sim,
            "rank_real": scoring.rank_desc(s_real),
            "rank_simulated": scoring.rank_desc(s_sim),
            "flips_real": f_real["flips"],
            "flips_simulated": f_sim["flips"],
            "aids_real": f_real["aids"],
            "aids_simulated": f_sim["aids"],
        }
    )
    summary: dict[str, Any] = {
        "n_tasks": int(n.sum()),
        "n_simulated_crowds": len(cubes),
        "mae_cell": float(err.mean()),
        "max_cell_error": float(err.max()),
        "accuracy_real": float(table["real"].mean()),
        "accuracy_simulated": float(table["simulated"].mean()),
        "curve": {
            int(k): {"real": float(r.real), "simulated": float(r.simulated)}
            for k, r in curve.iterrows()
        },
        "curve_max_gap": float(gap.max()),
        "score_spearman": _spearman(s_real, s_sim),
        "score_mae": float(np.mean(np.abs(s_real - s_sim)) * 100),
        "flips_total": {
            "real": int(f_real["flips"].sum()),
            "simulated": float(f_sim["flips"].sum()),
        },
        "aids_total": {"real": int(f_real["aids"].sum()), "simulated": float(f_sim["aids"].sum())},
        **_task_level(real, sims),
    }
    return Validation(table, methods, summary)


def bias_table(v: Validation) -> str:
    """Per method: the simulated crowd's bias (simulated minus real accuracy, mean over k,
    in points), the mean absolute cell error, and the scores s_j with their ranks, as a
    Markdown table (what ``saleval-simulate action=validate`` prints).

    >>> real = pd.DataFrame({"sample_id": ["a", "b"] * 2, "method": ["m", "m", "random", "random"],
    ...                      "k": [5] * 4, "correct": [1, 1, 0, 1]})
    >>> sim = real.assign(correct=[1, 0, 0, 1])
    >>> print(bias_table(compare_crowds(real, sim)))
    | method | bias (pts) | cell MAE (pts) | s_j real | s_j SIMULATED | rank real → SIMULATED |
    | --- | ---: | ---: | ---: | ---: | --- |
    | m | -50.0 | 50.0 | 100.0 | 50.0 | 1 → 1 |
    | Random | +0.0 | 0.0 | 50.0 | 50.0 | 2 → 1 |
    """
    err = v.table.assign(e=(v.table["simulated"] - v.table["real"]).abs())
    mae = err.groupby("method")["e"].mean()
    lines = [
        f"| method | bias (pts) | cell MAE (pts) | s_j real | s_j {SIMULATED} | "
        f"rank real → {SIMULATED} |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in v.methods.itertuples(index=False):
        lines.append(
            f"| {display_name(str(r.method))} | {r.bias:+.1f} | {mae[r.method]:.1f} | "
            f"{r.score_real:.1f} | {r.score_simulated:.1f} | "
            f"{int(r.rank_real)} → {int(r.rank_simulated)} |"
        )
    return "\n".join(lines)


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(stats.spearmanr(a, b).statistic)


def _task_level(real: pd.DataFrame, sims: Sequence[pd.DataFrame]) -> dict[str, Any]:
    """Task-level agreement: does the simulated crowd find the same tasks hard? The
    simulated verdict of a task is the share of simulated crowds that recognised it."""
    key = ["sample_id", "method", "k"]
    stacked = pd.concat([s[[*key, "correct"]] for s in sims], ignore_index=True)
    share = stacked.groupby(key, as_index=False)["correct"].mean()
    both = real[[*key, "correct"]].merge(share, on=key, suffixes=("_real", "_sim"))
    y = both["correct_real"].to_numpy()
    v = both["correct_sim"].to_numpy(dtype=np.float64)
    out: dict[str, Any] = {
        "task_agreement": float(1.0 - np.abs(y - v).mean()),
        "task_correlation": float(np.corrcoef(y, v)[0, 1]) if np.ptp(y) and np.ptp(v) else None,
    }
    if np.ptp(y):
        out["task_auc"] = float(roc_auc_score(y, v))
        out["task_brier"] = float(brier_score_loss(y, v))
    else:
        out["task_auc"] = out["task_brier"] = None
    return out


def plot_validation(table: pd.DataFrame, path: str | Path, caption: str, note: str = "") -> Path:
    """Real (solid) and simulated (dashed) accuracy against k, one panel per method."""
    methods = scoring.order_methods(table["method"])
    cols = min(4, len(methods))
    rows = -(-len(methods) // cols)
    fig = Figure(figsize=(3.2 * cols, 2.6 * rows + 0.6))
    ks = sorted(table["k"].unique())
    for i, m in enumerate(methods):
        ax = fig.add_subplot(rows, cols, i + 1)
        d = table[table["method"] == m].sort_values("k")
        ax.plot(d["k"], d["real"], "-o", color="#222222", label="real crowd", ms=4)
        ax.plot(d["k"], d["simulated"], "--s", color="#c44e52", label="SIMULATED", ms=4)
        ax.set_title(display_name(m), fontsize=9)
        ax.set_ylim(0, 100)
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("accuracy (%)")
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle(
        f"{SIMULATED} vs real crowd: {caption}" + (f"\n{note}" if note else ""), fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def calibration_differences(sim: Mapping[str, Any]) -> list[str]:
    """The settings of ``sim`` (a ``simulation`` node) that differ from those its
    ``validation`` figures were measured with (``simulation.validated``, nested as the
    node itself): where any differs, the figures describe another worker model. A setting
    the node leaves out (a reader field at its class default) counts as the validated one.

    >>> validated = {"reader": {"_target_": "BowReader"}, "idk_threshold": 0.2}
    >>> calibration_differences({"reader": {"_target_": "BowReader", "C": 1.0},
    ...     "idk_threshold": 0.2, "validated": validated})
    []
    >>> calibration_differences({"reader": {"_target_": "EmbeddingReader"},
    ...     "idk_threshold": 0.5, "validated": validated})
    ['reader._target_ = EmbeddingReader (validated: BowReader)', 'idk_threshold = 0.5 (validated: 0.2)']
    """
    node = OmegaConf.create(dict(sim))
    out: list[str] = []

    def walk(want: Mapping[str, Any], prefix: str) -> None:
        for key, value in want.items():
            path = f"{prefix}{key}"
            if isinstance(value, Mapping):
                walk(value, path + ".")
                continue
            got = OmegaConf.select(node, path, default=_ABSENT)
            if got is not _ABSENT and not _same(got, value):
                out.append(f"{path} = {got} (validated: {value})")

    walk(sim.get("validated") or {}, "")
    return out


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    """Config values equal as a config reads them: 2 == 2.0, an enum == its name."""
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(np.isclose(float(a), float(b), rtol=1e-9, atol=0.0))
    return str(getattr(a, "value", a)) == str(getattr(b, "value", b))


def validated_name(names: Iterable[str], dataset: str | None) -> str | None:
    """The validated dataset (a name of ``names``) that ``dataset`` is, or None:
    ``lu2024_imdb`` counts as ``imdb``, since the validation used the published samples.

    >>> validated_name(["imdb", "ag_news"], "lu2024_ag_news"), validated_name(["imdb"], "sst2")
    ('ag_news', None)
    """
    if not dataset:
        return None
    return next((k for k in names if dataset == k or dataset.endswith(f"_{k}")), None)


def outside_validation(
    validation: Mapping[str, Any], dataset: str | None = None, study: str | None = None
) -> list[str]:
    """What a run has that the validation figures were not measured on: its dataset, when
    no figure is for it (``lu2024_imdb`` counts as ``imdb``: the figures come from the
    published samples), and its study when it is not the main one (``study``, e.g.
    "forward prediction"; None for the main study).

    >>> outside_validation({"imdb": "...", "ag_news": "..."}, "lu2024_imdb")
    []
    >>> outside_validation({"imdb": "...", "ag_news": "..."}, "sst2", "forward prediction")
    ['sst2', 'forward prediction']
    """
    out = []
    if dataset and validated_name(validation, dataset) is None:
        out.append(dataset)
    if study:
        out.append(study)
    return out


def calibration_note(
    sim: Mapping[str, Any] | None,
    short: bool = False,
    dataset: str | None = None,
    study: str | None = None,
) -> str:
    """One line on how close the worker model in use came to real people: what every
    SIMULATED table, notice and plot says besides SIMULATED. ``sim`` is the
    ``simulation`` node: its ``validation`` figures, unless a setting differs from the
    ones they were measured with (:func:`calibration_differences`); ``short`` for a plot
    that already says SIMULATED in its title. The figures were measured on the main study
    of the datasets they name: a run on another dataset or study (``dataset``, ``study``:
    :func:`outside_validation`) is told that they do not cover it.

    >>> calibration_note({"validation": {"imdb": "cell MAE 6.6 pts"}})
    'SIMULATED crowd validated against real workers (docs/simulated-crowd.md): imdb: cell MAE 6.6 pts'
    >>> calibration_note({"validation": {"imdb": "MAE 4.3"}, "reader_used": "lexicon reader"})
    'SIMULATED crowd (read by the lexicon reader) validated against real workers (docs/simulated-crowd.md): imdb: MAE 4.3'
    >>> calibration_note({"validation": {"imdb": "MAE 6.6"}, "temperature": 2.0,
    ...     "validated": {"temperature": 1.0}}, short=True)
    'crowd model not validated against real workers (temperature = 2.0 (validated: 1.0))'
    >>> calibration_note({"validation": {"imdb": "MAE 6.6"}}, True, "sst2", "forward prediction")
    'validated vs real workers: imdb: MAE 6.6 (main study; not on sst2, forward prediction)'
    >>> calibration_note(None, short=True)
    'crowd model not validated against real workers'
    """
    validation = (sim or {}).get("validation")
    differs = calibration_differences(sim) if sim and validation else []
    if not validation or differs:
        why = f" ({'; '.join(differs)})" if differs else ""
        if short:
            return f"crowd model not validated against real workers{why}"
        if differs:
            return (
                f"{SIMULATED} crowd: these settings differ from the validated calibration"
                f"{why}, so its validation figures (docs/simulated-crowd.md) do not apply"
            )
        return f"{SIMULATED} crowd: this worker model was not validated against real workers"
    parts = "; ".join(f"{k}: {v}" for k, v in validation.items())
    outside = outside_validation(validation, dataset, study)
    if short:
        scope = f" (main study; not on {', '.join(outside)})" if outside else ""
        return f"validated vs real workers: {parts}{scope}"
    scope = (
        f". Those figures are for the main study on the datasets named; this run's "
        f"{' and '.join(outside)} {'was' if len(outside) == 1 else 'were'} not part of "
        "the validation, so they do not carry over to it"
        if outside
        else ""
    )
    read_by = f" (read by the {sim['reader_used']})" if sim and sim.get("reader_used") else ""
    return (
        f"{SIMULATED} crowd{read_by} validated against real workers "
        f"(docs/simulated-crowd.md): {parts}{scope}"
    )


def upstream_simulation(run_dirs: Iterable[str | Path]) -> dict[str, Any] | None:
    """The ``simulation`` node of the simulated crowd upstream of ``run_dirs`` (the
    nearest ``saleval-simulate`` ancestor: :func:`saleval.pipeline.records.run_record.ancestry`,
    however far up), for :func:`calibration_note`; None when no ancestor is a simulate run."""
    for d, record in ancestry(run_dirs):
        if record.stage == "simulate" and (d / "config.yaml").is_file():
            node = OmegaConf.select(OmegaConf.load(d / "config.yaml"), "simulation")
            container = OmegaConf.to_container(node) if node is not None else None
            if not isinstance(container, dict):
                return {}
            out = {str(k): v for k, v in container.items()}
            if (d / READER_FILE).is_file():
                out["reader_used"] = json.loads((d / READER_FILE).read_text())["reader_used"]
            return out
    return None


def published_ranking_agreement(score_dir: str | Path) -> dict[str, Any] | None:
    """Spearman's rho between a score run's method scores and the published crowd's on
    the same samples, over the methods both have; None when the run's dataset is not one
    of the published studies (``conf/dataset/lu2024_*.yaml``)."""
    score_dir = Path(score_dir)
    node = OmegaConf.select(OmegaConf.load(score_dir / "config.yaml"), "dataset")
    if node is None or str(node.get("_target_")) not in LU2024_READERS:
        return None
    dc = dataset_config(node)
    theirs = scoring.score(published_verdicts(dc), n_bootstrap=10, n_resamples=9).scores.set_index(
        "method"
    )
    ours = tables.SCORES.read(score_dir).set_index("method")
    common = [m for m in theirs.index if m in ours.index]
    if len(common) < 3:
        return {"methods": common, "spearman": None}
    rho = stats.spearmanr(ours.loc[common, "score"], theirs.loc[common, "score"]).statistic
    return {
        "methods": common,
        "spearman": float(rho),
        "simulated": {m: float(ours.loc[m, "score"]) for m in common},
        "published": {m: float(theirs.loc[m, "score"]) for m in common},
    }
