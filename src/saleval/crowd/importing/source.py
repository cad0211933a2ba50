"""The one interface of a crowd source (docs/extending.md#a-crowd-source).

A crowd source turns what a crowd produced (a long answer file, the published results of
a study, a platform's own export...) into the import's tables
(:class:`~saleval.crowd.importing.rows.CrowdImport`). ``saleval-import`` runs every
source the same way, in two steps, so it never asks which source it holds:

1. :meth:`CrowdSource.locate`, before the run starts: the file the import reads and the
   runs it reads with it (:class:`SourceFile`). The stage records them as the run's
   parents, tags and params, so a missing input fails before a run dir exists;
2. :meth:`CrowdSource.import_`, inside the run: the tables, from an
   :class:`ImportContext` (the file, the parent run dirs, the dataset's labels).

Step 1 and the opening of the run are one function, :func:`source_run`, the same for
every stage that reads a source's file (``saleval-import``, ``-score``, ``-simulate``,
``-plan``).

A source is a dataclass whose fields are its config: ``conf/crowd/<name>.yaml`` names it
in ``_target_`` and :func:`crowd_source` builds it. The built-in ones are in
:mod:`saleval.crowd.importing.builtin`.

Some sources can do more than be imported, and say so in :attr:`CrowdSource.capabilities`;
the other stages ask a source what it provides, never which class it is:

* :attr:`Capability.verdicts`: what :meth:`~CrowdSource.import_` returns are already the
  crowd's final verdicts (nothing to filter or aggregate), so ``saleval-score`` and
  ``saleval-plan`` read them without an import run;
* :attr:`Capability.tasks`: :meth:`~CrowdSource.tasks` gives the tasks and samples the
  crowd answered, which ``saleval-simulate`` and ``saleval-plan`` give a simulated crowd.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.config.crowd import Policy
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.rows import CrowdImport, sha256_file
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.run_inputs import file_input, given_input
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking

FileFinder = Callable[[str, str], tuple[Path, str | None]]
"""``(input name, file name)`` → the file ``inputs.<name>`` names (a plain file, or that
file in the run dir it names; ``runs:/<id>`` and ``latest`` resolved) and the run dir to
record as its parent (None for a file outside any run)."""


class Capability(StrEnum):
    """What a source provides besides an import (module docstring)."""

    verdicts = "verdicts"  # import_ gives the final verdicts A[i, j, k]: score them as they are
    tasks = "tasks"  # tasks(): the tasks and samples the crowd answered


@dataclass(frozen=True)
class Given:
    """What a stage was given, before anything is read."""

    inputs: Mapping[str, str]  # inputs.<name> as given; names left at ??? or null are absent
    dataset: str | None  # dataset.name when a dataset is given (else a parent run brings it)
    find: FileFinder

    @classmethod
    def of(cls, cfg: DictConfig, stage: str) -> Given:
        """What ``cfg`` gives ``saleval-<stage>``: its ``inputs.*``, the dataset, and how a
        file input is found (:func:`saleval.pipeline.records.run_inputs.file_input`)."""
        names = OmegaConf.select(cfg, "inputs", default=None) or {}
        inputs = {str(k): v for k in names if (v := given_input(cfg, str(k))) is not None}
        output_root = paths.output_root(cfg)

        def find(name: str, filename: str) -> tuple[Path, str | None]:
            if name not in inputs:
                raise InputError(f"saleval-{stage} needs inputs.{name}=<file or run dir>")
            return file_input(name, filename, inputs[name], output_root)

        return cls(inputs, OmegaConf.select(cfg, "dataset.name", default=None), find)


@dataclass(frozen=True)
class SourceFile:
    """The file an import reads and the runs it reads with it, known before the run starts."""

    path: Path
    sha256: str  # empty when the file does not exist (its reader then says so, located)
    #: input name -> run dir, runs:/<id> or latest: the run's parents (e.g. the task run)
    parents: Mapping[str, str] = field(default_factory=dict)
    #: provenance fields the parents must give (e.g. ``("dataset",)``)
    requires: tuple[str, ...] = ()
    #: provenance the source itself fixes (the published study: target gold, population
    #: correct), recorded before the file is read
    provides: Mapping[str, Any] = field(default_factory=dict)
    #: the run's MLflow tags ``<tag>_path`` and ``<tag>_sha256`` name the file
    tag: str = "source"

    @classmethod
    def at(cls, path: Path, **fields: Any) -> SourceFile:
        """The file at ``path`` with its hash (empty when there is no such file yet)."""
        return cls(path, sha256_file(path) if path.is_file() else "", **fields)

    @property
    def record(self) -> dict[str, str]:
        """How ``import_report.json`` names the file."""
        return {"path": str(self.path), "sha256": self.sha256}


@dataclass(frozen=True)
class ImportContext:
    """What :meth:`CrowdSource.import_` reads: its file, the parent run dirs (resolved) and
    the dataset's label names in class-index order."""

    file: SourceFile
    runs: Mapping[str, Path]
    label_names: list[str]
    dataset: str


