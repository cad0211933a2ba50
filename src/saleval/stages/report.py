"""``saleval-report``: many score, metrics and compare runs gathered into one table.

Takes ``inputs.runs`` (run dirs, ``runs:/<id>``, ``-m`` sweep dirs, ``saleval-run`` dirs,
or a list of them) and/or an MLflow search (``search.experiments`` and a filter string,
through ``MlflowClient.search_runs``), and gathers every score, metrics and compare run
they name, across datasets, models and variants, into one table: a row per dataset ×
model × variant × method with the human score and each automated metric, each ranked
within its dataset and model (``report.rank_within``), and the Spearman/Kendall
agreement of each metric's ranking with the human one per dataset and model
(:func:`saleval.analysis.comparison.rank_agreement`; the gathering is
:mod:`saleval.analysis.gathering`, the table and its views :mod:`saleval.analysis.cross_run`). A variant is what a run's sweep overrides
say beyond the dataset and model (``docs/sweeps.md``).

Reads the runs' tables (``comparison.csv``, ``scores.csv``, ``metrics.csv``), never their
MLflow metric keys. Writes ``report.csv``, ``report_correlations.csv``,
``report_runs.csv``, ``report.md``, ``rank_heatmap.png`` and ``correlation_heatmap.png``.

Main options: ``inputs.runs``, ``search.experiments``, ``search.filter``,
``report.rank_within``.

Example::

    saleval-report inputs.runs=outputs/run/multirun/<date_time>
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.analysis.cross_run import (
    markdown,
    plot_correlation_heatmap,
    plot_rank_heatmap,
    rank_correlations,
    report_table,
)
from saleval.analysis.gathering import (
    dirs_of,
    gather,
    search_dirs,
    sources_of,
    variants,
)
from saleval.pipeline import tables
from saleval.pipeline.records import run_naming
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.run_record import ALLOW_UNFINISHED, RunRecord
from saleval.pipeline.stage import Stage

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    rcfg, scfg = cfg.report, cfg.search
    runs = OmegaConf.select(cfg, "inputs.runs", default=None)
    experiments = [str(e) for e in (scfg.experiments or [])]
    if runs is None and not experiments:
        raise InputError(
            "saleval-report needs runs: inputs.runs=<run, sweep or saleval-run dir, or a list> "
            "and/or search.experiments=[<MLflow experiment>] (with search.filter)"
        )
    rank_within = [str(k) for k in rcfg.rank_within]
    bad = sorted(set(rank_within) - {"dataset", "model", "variant"})
    if bad or "dataset" not in rank_within:
        raise ValueError(
            f"report.rank_within={rank_within}: must hold dataset, and only dataset, model, variant"
        )
    columns: str | list[str] = (
        rcfg.columns if isinstance(rcfg.columns, str) else [str(c) for c in rcfg.columns]
    )
    root = paths.output_root(cfg)
    allow = bool(OmegaConf.select(cfg, ALLOW_UNFINISHED, default=False))
    # runs that did not finish are refused before the report's run starts, unless allowed
    dirs = [] if runs is None else dirs_of(runs, root, allow)
    unfinished = tuple(mark for d in dirs if (mark := RunRecord.read(d).unfinished_mark(d)))
    with Stage(cfg, "report") as st:
        if unfinished:  # allow_unfinished_inputs=true: this run's provenance says so
            st.provide(unfinished=unfinished)
        if experiments:
            dirs += search_dirs(experiments, str(scfg.filter or ""), int(scfg.max_results), root)
        sources = sources_of(dirs)
        long = gather(sources, columns)
        table, metric_cols = report_table(long, rank_within)
        corr = rank_correlations(table, metric_cols, rank_within)
        labels = variants(sources)
        listing = pd.DataFrame(
            {
                "run_dir": [str(s.run_dir) for s in sources],
                "stage": [s.stage for s in sources],
                "run_id": [s.run_id for s in sources],
                "dataset": [s.dataset for s in sources],
                "model": [s.model for s in sources],
                "variant": [labels[s.run_dir] for s in sources],
                "simulated": [s.simulated for s in sources],
            }
        )
        st.write(tables.REPORT_RUNS, listing)
        st.write(tables.REPORT, table)
        st.write(tables.REPORT_CORRELATIONS, corr)
        st.path("report.md").write_text(markdown(table, corr, metric_cols, rank_within))
        plot_rank_heatmap(table, metric_cols, rank_within, st.path("rank_heatmap.png"))
        figures = ["report.md", "rank_heatmap.png"]
        if len(corr):
            plot_correlation_heatmap(
                corr, metric_cols, rank_within, st.path("correlation_heatmap.png")
            )
            figures.append("correlation_heatmap.png")
        for name in figures:
            st.log_file(st.path(name))
        st.tracking.set_tags(
            {
                "datasets": ",".join(sorted(set(table["dataset"]))),
                "models": ",".join(sorted(set(table["model"]))),
                "n_runs": str(len(sources)),
            }
        )
        logged = {
            run_naming.metric_key(f"{r.statistic}_{r.dataset}_{r.model}_{r.metric}"): float(r.value)
            for r in corr.itertuples()
            if pd.notna(r.value) and not r.variant
        }
        st.log_metrics({"n_runs": len(sources), "n_rows": len(table), **logged})
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            "n_runs": len(sources),
            "columns": metric_cols,
        }
