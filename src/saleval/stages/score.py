"""``saleval-score``: accuracy, scores, ranks, CIs, flips, tables and plots (docs/scores.md,
docs/architecture.md).

From an import run::

    saleval-score inputs.crowd=<import run dir | runs:/id>

Straight from the published results of the original study::

    saleval-score crowd=lu2024 crowd.path=<data root>/published/lu2024/IMDB.csv dataset=imdb

Writes ``accuracy.csv``, ``scores.csv``, ``flips.csv``, ``flip_histogram.csv``,
``scores.md``, ``scores.tex``, ``accuracy_vs_k.png``, ``flip_histogram.png``,
``score_report.json`` and a copy of the scored ``aggregated.csv`` (and the import's
``annotations.parquet``) so a score run is self-contained for the comparison stage;
misclassified studies add ``counts.csv``, forward-prediction studies ``outcomes.csv``.

Main options: ``inputs.crowd``, ``crowd=lu2024`` with ``crowd.path`` and ``dataset``,
``scoring.bootstrap.n``, ``scoring.test_resamples``, ``scoring.baseline``.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis import reports, scoring
from saleval.analysis.validation import calibration_note, upstream_simulation
from saleval.crowd.importing.source import (
    Capability,
    ImportContext,
    crowd_source,
    source_run,
)
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.records.run_inputs import given_input
from saleval.pipeline.stage import Stage
from saleval.vocab import Population, Target

COUNTS_FILE = "counts.csv"
OUTCOMES_FILE = "outcomes.csv"


def run(cfg: DictConfig) -> dict[str, Any]:
    crowd = OmegaConf.select(cfg, "crowd")
    source = None if crowd is None else crowd_source(crowd)
    if source is not None and source.provides(Capability.verdicts):
        with source_run(cfg, "score", source) as (st, file):
            labels = [str(n) for n in cfg.dataset.label_names]
            ctx = ImportContext(file, dict(st.inputs), labels, str(cfg.dataset.name))
            imported = source.import_(ctx)  # the crowd's verdicts as they are
            if len(imported.rejects):
                st.write(tables.REJECTS, imported.rejects)
            info: dict[str, Any] = {"source": {**file.record, "format": source.format}}
            return score_outputs(st, cfg, imported.aggregated, info)
    if source is not None:
        raise InputError(
            f"saleval-score takes inputs.crowd=<import run> or crowd=lu2024; crowd={source.name} "
            "answers must go through saleval-import first"
        )
    spec = given_input(cfg, "crowd")
    if spec is None:
        raise InputError(
            "saleval-score needs inputs.crowd=<import run dir or runs:/id> "
            "(or crowd=lu2024 crowd.path=<published file> dataset=<name>)"
        )
    with Stage(cfg, "score", inputs={"crowd": spec}, requires=["dataset"]) as st:
        crowd_dir = st.inputs["crowd"]
        report_path = crowd_dir / tables.IMPORT_REPORT
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        annotations = tables.ANNOTATIONS.path(crowd_dir)
        if annotations.is_file():
            shutil.copy2(annotations, st.path(annotations.name))
            st.log_file(st.path(annotations.name))
        info = {
            "source": {"import_run": str(crowd_dir), **(report.get("source") or {})},
            "aggregator": report.get("aggregator"),
        }
        return score_outputs(st, cfg, tables.AGGREGATED.read(crowd_dir), info)


def score_outputs(
    st: Stage, cfg: DictConfig, aggregated: pd.DataFrame, info: dict[str, Any]
) -> dict[str, Any]:
    """Score A, write every table, report and plot into the run dir, log metrics."""
    if "n_answers" in aggregated and int(aggregated["n_answers"].fillna(0).sum()) == 0:
        raise InputError(
            f"{st.inputs.get('crowd', 'the input')}: aggregated.csv holds no answer (every "
            "task has n_answers = 0): there is nothing to score; see its import_report.json"
        )
    sc = cfg.scoring
    simulated = st.provenance.simulated
    dataset = str(cfg.dataset.name)
    result = scoring.score(
        aggregated,
        baseline=str(sc.baseline),
        n_bootstrap=int(sc.bootstrap.n),
        level=float(sc.bootstrap.level),
        n_resamples=int(sc.test_resamples),
        seed=int(cfg.seed),
        histogram_exclude=list(sc.flip_histogram_exclude),
    )
    st.write(tables.AGGREGATED, aggregated)
    st.write(tables.ACCURACY, result.accuracy)
    st.write(tables.SCORES, result.scores)
    st.write(tables.FLIPS, result.flips)
    result.histogram.to_csv(st.path("flip_histogram.csv"), index=False)
    # what the study means comes from the run's provenance (saleval.pipeline.records.provenance), not a guess
    prov = st.provenance
    study = {
        "target": str(prov.target or Target.gold),
        "population": str(prov.population or Population.correct),
    }
    info = {**info, "study": study}
    sections = _study_sections(st, cfg, aggregated, result, study)
    note = _write_reports(st, result, dataset, simulated, sections, _apart(study))
    if note:
        info = {**info, "simulated_crowd_validation": note}
    summary = {
        "simulated": simulated,
        "dataset": dataset,
        **info,
        **result.info,
        "weights": result.weights,
    }
    write_json(st.path("score_report.json"), summary)
    for name in (
        "flip_histogram.csv",
        "scores.md",
        "scores.tex",
        "accuracy_vs_k.png",
        "flip_histogram.png",
        "score_report.json",
        COUNTS_FILE,
        OUTCOMES_FILE,
    ):
        if st.path(name).is_file():
            st.log_file(st.path(name))
    _log_metrics(st, result)
    return {
        "run_dir": str(st.run_dir),
        "run_id": st.tracking.run_id,
        "simulated": simulated,
        "scores": dict(zip(result.scores["method"], result.scores["score"])),
        "ranks": dict(zip(result.scores["method"], result.scores["rank"].astype(int))),
    }


def _study_sections(
    st: Stage,
    cfg: DictConfig,
    aggregated: pd.DataFrame,
    result: scoring.ScoreResult,
    study: dict[str, str],
) -> dict[str, pd.DataFrame]:
    """The tables a study variant adds to scores.md, each also written as a CSV: recognised
    counts for misclassified samples, accuracy by model outcome for forward prediction."""
    sections: dict[str, pd.DataFrame] = {}
    if study["population"] == Population.misclassified:
        counts = scoring.recognised_counts(result.cube)
        counts.to_csv(st.path(COUNTS_FILE), index=False)
        wide = counts.pivot(index="method", columns="k", values="recognised")
        wide = wide.loc[scoring.order_methods(wide.index)].reset_index()
        sections["Misclassified samples recognised (count per method and k)"] = wide
    if study["target"] == Target.prediction and {"gold_label", "pred"} <= set(aggregated.columns):
        sc = cfg.scoring
        outcomes = scoring.outcome_breakdown(
            aggregated, positive=int(sc.positive_label), n_labels=len(cfg.dataset.label_names)
        )
        outcomes.to_csv(st.path(OUTCOMES_FILE), index=False)
        pooled = outcomes[outcomes["k"] == "all"].pivot(
            index="method", columns="outcome", values="accuracy"
        )
        pooled = pooled.loc[scoring.order_methods(pooled.index)].round(1).reset_index()
        sections["Forward prediction: accuracy (%) by model outcome, all k"] = pooled
    return sections


def _apart(study: dict[str, str]) -> list[str]:
    """What sets this study apart from the main one (in the caption and the validation note)."""
    return [
        name
        for on, name in (
            (study["population"] == Population.misclassified, "misclassified samples"),
            (study["target"] == Target.prediction, "forward prediction"),
        )
        if on
    ]


def _write_reports(
    st: Stage,
    result: scoring.ScoreResult,
    dataset: str,
    simulated: bool,
    sections: dict[str, pd.DataFrame],
    apart: list[str],
) -> str | None:
    """scores.md, scores.tex and the two plots; a simulated crowd's also say how close it
    came to real people (the note, returned for the report)."""
    caption = f"{dataset}: crowd accuracy and score per saliency method"
    caption += "".join(f" ({name})" for name in apart)
    md = reports.scores_markdown(
        result.accuracy, result.scores, caption, simulated, result.flips, result.weights, sections
    )
    sim = upstream_simulation(st.inputs.values()) if simulated else None
    note = None if sim is None else calibration_note(sim, False, dataset, " and ".join(apart))
    if note:
        md += f"\n> {note}\n"
    st.path("scores.md").write_text(md)
    tex = reports.scores_latex(
        result.accuracy, result.scores, caption, simulated, label=f"tab:scores-{dataset}"
    )
    if note:
        tex += f"\n\\par\\noindent\\textit{{{reports.tex_escape(note)}}}\n"
    st.path("scores.tex").write_text(tex)
    short = "" if sim is None else calibration_note(sim, True, dataset, " and ".join(apart))
    suffix = "\n" + textwrap.fill(short, 72) if short else ""
    reports.plot_accuracy_vs_k(
        result.accuracy,
        st.path("accuracy_vs_k.png"),
        f"{dataset}: accuracy vs k{suffix}",
        simulated,
    )
    reports.plot_flip_histogram(
        result.histogram,
        st.path("flip_histogram.png"),
        f"{dataset}: flips per sample{suffix}",
        simulated,
    )
    return note


def method_rows(result: scoring.ScoreResult) -> pd.DataFrame:
    """One row per method, as its child run logs it: ``human_score``, ``human_rank``,
    ``p_vs_random``, ``flips``, ``aids`` and ``accuracy_k<k>`` (the crowd's accuracy in %
    at each k)."""
    scores = result.scores.set_index("method")
    rows = pd.DataFrame(
        {"human_score": scores["score"], "human_rank": scores["rank"].astype(float)}
    )
    if "p_vs_random" in scores:
        rows["p_vs_random"] = scores["p_vs_random"]
    flips = result.flips.set_index("method")
    rows = rows.join(flips[["flips", "aids"]])
    acc = result.accuracy.pivot(index="method", columns="k", values="accuracy")
    acc.columns = [f"accuracy_k{k}" for k in acc.columns]
    return rows.join(acc).rename_axis("method").reset_index()


def _log_metrics(st: Stage, result: scoring.ScoreResult) -> None:
    """Per method one child run (:func:`method_rows`); on the score run the sample
    count and the weight of each k in the score (``weight_k<k>``)."""
    m: dict[str, float] = {f"weight_k{k}": w for k, w in result.weights.items()}
    m["n_samples"] = result.info["n_samples"]
    st.log_metrics(m)
    st.tracking.log_method_rows(method_rows(result), table="scores")
