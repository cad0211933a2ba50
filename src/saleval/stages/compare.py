"""``saleval-compare``: human scores next to automated metrics, for one dataset (docs/metrics.md).

Reads a score run ``inputs.score`` (``scores.csv`` and the ``aggregated.csv`` it scored, found in
the run dir or its import parent) and a metrics run ``inputs.metrics`` (``metrics.csv``,
``metrics_per_example.parquet``, and through its explain parent the classifier's
predictions); either input may be several runs of disjoint methods (a list or a sweep
dir, merged: ``docs/sweeps.md``). Writes ``comparison.csv``, ``correlations.csv``, ``comparison.md``,
``rank_vs_rank.png``, ``ols.txt`` and ``instance_level.parquet``, in one MLflow
run tagged with every run of both chains (``link.<stage>``). A simulated crowd
anywhere upstream is said in the title, a ``simulated`` column and the run's tag.

Main options: ``inputs.score``, ``inputs.metrics``, ``compare.bootstrap.n``.

Example::

    saleval-compare inputs.score=latest inputs.metrics=latest
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis import comparison, comparison_report, scoring
from saleval.analysis.validation import calibration_note, upstream_simulation
from saleval.metrics.registry import import_plugins
from saleval.pipeline import tables
from saleval.pipeline.records import merge, run_naming
from saleval.pipeline.records.run_record import ancestry
from saleval.pipeline.stage import Stage
from saleval.vocab import PROBS

log = logging.getLogger(__name__)


def chain(run_dir: Path) -> dict[str, tuple[Path, str]]:
    """Every run upstream of ``run_dir`` (itself included), nearest first: stage name ->
    (run dir, MLflow run id), the nearest run of each stage
    (:func:`saleval.pipeline.records.run_record.ancestry`)."""
    out: dict[str, tuple[Path, str]] = {}
    for d, record in ancestry([run_dir]):
        out.setdefault(record.stage or d.name, (d, record.run_id or ""))
    return out


def find_table(spec: tables.TableSpec, runs: dict[str, tuple[Path, str]]) -> Path | None:
    """The first run of a chain (nearest first) that holds ``spec``'s file."""
    for d, _ in runs.values():
        if spec.path(d).is_file():
            return d
    return None


def classifier_outcomes(predictions: pd.DataFrame) -> pd.DataFrame:
    """sample_id, confidence = p(ŷ|x) (the largest class probability), correct = ŷ == y."""
    prob = PROBS.of(predictions.columns)
    if not prob:
        raise ValueError(f"predictions.parquet has no {PROBS.pattern} columns")
    return pd.DataFrame(
        {
            "sample_id": predictions["sample_id"].astype(str),
            "confidence": predictions[prob].max(axis=1).astype(float),
            "correct": (predictions["pred"] == predictions["label"]).astype(int),
        }
    )


def human_score_fn(A: np.ndarray) -> np.ndarray:
    """s_j in percent from A[..., i, j, k], exactly as saleval-score computes it."""
    return 100 * scoring.method_scores(np.nan_to_num(scoring.accuracy(A)))


def correlation_metrics(corr: pd.DataFrame) -> dict[str, float]:
    """The compare run's own metrics, one per metric column and statistic:
    ``spearman_<metric>``, ``kendall_<metric>`` (method level: human ranks vs the
    metric's) and ``instance_spearman_<metric>`` (instance level)."""
    out = {}
    for r in corr.itertuples():
        if pd.notna(r.value) and r.statistic in ("spearman", "kendall"):
            level = "" if r.level == "method" else "instance_"
            out[f"{level}{r.statistic}_{run_naming.metric_at_k(str(r.metric))}"] = float(r.value)
    return out


