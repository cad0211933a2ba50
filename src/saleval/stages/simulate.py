"""``saleval-simulate``: a SIMULATED crowd answers a task run's bundles
(docs/study-design.md#simulated-crowd, docs/architecture.md).

Reads ``tasks.csv`` and ``bundles.csv`` of ``inputs.tasks``; writes ``answers.csv``
(the import format, ``simulated=true`` on every row), ``workers.csv`` (who was a
spammer, each worker's noise rate) and ``SIMULATED.md``. The MLflow run is tagged
``simulated=true``; ``run.json`` carries it so every child run inherits it.

With ``crowd=lu2024 crowd.path=<published file>`` the tasks are the original study's
own (the texts its workers saw, :mod:`saleval.crowd.importing.published_study`): the run also writes
``tasks.csv``, ``bundles.csv`` and the simulated crowd's ``aggregated.csv`` (the
import stage's filters and aggregation), and ``action=validate`` compares it with the
published verdicts (:mod:`saleval.analysis.validation`): ``validation.csv``,
``validation.json``, ``validation.png``, all logged to MLflow.

Main options: ``inputs.tasks``, ``simulation`` (default, ideal, noisy), ``crowd`` (lu2024 with
``crowd.path``), ``action`` (simulate, validate), ``seed``.

Example::

    saleval-simulate inputs.tasks=latest simulation=noisy
    saleval-simulate crowd=lu2024 crowd.path=../shared/data/published/lu2024/IMDB.csv dataset=imdb action=validate
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis.reports import SIMULATED
from saleval.analysis.validation import (
    READER_FILE,
    VALIDATION_FILE,
    VALIDATION_JSON,
    VALIDATION_PLOT,
    bias_table,
    calibration_note,
    compare_crowds,
    plot_validation,
)
from saleval.config.crowd import SimulationConfig
from saleval.config.stages import SimulateAction
from saleval.crowd.importing.builtin import aggregate_answers
from saleval.crowd.importing.published_study import reader_training_data, study_bundles
from saleval.crowd.importing.source import (
    Capability,
    CrowdSource,
    ImportContext,
    crowd_source,
    source_run,
)
from saleval.crowd.simulation.workers import SimulatedCrowd, read_tasks, simulate_crowd
from saleval.modeling.data import load_dataset
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.records.run_inputs import given_input
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking
from saleval.schema import to_schema

NOTICE = """# SIMULATED

