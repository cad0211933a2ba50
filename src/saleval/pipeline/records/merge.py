"""Several parent runs as one input: lists of runs, Hydra sweep dirs, pipeline dirs.

``inputs.explain=[dirA,dirB]`` or ``inputs.explain=<sweep dir>`` (the dir of a ``-m``
multirun, holding ``multirun.yaml`` and one job dir per number) give a stage several
parents for one input (``docs/sweeps.md``). :func:`expand` turns such a value into the
run dirs it names; :func:`read_merged` reads one table from each and merges them:

* tables with a ``method`` column (attributions, scores, metrics, aggregated crowd
  results) are concatenated; a method held by two runs is an error naming both, and so
  are runs about different samples;
* tables without one (predictions) must agree row for row on their key; the first run's
  is returned.

Same dataset, model and ``max_length`` are checked before, by the provenance rule over
every run (:mod:`saleval.pipeline.records.provenance`), so a mixed sweep fails naming the runs.

>>> label("explain", 0, 1), label("explain", 1, 2)
('explain', 'explain.1')
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from saleval.pipeline.records.run_record import RUN_JSON, RunRecord
from saleval.pipeline.tables import TableSpec

#: Hydra writes this file into the sweep dir of every ``-m`` run
MULTIRUN_YAML = "multirun.yaml"
#: ``saleval-run`` writes this file into its run dir (one subdir per stage)
PIPELINE_JSON = "pipeline.json"


class MergeError(ValueError):
    """Parent runs of one input cannot be merged (same method twice, other samples...)."""


def label(name: str, i: int, n: int) -> str:
    """The name of run ``i`` of ``n`` behind ``inputs.<name>`` (in ``run.json``, tags,
    provenance errors): the input's own name when it is the only one, so single-run
    stages record exactly what they did before."""
    return name if n == 1 else f"{name}.{i}"


def is_sweep_dir(path: Path) -> bool:
    return (path / MULTIRUN_YAML).is_file()


def sweep_jobs(path: Path) -> list[Path]:
    """The job dirs of a Hydra sweep dir, in job order (``0``, ``1``, ..., ``10``)."""
    jobs = sorted(
        (p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not jobs:
        raise MergeError(f"{path}: a sweep dir ({MULTIRUN_YAML}) without job dirs 0/, 1/, ...")
    return jobs


def pipeline_stage_dir(pipeline_dir: Path, stage: str) -> Path:
    """The run of ``stage`` that a ``saleval-run`` dir used (ran or reused)."""
    info = json.loads((pipeline_dir / PIPELINE_JSON).read_text())
    stages = info.get("stages") or {}
    if stage not in stages:
        raise MergeError(
            f"{pipeline_dir / PIPELINE_JSON}: no {stage} run in this pipeline (it ran "
            f"{', '.join(stages) or 'nothing'})"
        )
    return Path(str(stages[stage]["run_dir"]))


def as_specs(value: Any) -> list[str]:
    """An ``inputs.<name>`` value as a list of strings (a list, or one run/sweep dir)."""
    if isinstance(value, ListConfig | DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]


def expand(name: str, value: Any, stage: str, allow_unfinished: bool = False) -> list[str]:
    """Every single run an ``inputs.<name>`` value names, in order, each still to be
    resolved (a dir, ``runs:/<id>``, ``latest``: :func:`saleval.pipeline.records.run_inputs.resolve_inputs`).

    A list names several runs; a sweep dir names its jobs; a ``saleval-run`` dir (or a
    sweep of them) names its run of ``stage`` (the stage producing this input). A sweep
    job that did not finish (no ``run.json``, or one that is not FINISHED) is refused
    naming the sweep's rerun, unless ``allow_unfinished``
    (:meth:`saleval.pipeline.records.run_record.RunRecord.unfinished_message`). Why it returns
    specs, not run dirs: the caller resolves each one in one place, so locating a run
    is written once.
    """
    out: list[str] = []
    for spec in as_specs(value):
        path = Path(spec).expanduser()
        swept = path.is_dir() and is_sweep_dir(path)
        for job in sweep_jobs(path) if swept else [path]:
            if job.is_dir() and not RunRecord.exists(job) and (job / PIPELINE_JSON).is_file():
                job = pipeline_stage_dir(job, stage)
            elif swept and not RunRecord.exists(job):
                raise MergeError(
                    f"inputs.{name}: sweep job {job} has no {RUN_JSON}: did it fail? Rerun the "
                    f"sweep's unfinished jobs (the same command with hydra.sweep.dir={path}) or "
                    "list the jobs that finished"
                )
            elif swept and not allow_unfinished:
                problem = RunRecord.read(job).unfinished_message(name, job, sweep=path)
                if problem:
                    raise MergeError(problem)
            out.append(str(job) if job != path else spec)
    if not out:
        raise MergeError(f"inputs.{name}: an empty list names no run")
    return out


def _samples(df: pd.DataFrame) -> set[str]:
    return set(df["sample_id"].astype(str))


def _check_samples(
    spec: TableSpec, frames: Sequence[pd.DataFrame], runs: Sequence[Path], where: str
) -> None:
    """Every run must hold the same samples (one study, one draw)."""
    first = _samples(frames[0])
    for df, run in zip(frames[1:], runs[1:]):
        other = _samples(df)
        if other != first:
            only = [
                f"{len(ids)} only in {r}" + (f", e.g. {ids[:3]}" if ids else "")
                for ids, r in ((sorted(first - other), runs[0]), (sorted(other - first), run))
            ]
            raise MergeError(
                f"{where}: {spec.filename} of {runs[0]} and {run} hold different samples "
                f"({'; '.join(only)}): run them on the same samples (data.n_samples, seed, "
                "data.sample_ids)"
            )


def merge_frames(
    spec: TableSpec, frames: Sequence[pd.DataFrame], runs: Sequence[Path], where: str
) -> pd.DataFrame:
    """One table from the same table of several runs (see the module's doc)."""
    if len(frames) == 1:
        return frames[0]
    if "method" in spec.columns:
        owner: dict[str, Path] = {}
        for df, run in zip(frames, runs):
            for method in dict.fromkeys(df["method"].astype(str)):
                if method in owner:
                    raise MergeError(
                        f"{where}: method {method!r} is in {spec.filename} of both {owner[method]} "
                        f"and {run}; a method may come from one run only: drop one of them"
                    )
                owner[method] = run
        if "sample_id" in spec.columns:
            _check_samples(spec, frames, runs, where)
        return spec.validate(pd.concat(frames, ignore_index=True), where=where)
    if "sample_id" in spec.columns:
        _check_samples(spec, frames, runs, where)
        key = list(spec.key) or ["sample_id"]
        shared = [c for c in frames[0].columns if all(c in f.columns for f in frames[1:])]
        base = frames[0][shared].sort_values(key).reset_index(drop=True)
        for df, run in zip(frames[1:], runs[1:]):
            other = df[shared].sort_values(key).reset_index(drop=True)
            for col in shared:
                a, b = base[col], other[col]
                same = (a == b) | (a.isna() & b.isna())
                if not bool(same.all()):
                    row = int((~same).to_numpy().argmax())
                    raise MergeError(
                        f"{where}: {spec.filename} of {runs[0]} and {run} differ in column "
                        f"{col!r} (sample {base.loc[row, key[0]]}: {a.iloc[row]!r} vs "
                        f"{b.iloc[row]!r}): were they made from the same model and data?"
                    )
    return frames[0]


def read_merged(spec: TableSpec, runs: Sequence[Path], where: str) -> pd.DataFrame:
    """``spec``'s table of every run in ``runs``, merged (:func:`merge_frames`)."""
    return merge_frames(spec, [spec.read(r) for r in runs], list(runs), where)


#: the override keys that say *which* data/model a sweep job is about, or where it goes:
#: not part of a run's variant label
_NOT_VARIANT = re.compile(
    r"^[+~]*(dataset|model|profile\.dataset|profile\.model|inputs\..*|paths\..*|tracking\..*"
    r"|hydra\..*|run_dir|progress)$"
)


def job_overrides(run_dir: Path) -> list[str] | None:
    """The command-line overrides of the Hydra job that made ``run_dir`` (its own
    ``.hydra/overrides.yaml``, or that of the ``saleval-run`` dir around it)."""
    for d in (run_dir, run_dir.parent):
        path = d / ".hydra" / "overrides.yaml"
        if path.is_file():
            loaded = OmegaConf.load(path)
            return [str(o) for o in loaded] if isinstance(loaded, ListConfig) else None
    return None


def variant_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that make a variant: not the dataset, model, inputs or output paths.

    >>> variant_overrides(["profile.dataset=sst2", "method.lime.num_samples=300", "inputs.model=x"])
    ['method.lime.num_samples=300']
    """
    return [o for o in overrides if not _NOT_VARIANT.match(o.partition("=")[0])]