def method_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One row per method, as its child run logs it: ``human_score``, ``human_rank`` and
    each metric column and its rank under the metrics stage's keys
    (``comprehensiveness_k10``, ``comprehensiveness_k10_rank``)."""

    def key(col: str) -> str:
        if col.endswith("_rank") and col not in ("human_rank",):
            return run_naming.metric_at_k(col.removesuffix("_rank")) + "_rank"
        return run_naming.metric_at_k(col)

    rows = table.drop(columns=["simulated"], errors="ignore")
    return rows.rename(columns={c: key(c) for c in rows.columns if c != "method"})


def chain_tags(st: Stage, chains: list[dict[str, tuple[Path, str]]]) -> dict[str, str]:
    """The run's tags naming both chains: ``link.<stage>`` (every run of that stage in
    them), ``human_run`` (the score runs) and ``automated_run`` (the metrics runs)."""
    ids: dict[str, list[str]] = {}
    for runs in chains:
        for stage, (_, run_id) in runs.items():
            ids.setdefault(stage, []).append(run_id)
    links = {f"link.{stage}": ",".join(dict.fromkeys(v)) for stage, v in ids.items()}
    automated = [record.run_id or "" for _, record, _ in st.inputs.runs_of("metrics")]
    return {"human_run": links.get("link.score", ""), "automated_run": ",".join(automated), **links}


def run(cfg: DictConfig) -> dict[str, Any]:
    # both chains must be about one dataset (and one model, where both name one): the
    # provenance rule fails naming both runs otherwise
    inputs = {"score": cfg.inputs.score, "metrics": cfg.inputs.metrics}
    inherits = ("dataset", "model", "target", "population")
    with Stage(cfg, "compare", inputs, inherits=inherits, requires=["dataset"]) as st:
        score_dirs, metrics_dirs = st.inputs.input_runs["score"], st.inputs.input_runs["metrics"]
        # the metrics runs' own metrics modules, so their directions are known here too
        for _, _, mcfg in st.inputs.runs_of("metrics"):
            plugins = OmegaConf.select(mcfg, "metrics.plugins", default=None)
            import_plugins(list(plugins or []))
        human_chains = [chain(d) for d in score_dirs]
        auto_chains = [chain(d) for d in metrics_dirs]
        dataset = str(st.provenance.dataset)
        simulated = st.provenance.simulated
        st.tracking.set_tags(chain_tags(st, human_chains + auto_chains))
        ccfg = cfg.compare
        scores = st.inputs.read(tables.SCORES, "score")  # merged when several runs are given
        human = scores.set_index(scores["method"].astype(str))["score"].astype(float)
        metrics = st.inputs.read(tables.METRICS, "metrics")
        per_example = st.inputs.read(tables.METRICS_PER_EXAMPLE, "metrics")
        agg_dirs = [find_table(tables.AGGREGATED, runs) for runs in human_chains]
        aggregated = cube = None
        if all(d is not None for d in agg_dirs):
            found = [d for d in agg_dirs if d is not None]
            aggregated = merge.read_merged(tables.AGGREGATED, found, "inputs.score")
            cube = scoring.Cube.from_aggregated(aggregated)
        else:
            log.warning("no aggregated.csv upstream of %s: no CIs, no instance level", score_dirs)
        explain_dirs = list(dict.fromkeys(c["explain"][0] for c in auto_chains if "explain" in c))
        predictions = None
        if explain_dirs and all(tables.PREDICTIONS.path(d).is_file() for d in explain_dirs):
            merged = merge.read_merged(tables.PREDICTIONS, explain_dirs, "inputs.metrics")
            predictions = classifier_outcomes(merged)
        cols = ccfg.columns
        if not isinstance(cols, str):
            cols = [str(c) for c in cols]
        result = comparison.compare(
            human,
            metrics,
            per_example,
            aggregated=aggregated,
            human_A=None if cube is None else cube.A,
            human_samples=None if cube is None else cube.samples,
            human_methods=None if cube is None else cube.methods,
            human_score_fn=human_score_fn,
            predictions=predictions,
            columns=cols,
            n_boot=int(ccfg.bootstrap.n),
            level=float(ccfg.bootstrap.level),
            seed=int(cfg.seed),
        )
        table = result.comparison.assign(simulated=simulated)
        corr = result.correlations.assign(simulated=simulated)
        st.write(tables.COMPARISON, table)
        st.write(tables.CORRELATIONS, corr)
        prefix = "SIMULATED crowd — " if simulated else ""
        title = f"{prefix}Human vs automated evaluation of saliency methods: {dataset}"
        notes = list(result.notes)
        if simulated:
            sim = upstream_simulation(score_dirs)
            how = "" if sim is None else " " + calibration_note(sim, False, dataset) + "."
            notes.insert(0, f"The human side comes from a SIMULATED crowd, not from people.{how}")
        missing = sorted(set(human.index) ^ set(metrics["method"].astype(str)))
        if missing:
            notes.append(f"Methods on one side only (left out): {', '.join(missing)}.")
        md = comparison_report.markdown_report(table, corr, result.columns, title, notes)
        st.path("comparison.md").write_text(md)
        comparison_report.plot_rank_vs_rank(
            table, result.columns, corr, st.path("rank_vs_rank.png"), title
        )
        outputs = ["comparison.md", "rank_vs_rank.png"]
        if result.ols_text:
            st.path("ols.txt").write_text(result.ols_text)
            outputs.append("ols.txt")
        if result.instance is not None:
            result.instance.to_parquet(st.path("instance_level.parquet"), index=False)
            outputs.append("instance_level.parquet")
        for name in outputs:
            st.log_file(st.path(name))
        st.log_metrics(correlation_metrics(corr))
        st.tracking.log_method_rows(method_rows(table), table="comparison")
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            "simulated": simulated,
            "columns": result.columns,
            "markdown": md,
        }
