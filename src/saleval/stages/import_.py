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

Main options: ``inputs.tasks``, ``inputs.answers``, ``crowd`` (answers, lu2024),
``crowd.filters.*`` (the quality filters), ``crowd.aggregator``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval import tables, tracking
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importer import AnswersSource, PublishedSource, crowd_source
from saleval.crowd.long_format import ANSWER_FILE
from saleval.crowd.reading import CrowdImport, RejectedRows, reject_summary, sha256_file
from saleval.jsonfiles import write_json
from saleval.stage import (
    LATEST,
    RUN_JSON,
    InputError,
    Stage,
    given_input,
    hydra_main,
    resolve_input,
)
from saleval.vocab import Population, Target

REPORT_FILE = tables.IMPORT_REPORT
FILTERED_FILE = "filtered.csv"


def answers_source(spec: str, output_root: str | None = None) -> tuple[Path, str | None]:
    """``inputs.answers`` → (the answers file, a run dir to record as parent or None)."""
    if spec.startswith("runs:/") or spec == LATEST:
        run_dir = resolve_input("answers", spec, output_root)
        return run_dir / ANSWER_FILE, str(run_dir)
    path = Path(spec).expanduser().resolve()
    if path.is_dir():
        return path / ANSWER_FILE, str(path) if (path / RUN_JSON).is_file() else None
    if path.is_file():
        in_run = path.name == ANSWER_FILE and (path.parent / RUN_JSON).is_file()
        return path, str(path.parent) if in_run else None
    raise InputError(f"inputs.answers={spec}: no such file or directory")


def nothing_left(path: Path, report: dict[str, Any]) -> str:
    """Why an import kept no answer, counted by reason, and what to do about it."""
    rejected = ", ".join(f"{k}: {v}" for k, v in (report.get("rejects_by_field") or {}).items())
    filtered = ", ".join(
        f"{f['name']}: {f['n_answers']} answers of {f['n_workers']} workers"
        for f in report.get("filters", [])
        if f.get("n_answers")
    )
    return (
        f"{path}: no answer is left to score. {report.get('n_rows', '?')} rows read; "
        f"rejected {report.get('n_rejected_rows', 0)} ({rejected or 'none'}); removed by "
        f"filters: {filtered or 'none'}. See rejects.csv and filtered.csv in the run dir; fix "
        "the file, or loosen crowd.filters.* (null disables a filter)"
    )


def tell_rejects(rejects: pd.DataFrame, policy: str, rejects_csv: Path) -> None:
    """Print the reject summary (:func:`saleval.crowd.reading.reject_summary`) on stderr:
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


def write_outputs(st: Stage, result: CrowdImport, simulated: bool) -> dict[str, Any]:
    """Write the four outputs (+ filtered.csv) and log their counts."""
    report = {"simulated": simulated, **result.report}
    st.write(tables.ANNOTATIONS, result.annotations)
    st.log_methods(list(dict.fromkeys(result.aggregated["method"].astype(str))))
    st.write(tables.AGGREGATED, result.aggregated)
    st.write(tables.REJECTS, result.rejects)
    if len(result.removed) or result.report.get("format") == "answers":
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
    return {"run_dir": str(st.run_dir), "run_id": st.run_id, "simulated": simulated, **metrics}


def run(cfg: DictConfig) -> dict[str, Any]:
    source = crowd_source(cfg.crowd)
    if isinstance(source, PublishedSource):
        return _run_published(cfg, source)
    return _run_answers(cfg, source)


def _run_answers(cfg: DictConfig, source: AnswersSource) -> dict[str, Any]:
    tasks_spec, answers_spec = given_input(cfg, "tasks"), given_input(cfg, "answers")
    if tasks_spec is None or answers_spec is None:
        raise InputError(
            "saleval-import needs inputs.tasks=<tasks run> and inputs.answers=<answers.csv or "
            "run dir> (or crowd=lu2024 crowd.path=<published file> dataset=<name>)"
        )
    output_root = OmegaConf.select(cfg, "paths.output_root", default=None)
    answers_file, answers_run = answers_source(answers_spec, output_root)
    digest = sha256_file(answers_file) if answers_file.is_file() else ""
    inputs = {"tasks": tasks_spec, **({"answers": answers_run} if answers_run else {})}
    tags = {"answers_path": str(answers_file), "answers_sha256": digest}
    # dataset, study target and population come from the task run (and a simulate run)
    with Stage(cfg, "import", inputs=inputs, tags=tags, requires=["dataset"]) as st:
        tasks_dir = st.inputs["tasks"]
        label_names = [str(n) for n in cfg.dataset.label_names]
        tracking.log_params({"source.path": str(answers_file), "source.sha256": digest})
        tasks = tables.TASKS.read(tasks_dir)
        bundles_path = tables.BUNDLES.path(tasks_dir)
        bundles = tables.BUNDLES.read(tasks_dir) if bundles_path.is_file() else None
        expert_path = source.expert.path
        expert = pd.read_csv(expert_path, dtype=str, keep_default_na=False) if expert_path else None
        with rejects_told(st, source.policy):
            result = source.import_(answers_file, tasks, bundles, label_names, expert=expert)
        if result.report.pop("simulated_column", False):
            st.provide(simulated=True)
        result.report.update(
            dataset=str(cfg.dataset.name),
            source={"path": str(answers_file), "sha256": digest},
            tasks={
                "path": str(tables.TASKS.path(tasks_dir)),
                "sha256": sha256_file(tables.TASKS.path(tasks_dir)),
            },
            study=study_record(st),
        )
        out = write_outputs(st, result, st.provenance.simulated)
        tell_rejects(result.rejects, source.policy, st.path(tables.REJECTS.filename))
        if not len(result.annotations):  # the outputs above stay, to see where answers went
            raise CrowdImportError(nothing_left(answers_file, result.report))
        return out


def _run_published(cfg: DictConfig, source: PublishedSource) -> dict[str, Any]:
    path = source.file(OmegaConf.select(cfg, "dataset.name", default=None))
    digest = sha256_file(path)
    with Stage(cfg, "import", tags={"source_path": str(path), "source_sha256": digest}) as st:
        # the published study: workers named the gold label of correctly classified samples
        st.provide(target=Target.gold, population=Population.correct)
        tracking.log_params({"source.path": str(path), "source.sha256": digest})
        dataset = cfg.dataset
        with rejects_told(st, source.policy):
            result = source.import_(path, list(dataset.label_names), str(dataset.name))
        result.report.update(
            dataset=str(dataset.name),
            source={"path": str(path), "sha256": digest},
            study=study_record(st),
        )
        out = write_outputs(st, result, simulated=False)
        tell_rejects(result.rejects, source.policy, st.path(tables.REJECTS.filename))
        return out


main = hydra_main("import", run)
