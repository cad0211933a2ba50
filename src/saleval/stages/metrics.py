"""``saleval-metrics``: faithfulness and plausibility of every method's scores (docs/metrics.md).

Reads the explain run ``inputs.explain`` (``attributions.parquet``, ``predictions.parquet``,
its ``max_length`` and dataset; or several explain runs of disjoint methods, a list or a
sweep dir, merged: ``docs/sweeps.md``) and the train run's model ``inputs.model``; writes
``metrics.csv`` (means per method, metric, k), ``metrics_per_example.parquet`` (what the
instance-level comparison needs) and ``metric_timings.csv`` (wall time and forward passes
per metric family), and logs one MLflow child run per method with the same keys
(``<metric>`` and ``<metric>_k<k>``; docs/tracking.md) so the UI puts methods in rows.

Main options: ``inputs.model``, ``inputs.explain``, ``metrics`` (default, quick, mask, unk),
``kgrid`` (paper, smoke), ``metrics.inference.accelerator`` (auto: the GPU when there is
one), ``progress``.

Example::

    saleval-metrics inputs.model=latest inputs.explain=latest metrics=quick
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.metrics.config import MetricsConfig
from saleval.modeling.devices import device_for
from saleval.pipeline import tables
from saleval.pipeline.records import run_naming
from saleval.pipeline.records.run_inputs import model_input
from saleval.pipeline.records.run_record import RunRecord
from saleval.pipeline.stage import Stage

if TYPE_CHECKING:
    from saleval.metrics.eraser import Scored
    from saleval.metrics.faithfulness import Explanation

log = logging.getLogger(__name__)

TIMINGS = "metric_timings.csv"


def _warn_on_other_model(explain_dir: Path, record: RunRecord, model_dir: Path) -> None:
    explained_with = record.parent_dirs.get("model")
    if explained_with and Path(explained_with).resolve() != Path(model_dir).resolve():
        log.warning(
            "the explain run %s explained the model of %s, but inputs.model=%s: the metrics "
            "measure another model than the one explained",
            explain_dir,
            explained_with,
            model_dir,
        )


@dataclass
class Plausibility:
    """What the plausibility metrics add to a metrics run (docs/metrics.md#plausibility)."""

    per_example: pd.DataFrame  # rows of metrics_per_example.parquet
    corpus: pd.DataFrame | None = None  # metrics.csv rows that are no mean over texts
    eraser: Scored | None = None  # ERASER's convention: its results files and coverage


def plausibility_rows(
    explanations: list[Explanation], explain_cfg: DictConfig, cfg: DictConfig, mcfg: MetricsConfig
) -> Plausibility | None:
    """The plausibility metrics per explanation, in the configured convention(s)
    (``metrics.plausibility.convention``), when the dataset has human rationales."""
    from saleval.metrics.config import Convention
    from saleval.metrics.eraser import score_explanations
    from saleval.metrics.plausibility import plausibility_scores, rationale_word_mask
    from saleval.modeling.data import load_dataset

    pcfg = mcfg.plausibility
    enabled = str(pcfg.enabled).lower()
    if enabled == "false":
        return None
    dcfg = cfg.dataset  # the explain run's, adopted by the provenance rule
    split = explain_split(explain_cfg)
    frame = load_dataset(dcfg)[split]
    if "rationale_spans" not in frame.columns:
        if enabled == "true":
            raise ValueError(
                f"metrics.plausibility.enabled=true but dataset {dcfg['name']} has no human "
                "rationales (only eraser_movies does)"
            )
        return None
    rows = frame.set_index(frame["sample_id"].astype(str))
    missing = sorted({e.sample_id for e in explanations} - set(rows.index))
    if missing:
        raise ValueError(
            f"samples {missing[:5]} of the explain run are not in split {split!r} of "
            f"dataset {dcfg['name']}"
        )
    for e in explanations:
        if str(rows.loc[e.sample_id, "text"]) != e.seg.text:
            raise ValueError(
                f"predictions.parquet: sample {e.sample_id}, field text: differs from the "
                f"dataset's text, so the rationale spans would not line up"
            )
    top_k = None if pcfg.top_k is None else int(pcfg.top_k)
    convention = Convention(pcfg.convention)
    parts: list[pd.DataFrame] = []
    if convention in (Convention.saleval, Convention.both):
        out: list[tuple[str, str, str, str, float]] = []
        for e in explanations:
            human = rationale_word_mask(e.seg.spans, rows.loc[e.sample_id, "rationale_spans"])
            scores = plausibility_scores(human, e.scores, top_k, float(pcfg.iou_threshold))
            out.extend((e.sample_id, e.method, m, "", v) for m, v in scores.items())
        parts.append(pd.DataFrame(out, columns=["sample_id", "method", "metric", "k", "value"]))
    eraser = None
    if convention in (Convention.eraser, Convention.both):
        needs = ["evidence_tokens", "annotation_id", "docid"]
        if any(c not in rows.columns for c in needs):
            raise ValueError(
                f"metrics.plausibility.convention={convention}: dataset {dcfg['name']} has no "
                f"ERASER evidence token spans ({', '.join(needs)}); read it from ERASER's "
                "files (dataset.source=files)"
            )
        where = f"dataset {dcfg['name']}, split {split}"
        eraser = score_explanations(explanations, rows, top_k, float(pcfg.iou_threshold), where)
        parts.append(eraser.per_example)
    return Plausibility(
        pd.concat(parts, ignore_index=True),
        None if eraser is None else eraser.corpus,
        eraser,
    )


def explain_split(explain_cfg: DictConfig) -> str:
    """The dataset split the explain run explained."""
    return str(OmegaConf.select(explain_cfg, "data.split", default="test") or "test")


def write_eraser_inputs(st: Stage, scored: Scored, dcfg: DictConfig, split: str) -> Path:
    """``eraser/``: per method the results file ERASER's scorer reads, and a data directory
    it can score them against — the explained documents' annotations (lines of the
    dataset's own file) and a link to its ``docs/`` (docs/metrics.md#eraser)."""
    from saleval.modeling.data import ERASER_SPLIT_FILES, dataset_config, eraser_root

    out = st.path("eraser")
    out.mkdir(exist_ok=True)
    for method, lines in scored.results.items():
        path = out / f"{method}.jsonl"
        path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
        st.log_file(path, "eraser")
    root = eraser_root(dataset_config(dcfg))
    covered = {m: {str(ln["annotation_id"]) for ln in lines} for m, lines in scored.results.items()}
    ids = set().union(*covered.values())
    for method, mine in covered.items():
        if mine != ids:  # the scorer takes every annotation of <split>.jsonl as truth
            log.warning(
                "eraser/%s.jsonl explains %d of the %d documents in eraser/%s: ERASER's "
                "scorer counts the other %d as found nothing (token F1 and IOU recall 0), "
                "saleval's eraser_* figures leave them out",
                method, len(mine), len(ids), ERASER_SPLIT_FILES[split], len(ids) - len(mine),
            )  # fmt: skip
    source = root / ERASER_SPLIT_FILES[split]
    keep = [
        ln
        for ln in source.read_text().splitlines()
        if ln.strip() and json.loads(ln)["annotation_id"] in ids
    ]
    (out / ERASER_SPLIT_FILES[split]).write_text("\n".join(keep) + "\n")
    docs = out / "docs"
    if not docs.exists():
        try:
            docs.symlink_to((root / "docs").resolve(), target_is_directory=True)
        except OSError as err:  # a file system without links: say where the docs are
            log.warning(
                "eraser/docs: no link to %s (%s); link or copy it there", root / "docs", err
            )
    return out


def method_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per method, as its child run logs it: each metric under its own name
    (grid average or single-valued) and ``<metric>_k<k>`` per k
    (:func:`saleval.pipeline.records.run_naming.metric_at_k`)."""
    keys = [run_naming.metric_at_k(m, k) for m, k in zip(summary["metric"], summary["k"])]
    wide = summary.assign(key=keys).pivot_table(
        index="method", columns="key", values="value", aggfunc="first", sort=False
    )
    return wide.rename_axis(columns=None).reset_index()


#: the dataset and max_length the explain run used, the model of the train run (and of the
#: explain run); a value given here is checked against them (saleval.pipeline.records.provenance)
INHERITS = {"dataset": ["explain"], "model": ["model", "explain"], "max_length": ["explain"]}


def run(cfg: DictConfig) -> dict[str, Any]:
    # torch, transformers load when a run starts, not on import (saleval.cli)
    import torch

    from saleval.metrics.faithfulness import evaluate, explanations_from_tables, summarize
    from saleval.modeling.inference import use_bf16
    from saleval.modeling.models import align_labels, checkpoint_name, load_trained
    from saleval.modeling.prompts import prompt_dir

    # a bad key fails before any run starts; metrics.plugins (a user's own metrics) are
    # imported first, so they register themselves and their settings
    mcfg = MetricsConfig.from_config(cfg.metrics)
    device = device_for(mcfg.inference.accelerator, "metrics.inference.accelerator")
    spec, run, checkpoint = model_input(cfg)  # a user's own checkpoint: no parent run
    inputs = {"explain": cfg.inputs.explain, **({"model": run} if run else {})}
    tags = {"checkpoint": checkpoint} if checkpoint else {}
    with Stage(cfg, "metrics", inputs, tags=tags, inherits=INHERITS, requires=["dataset"]) as st:
        explain_dir = st.inputs["explain"]
        model_dir = st.inputs["model"] if run else Path(str(checkpoint))
        explain_cfg = st.inputs.parent_configs["explain"]
        name = checkpoint_name(str(checkpoint)) if checkpoint else None
        if checkpoint and prompt_dir(checkpoint) is None and prompt_dir(explain_dir):
            # the causal LM the explain run prompted: the prompt it kept (same shots)
            model_dir, name = Path(str(prompt_dir(explain_dir))), f"{name}-prompted"
        if run:
            for each, record, _ in st.inputs.runs_of("explain"):
                _warn_on_other_model(each, record, model_dir)
        elif name != st.provenance.model:
            log.warning(
                "inputs.model=%s is not the model the explain run %s explained (%s)",
                checkpoint, explain_dir, st.provenance.model,
            )  # fmt: skip
        # the explain run's segmentation length (runs written before it was recorded: the
        # train run's model.max_length, which the explain stage then used)
        max_length = st.inputs.max_length(st.provenance.max_length)
        if not max_length:
            raise ValueError(
                f"neither {explain_dir} nor {model_dir} records a max_length: cannot "
                "re-segment the texts as the explain run did"
            )
        model, tok = load_trained(str(model_dir), attn_implementation=None)
        # in place (transformers' typed `to` wraps it): every forward pass runs there
        torch.nn.Module.to(model, device)
        align_labels(model, list(cfg.dataset.label_names), where=f"inputs.model={spec}")
        preds = st.inputs.read(tables.PREDICTIONS, "explain")  # merged when several runs are given
        attrs = st.inputs.read(tables.ATTRIBUTIONS, "explain")
        if mcfg.max_samples is not None:
            keep = sorted(preds["sample_id"].astype(str))[: int(mcfg.max_samples)]
            attrs = attrs[attrs["sample_id"].isin(keep)]
        methods = None if mcfg.methods is None else [str(m) for m in mcfg.methods]
        explanations = explanations_from_tables(
            preds, attrs, tok, max_length, methods, where=str(tables.ATTRIBUTIONS.path(explain_dir))
        )
        st.tracking.log_methods(list(dict.fromkeys(e.method for e in explanations)))
        result = evaluate(model, tok, explanations, mcfg, progress=bool(cfg.get("progress", True)))
        _warn_on_prediction_mismatch(preds, result.full)
        per_example = result.per_example
        plaus = plausibility_rows(explanations, explain_cfg, cfg, mcfg)
        if plaus is not None:
            per_example = pd.concat([per_example, plaus.per_example], ignore_index=True)
        summary = summarize(per_example)
        if plaus is not None and plaus.corpus is not None:
            summary = pd.concat([summary, plaus.corpus], ignore_index=True)
        if plaus is not None and plaus.eraser is not None:
            cover = plaus.eraser.coverage
            write_eraser_inputs(st, plaus.eraser, cfg.dataset, explain_split(explain_cfg))
            log.info("ERASER convention: %s", cover.describe())
            st.tracking.set_tags({"plausibility_document": cover.reading})
            st.log_metrics(
                {
                    "eraser_texts_cut": cover.texts_cut,
                    "eraser_gold_tokens_past_window": cover.gold_tokens_past_window,
                }
            )
        st.write(tables.METRICS_PER_EXAMPLE, per_example)
        st.write(tables.METRICS, summary)
        result.timings.to_csv(st.path(TIMINGS), index=False)
        st.log_file(st.path(TIMINGS))
        st.tracking.log_method_rows(method_rows(summary), table="metrics")
        st.log_metrics({f"seconds_{r.metric}": r.seconds for r in result.timings.itertuples()})
        bf16 = use_bf16(device, mcfg.inference.bf16)  # what `auto` became
        st.log_metrics(
            {
                "n_forward": result.extra["n_forward"],
                "n_explanations": len(explanations),
                "bf16": float(bf16),
            }
        )
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            "n_explanations": len(explanations),
            "n_forward": result.extra["n_forward"],
            "timings": result.timings.to_dict("records"),
        }


def _warn_on_prediction_mismatch(preds: pd.DataFrame, full: pd.DataFrame) -> None:
    """Metrics target the model's prediction now; say if the explain run saw another one."""
    both = full.merge(preds[["sample_id", "pred"]], on="sample_id", suffixes=("", "_explain"))
    n = int((both["pred"] != both["pred_explain"]).sum())
    if n:
        log.warning(
            "%d of %d samples: the model's prediction differs from predictions.parquet "
            "(bf16 or another model?); metrics use the prediction recomputed here",
            n,
            len(both),
        )
