"""``saleval-tasks``: crowd tasks and bundles from an explain run (SPEC §4, §9.1).

Reads ``attributions.parquet`` and ``predictions.parquet`` of ``inputs.explain``;
writes ``tasks.csv``, ``bundles.csv``, ``bundles_wide.csv`` (platform upload),
``bundles_long.csv`` and ``instructions.md`` into the run dir, all logged to MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from saleval import tables
from saleval.crowd.config import StudyConfig, load
from saleval.crowd.design import DesignError, build_study
from saleval.crowd.exports import write_exports
from saleval.stage import Stage, hydra_main


def check_dataset(cfg: DictConfig, parent_dir: Path, prob_columns: list[str]) -> list[str]:
    """Label names from ``cfg.dataset``, checked against the parent run's dataset and
    the ``prob_<label>`` columns, so answers and labels cannot be silently misaligned."""
    names = [str(n) for n in cfg.dataset.label_names]
    parent_cfg = parent_dir / "config.yaml"
    if parent_cfg.is_file():
        parent = OmegaConf.load(parent_cfg)
        theirs = OmegaConf.select(parent, "dataset.name", default=None)
        if theirs is not None and str(theirs) != str(cfg.dataset.name):
            raise DesignError(
                f"{parent_cfg}: the explain run used dataset {theirs!r} but this run composes "
                f"dataset={cfg.dataset.name!r}; pass dataset={theirs}"
            )
    expected = [f"prob_{n}" for n in names]
    if prob_columns and prob_columns != expected:
        raise DesignError(
            f"{tables.PREDICTIONS.path(parent_dir)}: probability columns {prob_columns} do not "
            f"match dataset.label_names {names} (expected {expected})"
        )
    return names


def run(cfg: DictConfig) -> dict[str, Any]:
    with Stage(cfg, "tasks", inputs={"explain": cfg.inputs.explain}) as st:
        explain = st.inputs["explain"]
        preds = tables.PREDICTIONS.read(explain)
        attrs = tables.ATTRIBUTIONS.read(explain)
        labels = check_dataset(cfg, explain, [c for c in preds.columns if c.startswith("prob_")])
        study = load(StudyConfig, cfg.study)
        design = build_study(preds, attrs, labels, study, list(cfg.kgrid.ks), where=str(explain))
        st.write(tables.TASKS, design.tasks)
        st.write(tables.BUNDLES, design.bundles)
        dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
        assert isinstance(dataset, dict)
        for path in write_exports(
            st.run_dir, design.tasks, design.bundles, preds, dataset, study.target
        ):
            st.log_file(path)
        st.log_metrics({k: v for k, v in design.info.items() if isinstance(v, int | float)})
        st.set_tags(
            {"study": study.name, "target": str(study.target), "methods": ",".join(design.methods)}
        )
        return {"run_dir": str(st.run_dir), "run_id": st.run_id, **design.info}


main = hydra_main("tasks", run)
