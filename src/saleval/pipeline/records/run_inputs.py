"""A stage's parent runs: what ``inputs.<name>`` names, read once, and what it means.

:class:`RunInputs` is everything a stage learns from its inputs before it starts (a stage
reaches it as ``st.inputs``): each ``inputs.<name>`` resolved to run dirs (a run dir,
``runs:/<id>``, ``latest``; or several runs, a list or a ``-m`` sweep dir, whose tables
:meth:`RunInputs.read` merges: :mod:`saleval.pipeline.records.merge`), each parent's record
(:class:`~saleval.pipeline.records.run_record.RunRecord`) and ``config.yaml`` read once, and the
one provenance rule applied (:mod:`saleval.pipeline.records.provenance`: adopt the parents' dataset, model,
max_length, study target and population when the config gives none, check them when it
does). It writes nothing and logs nothing, so it can be built, and fail, before a run
exists; :class:`saleval.pipeline.stage.Stage` owns the run's lifecycle.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.modeling.data import complete_label_names
from saleval.pipeline import stage_table
from saleval.pipeline.records import merge, provenance
from saleval.pipeline.records.input_paths import (
    LATEST,
    UNSET,
    InputError,
    input_path_problem,
    kind_problem,
    latest_link,
)
from saleval.pipeline.records.provenance import Provenance
from saleval.pipeline.records.run_record import (
    ALLOW_UNFINISHED,
    RUN_JSON,
    RunRecord,
    read_run_config,
)
from saleval.pipeline.tables import TableSpec
from saleval.pipeline.tracker import tracking_health, tracking_reads

#: the stage whose runs an input names (``inputs.<name>=latest`` looks there), from the
#: stage table
PRODUCERS = stage_table.producers()
#: where, under the output root, a run read through ``runs:/<id>`` that is not on this
#: machine is downloaded to
DOWNLOADS = "downloads"


def resolve_input(
    name: str,
    spec: str | os.PathLike[str],
    output_root: Any = None,
    allow_unfinished: bool = False,
) -> Path:
    """A run dir, ``runs:/<run id>`` or ``latest`` → a local run dir holding that run's files.

    The run must have FINISHED (:meth:`~saleval.pipeline.records.run_record.RunRecord.unfinished_message`)
    unless ``allow_unfinished``. ``output_root``: where ``latest`` is looked for and a
    run not on this machine is downloaded to (default :func:`saleval.paths.output_root`)."""
    run_dir = _locate(name, str(spec), output_root)
    if not allow_unfinished:
        problem = RunRecord.read(run_dir).unfinished_message(name, run_dir)
        if problem:
            raise InputError(problem)
    return run_dir


def _locate(name: str, spec: str, output_root: Any) -> Path:
    """Where the run ``spec`` names sits (downloaded first when it is an MLflow run that is
    not on this machine)."""
    if spec in UNSET:
        raise InputError(f"inputs.{name} is required: pass inputs.{name}=<run dir or runs:/<id>>")
    root = paths.output_root(output_root)
    problem = input_path_problem(name, spec, root)
    if problem:
        raise InputError(problem)
    if spec == LATEST:
        spec = str(latest_link(root, PRODUCERS.get(name, name)).resolve())
    if spec.startswith("runs:/"):
        run_id = spec.removeprefix("runs:/").strip("/").split("/")[0]
        tracking_health.check_store(mlflow.get_tracking_uri())  # one line when it is down
        try:
            run = mlflow.tracking.MlflowClient().get_run(run_id)
        except mlflow.exceptions.MlflowException as err:
            cause = tracking_health.store_failure(err)
            if cause is not None and not cause.startswith("403"):
                raise tracking_health.TrackingError(
                    f"inputs.{name}={spec}: the tracking store "
                    f"{tracking_health.redact(mlflow.get_tracking_uri())} failed ({cause})"
                ) from err
            raise InputError(f"inputs.{name}={spec}: no such MLflow run ({err})") from err
        local = run.data.tags.get("run_dir")
        if local and RunRecord.exists(local):
            return Path(local)
        target = root / DOWNLOADS / run_id
        if not RunRecord.exists(target):
            target.mkdir(parents=True, exist_ok=True)
            tracking_reads.download_run(run_id, target)
        return target
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise InputError(f"inputs.{name}={spec}: not a directory")
    if not RunRecord.exists(path):
        raise InputError(f"inputs.{name}={spec}: {RUN_JSON} missing; is this a saleval run dir?")
    return path.resolve()


def resolve_inputs(
    name: str, value: Any, output_root: Any = None, allow_unfinished: bool = False
) -> list[Path]:
    """Every run dir an ``inputs.<name>`` value names: one run (:func:`resolve_input`), a
    list of runs, a ``-m`` sweep dir (its jobs) or a ``saleval-run`` dir (its run of the
    stage producing ``<name>``); see :mod:`saleval.pipeline.records.merge`. Each must have
    FINISHED unless ``allow_unfinished``. ``output_root``: a path or a composed config
    (:func:`saleval.paths.output_root`)."""
    unset = value is None or (isinstance(value, str) and value in UNSET)
    try:  # an unset value is resolved as given, which says what to pass
        specs = (
            [str(value or "")]
            if unset
            else merge.expand(name, value, PRODUCERS.get(name, name), allow_unfinished)
        )
    except merge.MergeError as err:
        raise InputError(str(err)) from err
    runs = [resolve_input(name, s, output_root, allow_unfinished) for s in specs]
    seen: dict[Path, int] = {}
    for i, p in enumerate(runs):  # a run given twice would count its tables twice
        if p in seen:
            raise InputError(f"inputs.{name}: run {p} is given twice (items {seen[p]} and {i})")
        seen[p] = i
    return runs


#: what ``inputs.model`` takes, said where it is missing
MODEL_INPUT = "a saleval train run, a save_pretrained checkpoint directory, or a hub id"


def model_input(
    cfg: DictConfig, fallback: str | None = None, hint: str = ""
) -> tuple[str, str | None, str | None]:
    """A stage's required ``inputs.model``: ``(spec, run, checkpoint)``, the value as given
    and what :func:`run_or_checkpoint` makes of it. ``fallback`` stands in where it is not
    given (explain's ``model=prompted model.pretrained=<dir>``), ``hint`` names it in the
    error. Why one function: the explain and metrics stages both need a model and must say
    the same thing when none is given.

    >>> model_input(OmegaConf.create({"inputs": {"model": "bert-base-uncased"}}))
    ('bert-base-uncased', None, 'bert-base-uncased')
    """
    spec = given_input(cfg, "model") or fallback
    if spec is None:
        raise InputError(f"inputs.model is required: {MODEL_INPUT}{hint}")
    return (spec, *run_or_checkpoint(spec))


def run_or_checkpoint(spec: str) -> tuple[str | None, str | None]:
    """``inputs.model``: a saleval train run (``runs:/<id>`` or a dir with ``run.json``)
    becomes a parent run; anything else (a ``save_pretrained`` directory, a hub id) is a
    checkpoint to load, with no parent run and no provenance but its name.

    >>> run_or_checkpoint("runs:/0123")
    ('runs:/0123', None)
    >>> run_or_checkpoint("bert-base-uncased")
    (None, 'bert-base-uncased')
    """
    if spec.startswith("runs:/") or spec == LATEST or RunRecord.exists(spec):
        return spec, None
    # a local path that is not there
    problem = input_path_problem("model", spec, paths.output_root())
    if problem:
        raise InputError(problem)
    return None, spec


def file_input(
    name: str, filename: str, spec: str, output_root: str | Path | None = None
) -> tuple[Path, str | None]:
    """An ``inputs.<name>`` that names a file: a plain file, or ``filename`` in the run dir
    it names (a dir, ``runs:/<id>`` or ``latest``) → (the file, the run dir to record as
    parent, or None for a file outside any run). A file is not checked here: its reader
    names what is wrong with it."""
    if spec.startswith("runs:/") or spec == LATEST:
        run_dir = resolve_input(name, spec, output_root)
        return run_dir / filename, str(run_dir)
    path = Path(spec).expanduser().resolve()
    if path.is_dir():
        return path / filename, str(path) if RunRecord.exists(path) else None
    if path.is_file():
        in_run = path.name == filename and RunRecord.exists(path.parent)
        return path, str(path.parent) if in_run else None
    problem = input_path_problem(name, spec, paths.output_root(output_root))
    raise InputError(problem or f"inputs.{name}={spec}: no such file or directory")


def given_input(cfg: DictConfig, key: str) -> str | None:
    """``inputs.<key>`` as a string, or None when left at ``???``/null/empty."""
    inputs = OmegaConf.select(cfg, "inputs")
    if inputs is None or key not in inputs or OmegaConf.is_missing(inputs, key):
        return None
    value = inputs[key]
    return None if value is None or value in UNSET else str(value)


class RunInputs(Mapping[str, Path]):
    """The parent runs of one stage run, read once, and the provenance they give it.

    Building it resolves ``inputs`` (input name → value; None values are left out), reads
    every parent's record and ``config.yaml``, and resolves the run's provenance:
    ``inherits`` names the fields taken from the parents (names, or field → input names;
    None: every field from every parent), ``requires`` the fields that must then be known,
    ``simulated`` marks a run that is simulated whatever its parents say. A dataset adopted
    from a parent is written into ``cfg`` with its whole config node.

    As a mapping it is input name → the input's run dir (its first run when it names
    several: the runs of one input agree on what is inherited), so a stage reads
    ``st.inputs["explain"]``; ``st.inputs.parents``, ``parent_configs`` and
    ``parent_provenance`` hold that run's record, config and provenance, and
    :meth:`read` and :meth:`runs_of` reach every run of an input.
    """

    def __init__(
        self,
        cfg: DictConfig,
        stage: str,
        inputs: Mapping[str, Any] | None = None,
        inherits: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
        requires: Sequence[str] = (),
        simulated: bool = False,
    ) -> None:
        allow = bool(OmegaConf.select(cfg, ALLOW_UNFINISHED, default=False))
        #: every run behind each input (several for a list or a sweep dir: saleval.pipeline.records.merge)
        self.input_runs: dict[str, list[Path]] = {
            k: resolve_inputs(k, v, cfg, allow) for k, v in (inputs or {}).items() if v is not None
        }
        #: per input, the label of each of its runs (the input's name; ``<name>.<i>``
        #: when it has several), named once here for every check and record
        self.labels: dict[str, list[str]] = {
            k: [merge.label(k, i, len(ps)) for i in range(len(ps))]
            for k, ps in self.input_runs.items()
        }
        #: each run by its label
        self.runs: dict[str, Path] = {
            lab: p for k, ps in self.input_runs.items() for lab, p in zip(self.labels[k], ps)
        }
        #: each parent run's record by label, read once
        self.records: dict[str, RunRecord] = {k: RunRecord.read(p) for k, p in self.runs.items()}
        # each input is a run of a stage it takes (inputs.crowd an import run...), checked
        # before anything is read from its tables
        for name, labels in self.labels.items():
            for label in labels:
                problem = kind_problem(name, self.runs[label], self.records[label].stage, stage)
                if problem:
                    raise InputError(problem)
        # each table a parent recorded is still the one it wrote (its checksum), before a
        # stage reads any: a table edited, cut short or damaged since is named with its run
        for label, run in self.runs.items():
            changed = self.records[label].changed_tables(run)
            if changed:
                raise InputError(self.records[label].changed_message(run, changed))
        #: the parents read although they had not finished (allow_unfinished_inputs=true)
        self.unfinished = tuple(
            mark for k, p in self.runs.items() if (mark := self.records[k].unfinished_mark(p))
        )
        #: each parent run's config.yaml by label, read once
        self.configs = {k: read_run_config(p) for k, p in self.runs.items()}
        self._provenance = {
            k: self.records[k].provenance_of_run(p, self.configs[k]) for k, p in self.runs.items()
        }
        first = {k: labels[0] for k, labels in self.labels.items()}
        #: per input, its (first) run, by which the mapping answers
        self._first: dict[str, Path] = {k: self.runs[f] for k, f in first.items()}
        #: per input, its (first) run's record, config and provenance
        self.parents: dict[str, RunRecord] = {k: self.records[f] for k, f in first.items()}
        self.parent_configs: dict[str, DictConfig] = {k: self.configs[f] for k, f in first.items()}
        self.parent_provenance: dict[str, Provenance] = {
            k: self._provenance[f] for k, f in first.items()
        }
        complete_label_names(cfg)  # a local dataset given without label names
        if isinstance(inherits, Mapping):  # an input's name stands for each of its runs
            inherits = {
                f: [label for n in names for label in self.labels.get(n, [])]
                for f, names in inherits.items()
            }
        where = {k: str(p) for k, p in self.runs.items()}
        #: the run's provenance: given by ``cfg``, adopted from and checked against its
        #: parents (the one rule: saleval.pipeline.records.provenance), known where ``requires`` says
        self.provenance = provenance.of_run(
            cfg, self._provenance, where, inherits, simulated, self.unfinished
        )
        provenance.require(self.provenance, stage, requires, dict(self.items()))
        provenance.adopt_dataset(cfg, self.provenance.dataset, self.parent_configs)

    def __getitem__(self, name: str) -> Path:
        return self._first[name]

    def max_length(self, own: int | None) -> int | None:
        """The token limit a stage segments texts with: ``own`` (its setting, or the one it
        adopted from an explain run), else the ``max_length`` its model's train run
        recorded (``inputs.model``); None when neither says. The explain stage falls back
        so to the length the model was trained at, and the metrics stage so re-segments
        texts of explain runs written before they recorded their own."""
        if own:
            return int(own)
        model = self.parent_provenance.get("model")
        return None if model is None or not model.max_length else int(model.max_length)

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def read(self, spec: TableSpec, name: str) -> pd.DataFrame:
        """``spec``'s table of ``inputs.<name>``: of its run, or merged over its runs when it
        names several (a list, a sweep dir; :func:`saleval.pipeline.records.merge.read_merged`)."""
        return merge.read_merged(spec, self.input_runs[name], f"inputs.{name}")

    def runs_of(self, name: str) -> list[tuple[Path, RunRecord, DictConfig]]:
        """Every run behind ``inputs.<name>``: (run dir, record, config.yaml)."""
        return [
            (p, self.records[label], self.configs[label])
            for label, p in zip(self.labels[name], self.input_runs[name])
        ]