@dataclass
class CrowdTasks:
    """The tasks a crowd answered (:attr:`Capability.tasks`), to answer again.

    ``tasks``: ``tables.TASKS`` (display text exactly as the crowd saw it); ``samples``:
    ``sample_id, text, label`` (full texts); ``aggregated``: that crowd's A[i, j, k]
    (``tables.AGGREGATED``); ``rejects``: rows the reader refused; ``info``: what the
    reader counted.
    """

    tasks: pd.DataFrame
    samples: pd.DataFrame
    aggregated: pd.DataFrame
    rejects: pd.DataFrame
    info: dict[str, Any]


class CrowdSource(abc.ABC):
    """Base of every crowd source; a subclass is also a dataclass of its config fields,
    ``name`` and ``policy`` among them (:class:`saleval.config.crowd.AnswersCrowdConfig`)."""

    #: written as ``format`` in ``import_report.json``
    format: ClassVar[str]
    #: what it provides besides an import (module docstring); none by default
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    name: str
    policy: Policy

    def provides(self, capability: Capability) -> bool:
        """Whether a stage may ask this source for ``capability``."""
        return capability in self.capabilities

    def tasks(self, ctx: ImportContext) -> CrowdTasks:
        """:attr:`Capability.tasks`: the tasks and samples the crowd answered, read from
        ``ctx.file`` and checked under the source's policy."""
        raise CrowdImportError(f"crowd={self.name} does not provide the tasks its crowd answered")

    @abc.abstractmethod
    def locate(self, given: Given) -> SourceFile:
        """The file to read and its parent runs; a missing input fails here, naming it."""

    @abc.abstractmethod
    def import_(self, ctx: ImportContext) -> CrowdImport:
        """The import's tables. Rejected rows go to ``rejects`` (under policy ``strict``
        :func:`~saleval.crowd.importing.rows.enforce_policy` raises instead)."""


def crowd_source(node: Any) -> CrowdSource:
    """The source a ``crowd`` config names in ``_target_``, built by ``hydra.utils.instantiate``.

    The node is first merged into the target's own schema, so a config composed without
    it still gets its defaults and fails on unknown keys.
    """
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(container, dict) or not container.get("_target_"):
        raise CrowdImportError(
            "the crowd config names no _target_; choose a source with crowd=answers or crowd=lu2024"
        )
    target = container["_target_"]
    try:
        cls = get_class(target)
    except (ImportError, ValueError) as err:
        raise CrowdImportError(f"crowd._target_={target}: cannot import it ({err})") from err
    if not (is_dataclass(cls) and issubclass(cls, CrowdSource)):
        raise CrowdImportError(
            f"crowd._target_={target} is not a crowd source: make it a dataclass subclassing "
            "saleval.crowd.importing.source.CrowdSource (docs/extending.md#a-crowd-source)"
        )
    typed = OmegaConf.merge(OmegaConf.structured(cls), container)
    source: CrowdSource = instantiate(typed, _convert_="object", _recursive_=False)
    return source


@contextmanager
def source_run(
    cfg: DictConfig,
    stage: str,
    source: CrowdSource,
    tags: Mapping[str, str] | None = None,
    simulated: bool = False,
) -> Iterator[tuple[Stage, SourceFile]]:
    """The run of ``saleval-<stage>`` on ``source``'s file, the same for every stage that
    reads one: the file and its parent runs located before the run starts (a missing input
    fails before a run dir exists), the run opened on those parents, the file named by the
    run's tags (``<tag>_path``, ``<tag>_sha256``) and params (``source.path``,
    ``source.sha256``), and the provenance the source fixes (:attr:`SourceFile.provides`)
    recorded before the file is read. ``tags``: the stage's own; ``simulated``: a simulated
    crowd answers in this run.

    Yields the stage and the located file::

        with source_run(cfg, "score", source) as (st, file):
            imported = source.import_(ImportContext(file, dict(st.inputs), labels, dataset))
    """
    file = source.locate(Given.of(cfg, stage))
    named = {f"{file.tag}_path": str(file.path), f"{file.tag}_sha256": file.sha256}
    with Stage(
        cfg,
        stage,
        dict(file.parents),
        tags={**(tags or {}), **named},
        requires=list(file.requires),
        simulated=simulated,
    ) as st:
        if file.provides:
            st.provide(**file.provides)
        tracking.log_params({"source.path": str(file.path), "source.sha256": file.sha256})
        yield st, file
