"""Many score, metrics and compare runs gathered into one long table (``saleval-report``;
docs/sweeps.md).

The runs come from run dirs, ``-m`` sweep dirs and ``saleval-run`` dirs (:func:`dirs_of`)
or an MLflow search (:func:`search_dirs`); each is read as a :class:`Source` (what it is
about, from its provenance; how it was varied, from its sweep overrides:
:func:`variants`) and its tables (``comparison.csv``, ``scores.csv``, ``metrics.csv``),
never its MLflow metric keys, give one row per dataset × model × variant × method
(:func:`gather`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from saleval.analysis import metric_columns
from saleval.metrics.registry import import_plugins
from saleval.pipeline import tables
from saleval.pipeline.records import merge
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.run_inputs import resolve_input
from saleval.pipeline.records.run_record import RunRecord, read_run_config

log = logging.getLogger(__name__)

#: the stages whose tables a report gathers
GATHERED = ("compare", "score", "metrics")


#: the columns a row is identified by
ROW = ["dataset", "model", "variant", "method"]


HUMAN = "human_score"


class ReportError(ValueError):
    """The gathered runs cannot make one table (nothing gathered, one cell twice, ...)."""


@dataclass(frozen=True)
class Source:
    """One gathered run: where it is, what it is about, how it was varied."""

    run_dir: Path
    stage: str
    run_id: str
    dataset: str
    model: str
    simulated: bool
    overrides: tuple[str, ...]
    parent_dirs: tuple[Path, ...]


def _stage_runs(path: Path) -> list[Path]:
    """A ``saleval-run`` dir's compare run, or its score and metrics runs without one."""
    ran = [s for s in GATHERED if _has_stage(path, s)]
    chosen = ["compare"] if "compare" in ran else ran
    if not chosen:
        raise ReportError(f"{path}: this saleval-run ran no {', '.join(GATHERED)} stage")
    return [merge.pipeline_stage_dir(path, s) for s in chosen]


def _has_stage(pipeline_dir: Path, stage: str) -> bool:
    try:
        merge.pipeline_stage_dir(pipeline_dir, stage)
    except merge.MergeError:
        return False
    return True


def dirs_of(
    value: Any, output_root: str | Path | None = None, allow_unfinished: bool = False
) -> list[Path]:
    """Every run dir named by ``inputs.runs``: runs, ``runs:/<id>``, sweep dirs (their
    jobs), ``saleval-run`` dirs (their compare run, else their score and metrics runs).
    A run that did not finish is refused unless ``allow_unfinished``
    (:meth:`saleval.pipeline.records.run_record.RunRecord.unfinished_message`)."""
    out: list[Path] = []
    for spec in merge.as_specs(value):
        path = Path(spec).expanduser()
        jobs = merge.sweep_jobs(path) if path.is_dir() and merge.is_sweep_dir(path) else [path]
        for job in jobs:
            if job.is_dir() and (job / merge.PIPELINE_JSON).is_file():
                out += _stage_runs(job)
            else:
                given = str(job) if job != path else spec
                out.append(resolve_input("runs", given, output_root, allow_unfinished))
    return out