The answers in this run were produced by simulated workers (`saleval-simulate`), not by
people. A reading model ({reader}) trained on {trained_on} of `{dataset}` stands in for
reading; workers lapse at their own noise rate, answer "I don't know" when unsure, and
{n_spam} of {n_workers} are spammers (see `workers.csv`). Use them to test the pipeline,
never as evidence about how people judge explanations.
{calibration}"""


def _write_notice(
    st: Stage, cfg: DictConfig, sim: SimulationConfig, crowd: SimulatedCrowd, trained_on: str
) -> None:
    st.path("SIMULATED.md").write_text(
        NOTICE.format(
            reader=crowd.reader,
            trained_on=trained_on,
            dataset=cfg.dataset.name,
            n_spam=int(crowd.summary["sim_n_spammers"]),
            n_workers=int(crowd.summary["sim_n_workers"]),
            calibration=calibration_note(dataclasses.asdict(sim), dataset=cfg.dataset.name),
        )
    )
    tracking.log_params({"simulation.reader_used": crowd.reader})
    write_json(st.path(READER_FILE), {"reader_used": crowd.reader})  # for later notices
    st.log_file(st.path(READER_FILE))
    crowd.workers.to_csv(st.path("workers.csv"), index=False)
    st.log_file(st.path("workers.csv"))
    st.log_file(st.path("SIMULATED.md"))


def run(cfg: DictConfig) -> dict[str, Any]:
    crowd_node = OmegaConf.select(cfg, "crowd")
    source = None if crowd_node is None else crowd_source(crowd_node)
    action = SimulateAction(str(OmegaConf.select(cfg, "action", default="simulate")))
    if source is not None and source.provides(Capability.tasks):
        return run_on_source_tasks(cfg, source, action)
    if source is not None:
        raise InputError(
            f"saleval-simulate takes inputs.tasks=<task run> or crowd=lu2024; crowd={source.name} "
            "is a source of real answers"
        )
    if action == SimulateAction.validate:
        raise InputError(
            "action=validate compares with the published real crowd: give crowd=lu2024 "
            "crowd.path=<data root>/published/lu2024/<IMDB|AGNEWS>.csv dataset=<imdb|ag_news>"
        )
    spec = given_input(cfg, "tasks")
    if spec is None:
        raise InputError(
            "saleval-simulate needs inputs.tasks=<task run dir or runs:/id> "
            "(or crowd=lu2024 crowd.path=<published file> dataset=<name>)"
        )
    with Stage(cfg, "simulate", {"tasks": spec}, requires=["dataset"], simulated=True) as st:
        task_dir = st.inputs["tasks"]
        tasks = tables.TASKS.read(task_dir)
        bundles = tables.BUNDLES.read(task_dir)
        st.tracking.log_methods(list(dict.fromkeys(tasks["method"].astype(str))))
        sim = to_schema(SimulationConfig, cfg.simulation)
        data = load_dataset(cfg.dataset)
        labels = [str(n) for n in cfg.dataset.label_names]
        split = str(sim.reader.get("split", "train"))
        crowd = simulate_crowd(tasks, bundles, data[split], labels, sim)
        st.write(tables.ANSWERS, crowd.answers)
        _write_notice(st, cfg, sim, crowd, f"the `{split}` split")
        st.log_metrics(crowd.summary)
        return {"run_dir": str(st.run_dir), "run_id": st.tracking.run_id, **crowd.summary}


def run_on_source_tasks(
    cfg: DictConfig, source: CrowdSource, action: SimulateAction
) -> dict[str, Any]:
    """The tasks a crowd answered (the published study's) answered by the simulated
    crowd, and (``validate``) compared with that crowd's verdicts."""
    with source_run(cfg, "simulate", source, simulated=True) as (st, file):
        sim = to_schema(SimulationConfig, cfg.simulation)
        labels = [str(n) for n in cfg.dataset.label_names]
        dataset = str(cfg.dataset.name)
        study = source.tasks(ImportContext(file, dict(st.inputs), labels, dataset))
        if len(study.rejects):
            st.write(tables.REJECTS, study.rejects)
        splits = [str(s) for s in cfg.published.reader_splits]
        train, n_excluded = reader_training_data(
            load_dataset(cfg.dataset), splits, study.samples["text"]
        )
        bundles = study_bundles(
            study, int(cfg.published.repeats), int(cfg.published.bundle_size), int(sim.seed)
        )
        read = read_tasks(study.tasks, train, labels, sim)
        n_crowds = int(cfg.published.replicates) if action == SimulateAction.validate else 1
        crowds: list[pd.DataFrame] = []
        for r in range(max(1, n_crowds)):
            sim_r = dataclasses.replace(sim, seed=int(sim.seed) + r)
            crowd_r = simulate_crowd(study.tasks, bundles, train, labels, sim_r, read=read)
            answers_path = st.path(f"answers_{r}.csv")
            tables.ANSWERS.validate(crowd_r.answers, where="simulate").to_csv(
                answers_path, index=False
            )
            imported = aggregate_answers(answers_path, study.tasks, bundles, labels)
            crowds.append(imported.aggregated)
            if r == 0:
                crowd = crowd_r
                aggregated = imported.aggregated
            answers_path.unlink()
        st.write(tables.TASKS, study.tasks)
        st.write(tables.BUNDLES, bundles)
        st.write(tables.ANSWERS, crowd.answers)
        st.write(tables.AGGREGATED, aggregated)
        trained_on = f"the {', '.join(splits)} splits (the study's samples removed)"
        _write_notice(st, cfg, sim, crowd, trained_on)
        summary: dict[str, Any] = {
            **crowd.summary,
            "reader_excluded_study_texts": n_excluded,
            "n_tasks": len(study.tasks),
            "n_samples": len(study.samples),
        }
        st.log_metrics(summary)
        out: dict[str, Any] = {"run_dir": str(st.run_dir), "run_id": st.tracking.run_id, **summary}
        if action == SimulateAction.validate:
            out["validation"] = _validate(st, study.aggregated, crowds, dataset, sim, crowd.reader)
        return out


def _validate(
    st: Stage,
    real: pd.DataFrame,
    simulated: list[pd.DataFrame],
    dataset: str,
    sim: SimulationConfig,
    reader: str,
) -> dict[str, Any]:
    v = compare_crowds(real, simulated)
    v.table.to_csv(st.path(VALIDATION_FILE), index=False)
    v.methods.to_csv(st.path("validation_methods.csv"), index=False)
    report = {
        "dataset": dataset,
        "simulated": True,
        "simulation": sim.name,
        "reader": sim.reader,
        "reader_used": reader,
        "calibration_in_use": dict(sim.validation or {}),
        **v.summary,
        "methods": v.methods.to_dict(orient="records"),
    }
    Path(st.path(VALIDATION_JSON)).write_text(json.dumps(report, indent=2, default=_jsonable))
    s = v.summary
    note = (
        f"cell MAE {s['mae_cell']:.1f} pts, curve gap ≤ {s['curve_max_gap']:.1f} pts, "
        f"Spearman {s['score_spearman'] if s['score_spearman'] is None else round(s['score_spearman'], 2)}"
    )
    plot_validation(v.table, st.path(VALIDATION_PLOT), dataset, note)
    print(f"[saleval-simulate] {SIMULATED} vs the published crowd on {dataset} ({reader}): {note}")
    print(bias_table(v))
    shipped = (sim.validation or {}).get(dataset)
    if shipped:
        print(f"the shipped figures for {dataset}, in and out of sample: {shipped}")
    for name in (VALIDATION_FILE, "validation_methods.csv", VALIDATION_JSON, VALIDATION_PLOT):
        st.log_file(st.path(name))
    metrics = {
        f"validation/{k}": float(val)
        for k, val in s.items()
        if isinstance(val, int | float) and not isinstance(val, bool)
    }
    metrics.update(
        {f"validation/curve_real/k{k}": c["real"] for k, c in s["curve"].items()}
        | {f"validation/curve_simulated/k{k}": c["simulated"] for k, c in s["curve"].items()}
    )
    for r in v.table.itertuples():
        metrics[f"validation/real/{r.method}/k{r.k}"] = float(r.real)
        metrics[f"validation/simulated/{r.method}/k{r.k}"] = float(r.simulated)
    st.log_metrics(metrics)
    return s


def _jsonable(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else str(x)
