"""``saleval-compare``: human scores next to automated metrics, for one dataset (SPEC §7).

Reads a score run ``inputs.score`` (``scores.csv`` and the ``aggregated.csv`` it scored, found in
the run dir or its import parent) and a metrics run ``inputs.metrics`` (``metrics.csv``,
``metrics_per_example.parquet``, and through its explain parent the classifier's
predictions). Writes ``comparison.csv``, ``correlations.csv``, ``comparison.md``,
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

from saleval import scoring, tables
from saleval.metrics_registry import import_plugins
from saleval.stage import Stage, hydra_main, read_run_info

log = logging.getLogger(__name__)


def ancestry(run_dir: Path) -> dict[str, Path]:
    """Every run upstream of ``run_dir`` (itself included), by stage name."""
    out: dict[str, Path] = {}
    todo = [Path(run_dir)]
    while todo:
        d = todo.pop()
        if not (d / "run.json").is_file():
            continue
        info = read_run_info(d)
        stage = str(info.get("stage", d.name))
        if stage in out:
            continue
        out[stage] = d
        todo += [Path(p) for p in (info.get("parent_dirs") or {}).values() if Path(p).is_dir()]
    return out


def find_table(spec: tables.TableSpec, runs: dict[str, Path]) -> Path | None:
    """The first run of a chain (nearest first) that holds ``spec``'s file."""
    for d in runs.values():
        if spec.path(d).is_file():
            return d
    return None


def classifier_outcomes(predictions: pd.DataFrame) -> pd.DataFrame:
    """sample_id, confidence = p(ŷ|x) (the largest class probability), correct = ŷ == y."""
    prob = [c for c in predictions.columns if c.startswith("prob_")]
    if not prob:
        raise ValueError("predictions.parquet has no prob_<label> columns")
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


def run(cfg: DictConfig) -> dict[str, Any]:
    # torch and transformers (the metrics' registry) load when a run starts (saleval.cli)
    from saleval import comparison

    # both chains must be about one dataset (and one model, where both name one): the
    # provenance rule fails naming both runs otherwise
    inputs = {"score": cfg.inputs.score, "metrics": cfg.inputs.metrics}
    inherits = ("dataset", "model", "target", "population")
    with Stage(cfg, "compare", inputs, inherits=inherits, requires=["dataset"]) as st:
        score_dir, metrics_dir = st.inputs["score"], st.inputs["metrics"]
        # the metrics run's own metrics modules, so their directions are known here too
        plugins = OmegaConf.select(st.parent_configs["metrics"], "metrics.plugins", default=None)
        import_plugins(list(plugins or []))
        human_runs, auto_runs = ancestry(score_dir), ancestry(metrics_dir)
        dataset = str(st.provenance.dataset)
        simulated = st.provenance.simulated
        links = {
            f"link.{stage}": str(read_run_info(d).get("run_id", ""))
            for stage, d in {**auto_runs, **human_runs}.items()
        }
        st.set_tags(
            {
                "human_run": links.get("link.score", ""),
                "automated_run": str(st.parents["metrics"].get("run_id", "")),
                **links,
            }
        )
        ccfg = cfg.compare
        scores = tables.SCORES.read(score_dir)
        human = scores.set_index(scores["method"].astype(str))["score"].astype(float)
        metrics = tables.METRICS.read(metrics_dir)
        per_example = tables.METRICS_PER_EXAMPLE.read(metrics_dir)
        agg_dir = find_table(tables.AGGREGATED, human_runs)
        aggregated = cube = None
        if agg_dir is not None:
            aggregated = tables.AGGREGATED.read(agg_dir)
            cube = scoring.Cube.from_aggregated(aggregated)
        else:
            log.warning("no aggregated.csv upstream of %s: no CIs, no instance level", score_dir)
        explain_dir = auto_runs.get("explain")
        predictions = None
        if explain_dir is not None and tables.PREDICTIONS.path(explain_dir).is_file():
            predictions = classifier_outcomes(tables.PREDICTIONS.read(explain_dir))
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
            notes.insert(0, "The human side comes from a SIMULATED crowd, not from people.")
        missing = sorted(set(human.index) ^ set(metrics["method"].astype(str)))
        if missing:
            notes.append(f"Methods on one side only (left out): {', '.join(missing)}.")
        md = comparison.markdown_report(table, corr, result.columns, title, notes)
        st.path("comparison.md").write_text(md)
        comparison.plot_rank_vs_rank(
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
        logged = {}
        for r in corr.itertuples():
            if pd.notna(r.value) and r.statistic in ("spearman", "kendall"):
                level = "" if r.level == "method" else "instance_"
                logged[f"{level}{r.statistic}/{r.metric}"] = r.value
        st.log_metrics(logged)
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.run_id,
            "simulated": simulated,
            "columns": result.columns,
            "markdown": md,
        }


main = hydra_main("compare", run)
