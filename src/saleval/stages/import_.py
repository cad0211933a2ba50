"""``saleval-import``: crowd answers → A[i, j, k] (docs/aggregation.md, docs/architecture.md).

Long answers::

    saleval-import inputs.tasks=<tasks run> inputs.answers=<answers.csv | run dir | runs:/id>

Published results of the original study::

    saleval-import crowd=lu2024 crowd.path=<data root>/published/lu2024/IMDB.csv dataset=imdb

Writes ``annotations.parquet`` (accepted answers that passed the quality filters),
``aggregated.csv``, ``rejects.csv``, ``filtered.csv`` (answers removed by a filter)
and ``import_report.json`` (hashes, counts, filters, agreement, expert check).
``inputs.answers`` may be a plain file: its path and sha256 become params and tags;
when it sits in a run dir, that run is recorded as the ``answers`` parent.

Main options: ``inputs.tasks``, ``inputs.answers``, ``crowd`` (answers, lu2024, or a
source of your own: docs/extending.md#a-crowd-source), ``crowd.filters.*`` (the quality
filters), ``crowd.aggregator``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.rows import CrowdImport, RejectedRows, reject_summary
from saleval.crowd.importing.source import ImportContext, crowd_source, source_run
from saleval.pipeline import tables
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.stage import Stage
from saleval.vocab import Population, Target

REPORT_FILE = tables.IMPORT_REPORT
FILTERED_FILE = "filtered.csv"


def tell_rejects(rejects: pd.DataFrame, policy: str, rejects_csv: Path) -> None:
    """Print the reject summary (:func:`saleval.crowd.importing.rows.reject_summary`) on stderr:
    every import with rejects ends with it, whatever the policy."""
    lines = reject_summary(rejects, str(policy), rejects_csv)
    if lines:
        print("[saleval-import] " + "\n".join(lines), file=sys.stderr, flush=True)


@contextmanager
def rejects_told(st: Stage, policy: str) -> Iterator[None]:
    """Under ``crowd.policy=strict`` a reject stops the import: its rejects still go to
    ``rejects.csv`` in the (failed) run dir and are summed up before the error is raised."""
    try:
        yield
    except RejectedRows as err:
        path = st.write(tables.REJECTS, err.rejects)
        tell_rejects(err.rejects, policy, path)
        raise


def study_record(st: Stage) -> dict[str, str]:
    """The study's target and population as the import report records them (from the
    run's provenance; a study that names neither is the main one: gold, correct)."""
    prov = st.provenance
    return {
        "target": str(prov.target or Target.gold),
        "population": str(prov.population or Population.correct),
    }


def write_outputs(st: Stage, result: CrowdImport, report: dict[str, Any]) -> dict[str, Any]:
    """Write the four outputs (+ ``filtered.csv`` for a source with filters) and log their
    counts."""
    simulated = bool(report["simulated"])
    st.write(tables.ANNOTATIONS, result.annotations)
    st.tracking.log_methods(list(dict.fromkeys(result.aggregated["method"].astype(str))))
    st.write(tables.AGGREGATED, result.aggregated)
    st.write(tables.REJECTS, result.rejects)
    if result.removed is not None:
        result.removed.to_csv(st.path(FILTERED_FILE), index=False)
        st.log_file(st.path(FILTERED_FILE))
    write_json(st.path(REPORT_FILE), report)
    st.log_file(st.path(REPORT_FILE))
    metrics: dict[str, float] = {
        k: float(report[k])
        for k in (
            "n_rows",
            "n_accepted",
            "n_rejected_rows",
            "n_annotations",
            "n_workers",
            "n_tasks",
            "tasks_without_answers",
        )
        if isinstance(report.get(k), int | float)
    }
    metrics["n_reject_entries"] = float(len(result.rejects))
    metrics["crowd_accuracy"] = float(result.aggregated["correct"].mean() * 100)
    for f in report.get("filters", []):
        metrics[f"filter_{f['name']}_workers"] = f["n_workers"]
        metrics[f"filter_{f['name']}_answers"] = f["n_answers"]
    alpha = (report.get("agreement") or {}).get("krippendorff_alpha")
    if alpha is not None:
        metrics["krippendorff_alpha"] = alpha
    expert = report.get("expert") or {}
    if expert.get("agreement") is not None:
        metrics["expert_agreement"] = expert["agreement"]
    st.log_metrics(metrics)
    return {
        "run_dir": str(st.run_dir),
        "run_id": st.tracking.run_id,
        "simulated": simulated,
        **metrics,
    }


def run(cfg: DictConfig) -> dict[str, Any]:
    """Any crowd source, the same way (docs/extending.md#a-crowd-source): locate its file and
    parent runs, import inside the run, write the outputs, then fail if nothing is left."""
    source = crowd_source(cfg.crowd)
    with source_run(cfg, "import", source) as (st, file):
        labels = [str(n) for n in cfg.dataset.label_names]
        ctx = ImportContext(file, dict(st.inputs), labels, str(cfg.dataset.name))
        with rejects_told(st, source.policy):
            result = source.import_(ctx)
        if result.simulated:
            st.provide(simulated=True)
        report = {
            "simulated": bool(st.provenance.simulated),
            **result.report,
            "dataset": str(cfg.dataset.name),
            "source": file.record,
            **result.inputs,
            "study": study_record(st),
        }
        out = write_outputs(st, result, report)
        tell_rejects(result.rejects, source.policy, st.path(tables.REJECTS.filename))
        if result.failure:  # the outputs above stay, to see where answers went
            raise CrowdImportError(result.failure)
        return out