def search_dirs(
    experiments: Sequence[str],
    filter_string: str,
    max_results: int,
    output_root: str | Path | None = None,
) -> list[Path]:
    """Finished score, metrics and compare runs of the named MLflow experiments matching
    ``filter_string``, as local run dirs (downloaded under ``output_root`` when they are not
    on this machine)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    ids = []
    for name in experiments:
        exp = client.get_experiment_by_name(str(name))
        if exp is None:
            known = [e.name for e in client.search_experiments()]
            raise InputError(f"search.experiments: no MLflow experiment {name!r}; known: {known}")
        ids.append(exp.experiment_id)
    where = "attributes.status = 'FINISHED'" + (f" and {filter_string}" if filter_string else "")
    runs = client.search_runs(ids, filter_string=where, max_results=int(max_results))
    out: list[Path] = []
    for r in runs:
        if r.data.tags.get("stage") not in GATHERED:
            continue
        if not r.data.tags.get("run_dir"):  # not a stage's own run
            if "method" not in r.data.tags:  # a per-method child run is expected; say others
                log.warning("search: run %s has no run_dir tag; skipped", r.info.run_id)
            continue
        out.append(resolve_input("runs", f"runs:/{r.info.run_id}", output_root))
    return out


def sources_of(dirs: Sequence[Path]) -> list[Source]:
    """Each distinct run once; a score or metrics run that a gathered compare run already
    compares is left out (its values are in the comparison)."""
    unique = list(dict.fromkeys(d.resolve() for d in dirs))
    found: list[Source] = []
    for d in unique:
        record = RunRecord.read(d)
        stage = record.stage or ""
        if stage not in GATHERED:
            raise ReportError(
                f"{d}: a {stage or 'unknown'} run; saleval-report gathers {', '.join(GATHERED)} runs"
            )
        prov = record.provenance_of_run(d)
        found.append(
            Source(
                run_dir=d,
                stage=stage,
                run_id=record.run_id or "",
                dataset=str(prov.dataset),
                model=str(prov.model),
                simulated=prov.simulated,
                overrides=tuple(merge.job_overrides(d) or ()),
                parent_dirs=tuple(Path(p).resolve() for p in record.parent_dirs.values()),
            )
        )
    compared = {p for s in found if s.stage == "compare" for p in s.parent_dirs}
    kept = [s for s in found if not (s.stage != "compare" and s.run_dir in compared)]
    if not kept:
        raise ReportError("no score, metrics or compare run was gathered")
    return kept


def _named(overrides: Sequence[str]) -> list[str]:
    """A run that names its profile (``profile.name=...``) is labelled by that name, not
    by the per-stage override lists the name stands for (they run to hundreds of chars).

    >>> _named(["+experiment=preset_lu2024", "profile.name=zero", "profile.stages.explain=[...]"])
    ['+experiment=preset_lu2024', 'profile.name=zero']
    """
    if not any(o.startswith("profile.name=") for o in overrides):
        return list(overrides)
    return [o for o in overrides if not o.startswith("profile.stages.")]


def variants(sources: Sequence[Source]) -> dict[Path, str]:
    """Each run's variant: its sweep overrides beyond dataset, model, inputs and paths,
    less those every gathered run shares (``""`` when nothing sets it apart). A named
    profile stands for its stage lists unless that would give two variants one label."""
    own = {s.run_dir: merge.variant_overrides(s.overrides) for s in sources}

    def labels(of: dict[Path, list[str]]) -> dict[Path, str]:
        common = set.intersection(*(set(v) for v in of.values())) if of else set()
        return {d: " ".join(o for o in v if o not in common) for d, v in of.items()}

    full = labels(own)
    short = labels({d: _named(v) for d, v in own.items()})
    return short if len(set(short.values())) == len(set(full.values())) else full


def _plugins(source: Source) -> list[str]:
    """The metrics modules a run (or the metrics runs it compares) registered."""
    dirs = [source.run_dir] if source.stage == "metrics" else list(source.parent_dirs)
    out: list[str] = []
    for d in dirs:
        if (d / "config.yaml").is_file():
            found = OmegaConf.select(read_run_config(d), "metrics.plugins", default=None)
            out += [str(m) for m in (found or [])]
    return out


def values_of(source: Source, columns: str | Sequence[str]) -> pd.DataFrame:
    """``method, column, value`` of one run: the human score and/or each metric column."""
    if source.stage == "compare":
        table = tables.COMPARISON.read(source.run_dir)
        known = metric_columns.metric_directions()
        cols = [HUMAN] + [
            c
            for c in table.columns
            if c not in tables.COMPARISON.columns
            and c not in tables.COMPARISON.optional
            and not c.endswith("_rank")
            and metric_columns.split_column(c)[0] in known
        ]
        long = table.melt(id_vars="method", value_vars=cols, var_name="column")
    elif source.stage == "score":
        scores = tables.SCORES.read(source.run_dir)
        long = pd.DataFrame({"method": scores["method"], "column": HUMAN, "value": scores["score"]})
    else:
        metrics = tables.METRICS.read(source.run_dir)
        cols = metric_columns.select_columns(metrics, columns)
        wide = metric_columns.wide_metrics(metrics, cols, ["method"])
        long = wide.reset_index().melt(id_vars="method", var_name="column")
    return long.assign(method=long["method"].astype(str), value=long["value"].astype(float))


def gather(sources: Sequence[Source], columns: str | Sequence[str] = "summary") -> pd.DataFrame:
    """Every value of every run: ``dataset, model, variant, method, column, value, run``.

    One cell given by two runs is an error naming both (give them different variants,
    or drop one)."""
    labels = variants(sources)
    frames = []
    for s in sources:
        import_plugins(_plugins(s))  # their metrics' directions are known here too
        frames.append(
            values_of(s, columns).assign(
                dataset=s.dataset,
                model=s.model,
                variant=labels[s.run_dir],
                run=str(s.run_dir),
                simulated=s.simulated,
            )
        )
    long = pd.concat(frames, ignore_index=True)
    cell = [*ROW, "column"]
    dup = long[long.duplicated(cell, keep=False)]
    if len(dup):
        first = dup.iloc[0]
        runs = dup.loc[(dup[cell] == first[cell]).all(axis=1), "run"].tolist()
        raise ReportError(
            f"{first['column']} of method {first['method']} on {first['dataset']}/"
            f"{first['model']} comes from both {runs[0]} and {runs[1]}: drop one, or run them "
            "as different variants (different sweep overrides)"
        )
    return long
