"""``saleval-tasks``: crowd tasks and bundles from an explain run (docs/study-design.md,
docs/architecture.md).

Reads ``attributions.parquet`` and ``predictions.parquet`` of ``inputs.explain`` (one run,
or several with disjoint methods: a list or a sweep dir, ``docs/sweeps.md``);
writes ``tasks.csv``, ``bundles.csv`` and every registered export format
(:mod:`saleval.crowd.export.formats`: ``bundles_wide.csv`` for platform upload,
``bundles_long.csv``, ``instructions.md``, and your own: docs/extending.md) into the run
dir, all logged to MLflow.

Main options: ``inputs.explain``, ``study`` (main, forward, misclassified, smoke), ``kgrid``
(paper, smoke: the top-k values shown), ``seed``, ``drop_duplicate_methods`` (two methods
with identical top-k words on every study sample at every k are always warned; true drops
the later one: docs/study-design.md#identical-methods).

Example::

    saleval-tasks inputs.explain=latest study=main
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from saleval.config.crowd import DesignError, StudyConfig
from saleval.pipeline import tables
from saleval.pipeline.stage import Stage
from saleval.schema import to_schema
from saleval.vocab import PROBS


def check_labels(label_names: list[str], explain_dir: Path, prob_columns: list[str]) -> list[str]:
    """The explain run's ``prob_<label name>`` columns (:data:`saleval.vocab.PROBS`) must
    follow the dataset's label names, so answers and labels cannot be silently misaligned
    (the dataset itself is checked by the provenance rule in
    :class:`saleval.pipeline.stage.Stage`)."""
    names = [str(n) for n in label_names]
    expected = PROBS.columns(names)
    if prob_columns and prob_columns != expected:
        raise DesignError(
            f"{tables.PREDICTIONS.path(explain_dir)}: probability columns {prob_columns} do not "
            f"match dataset.label_names {names} (expected {expected})"
        )
    return names


def run(cfg: DictConfig) -> dict[str, Any]:
    # transformers loads when a run starts, not on import (saleval.cli)
    from saleval.crowd.design import build_study
    from saleval.crowd.export.formats import write_exports

    with Stage(cfg, "tasks", {"explain": cfg.inputs.explain}, requires=["dataset"]) as st:
        explain = st.inputs["explain"]
        preds = st.inputs.read(tables.PREDICTIONS, "explain")  # merged when several runs are given
        attrs = st.inputs.read(tables.ATTRIBUTIONS, "explain")
        prob_columns = PROBS.of(preds.columns)
        labels = check_labels(list(cfg.dataset.label_names), explain, prob_columns)
        study = to_schema(StudyConfig, cfg.study)
        design = build_study(
            preds,
            attrs,
            labels,
            study,
            list(cfg.kgrid.ks),
            where=str(explain),
            drop_identical=bool(cfg.drop_duplicate_methods),
        )
        st.tracking.log_methods(design.methods)
        st.write(tables.TASKS, design.tasks)
        st.write(tables.BUNDLES, design.bundles)
        container = OmegaConf.to_container(cfg.dataset, resolve=True)
        assert isinstance(container, dict)
        dataset = cast(dict[str, Any], container)  # a dataset config's keys are str
        for path in write_exports(
            st.run_dir, design.tasks, design.bundles, preds, dataset, study.target
        ):
            st.log_file(path)
        st.log_metrics({k: v for k, v in design.info.items() if isinstance(v, int | float)})
        identical = ",".join(f"{a}={b}" for a, b in design.identical)
        st.tracking.set_tags(
            {"study": study.name, "target": str(study.target), "methods": ",".join(design.methods),
             "identical_methods": identical, "dropped_methods": ",".join(design.dropped)}
        )  # fmt: skip
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            **design.info,
            "identical_methods": design.identical,
            "dropped_methods": design.dropped,
        }
