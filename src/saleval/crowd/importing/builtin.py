"""The built-in crowd sources (docs/aggregation.md#import): one class per ``crowd`` config,
each a :class:`~saleval.crowd.importing.source.CrowdSource`, built by Hydra.

Two sources reach the same tables (:class:`~saleval.crowd.importing.rows.CrowdImport`):

* :class:`AnswersSource` (``crowd=answers``): a long answer file
  (:mod:`saleval.crowd.importing.long_format`) joined against a task run, then the quality
  filters (:mod:`saleval.crowd.importing.quality`) and the configured aggregator
  (:mod:`saleval.crowd.importing.aggregation`);
* :class:`PublishedSource` (``crowd=lu2024``): the published aggregated file
  (:mod:`saleval.crowd.importing.published_format`), A[i, j, k] as given.

Each source *is* its config schema (a subclass of the dataclass in
:mod:`saleval.config.crowd`) plus what it does, so its fields are declared once;
:func:`saleval.crowd.importing.source.crowd_source` builds the one a config's
``_target_`` names.
Besides the interface each keeps its reader (``read``) for the stages that hold the
tables already (the simulated crowd, the published study's scores and plans).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from hydra.utils import instantiate

from saleval import paths
from saleval.config.crowd import AnswersCrowdConfig, PublishedCrowdConfig
from saleval.crowd.answers import AnswerParser
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing import aggregation, quality
from saleval.crowd.importing.long_format import ANSWER_FILE, read_answers
from saleval.crowd.importing.published_format import read_lu2024
from saleval.crowd.importing.published_study import read_study
from saleval.crowd.importing.rows import CrowdImport, empty_annotations, enforce_policy, sha256_file
from saleval.crowd.importing.source import (
    Capability,
    CrowdSource,
    CrowdTasks,
    Given,
    ImportContext,
    SourceFile,
)
from saleval.pipeline import tables
from saleval.vocab import Population, Target

log = logging.getLogger(__name__)


def nothing_left(path: str | Path, report: dict[str, Any]) -> str:
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


def aggregator_options() -> list[str]:
    """The options of the ``crowd/aggregator`` group: one file each in
    ``conf/crowd/aggregator``, the one list of them (no message or comment lists them again).

    >>> "strict_majority" in aggregator_options()
    True
    """
    return sorted(p.stem for p in (paths.conf_dir() / "crowd" / "aggregator").glob("*.yaml"))


@dataclass
class AnswersSource(AnswersCrowdConfig, CrowdSource):
    """``crowd=answers``: read, filter and aggregate one long answer file."""

    format: ClassVar[str] = "answers"

    def build_aggregator(self) -> aggregation.Aggregator:
        """The configured aggregator: ``crowd.aggregator`` through ``hydra.utils.instantiate``."""
        if "name" in self.aggregator:
            raise CrowdImportError(
                f"crowd.aggregator.name={self.aggregator['name']} is no longer read; choose the "
                f"aggregator with crowd/aggregator=<{'|'.join(aggregator_options())}>"
            )
        return instantiate(self.aggregator)

    def locate(self, given: Given) -> SourceFile:
        """``inputs.answers`` (a file, or ``answers.csv`` in a run dir) and ``inputs.tasks``,
        whose run brings the dataset, the study's target and population."""
        tasks, answers = given.inputs.get("tasks"), given.inputs.get("answers")
        if tasks is None or answers is None:
            raise CrowdImportError(
                "saleval-import needs inputs.tasks=<tasks run> and inputs.answers=<answers.csv or "
                "run dir> (or crowd=lu2024 crowd.path=<published file> dataset=<name>)"
            )
        path, answers_run = given.find("answers", ANSWER_FILE)
        parents = {"tasks": tasks, **({"answers": answers_run} if answers_run else {})}
        return SourceFile.at(path, parents=parents, requires=("dataset",), tag="answers")

    def import_(self, ctx: ImportContext) -> CrowdImport:
        """The answers joined with the task run's tasks (and bundles, when it has them)."""
        tasks_dir = ctx.runs["tasks"]
        tasks = tables.TASKS.read(tasks_dir)
        bundles_path = tables.BUNDLES.path(tasks_dir)
        bundles = tables.BUNDLES.read(tasks_dir) if bundles_path.is_file() else None
        expert_path = self.expert.path
        expert = pd.read_csv(expert_path, dtype=str, keep_default_na=False) if expert_path else None
        result = self.read(ctx.file.path, tasks, bundles, ctx.label_names, expert=expert)
        task_file = tables.TASKS.path(tasks_dir)
        read = {"tasks": {"path": str(task_file), "sha256": sha256_file(task_file)}}
        return replace(result, inputs=read)

    def read(
        self,
        path: str | Path,
        tasks: pd.DataFrame,
        bundles: pd.DataFrame | None,
        label_names: Sequence[str],
        expert: pd.DataFrame | None = None,
    ) -> CrowdImport:
        """Read, filter and aggregate the answers of ``path`` to these tasks.

        Raises :class:`CrowdImportError` under policy ``strict`` when any row is rejected.
        """
        accepted, rejects, info = read_answers(
            path, tasks, bundles, label_names, self.idk, self.encoding, self.worker_id_case
        )
        enforce_policy(rejects, self.policy, path)
        simulated = bool(info.pop("simulated_column", False))
        annotations = tables.ANNOTATIONS.validate(accepted.drop(columns="row"), where=str(path))
        kept, removed, filter_log = quality.apply_filters(annotations, self.filters)
        aggregator = self.build_aggregator()
        aggregated = aggregation.aggregate(kept, tasks, aggregator)
        if (aggregated["n_answers"] == 0).any():
            log.warning(
                "%d of %d tasks have no answer left after import and filters; A = 0 for them",
                int((aggregated["n_answers"] == 0).sum()),
                len(aggregated),
            )
        report: dict[str, Any] = {
            "format": self.format,
            "policy": str(self.policy),
            **info,
            "rejects_by_field": rejects["field"].value_counts().to_dict(),
            "filters": filter_log,
            "n_annotations": len(kept),
            "n_workers": int(kept["worker_id"].nunique()),
            "n_tasks": len(aggregated),
            "tasks_without_answers": int((aggregated["n_answers"] == 0).sum()),
            "aggregator": {
                "name": type(aggregator).__name__,
                **{k: v for k, v in self.aggregator.items() if k != "_target_"},
            },
            "agreement": aggregation.agreement(kept, idk=str(self.agreement.idk)),
            "label_names": list(label_names),
        }
        if expert is not None:
            report["expert"] = aggregation.expert_check(
                expert, aggregated, tasks, AnswerParser(label_names, self.idk)
            )
        failure = None if len(kept) else nothing_left(path, report)
        return CrowdImport(kept, aggregated, rejects, report, removed, simulated, failure=failure)


@dataclass
class PublishedSource(PublishedCrowdConfig, CrowdSource):
    """``crowd=lu2024``: A[i, j, k] as published, no worker-level data; its file holds the
    final verdicts and the tasks they answer, so it provides both."""

    format: ClassVar[str] = "lu2024"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(Capability)

    def file(self, dataset: str | None) -> Path:
        """The published file, checked: it needs ``crowd.path`` and a dataset (for the label
        names); the errors say which is missing and how to give it."""
        if not self.path:
            raise CrowdImportError(
                "crowd=lu2024 needs crowd.path=<data root>/published/lu2024/<IMDB|AGNEWS>.csv"
            )
        if dataset is None:
            raise CrowdImportError(
                "crowd=lu2024 needs dataset=imdb or dataset=ag_news (for the label names)"
            )
        path = Path(str(self.path)).expanduser()
        if not path.is_file():
            raise CrowdImportError(f"crowd.path={path}: file not found")
        return path.resolve()

    def locate(self, given: Given) -> SourceFile:
        """``crowd.path``; the published study asked workers for the gold label of correctly
        classified samples, so the run's target and population are fixed here."""
        provides = {"target": Target.gold, "population": Population.correct}
        return SourceFile.at(self.file(given.dataset), provides=provides)

    def import_(self, ctx: ImportContext) -> CrowdImport:
        """The published file as the import's tables."""
        return self.read(ctx.file.path, ctx.label_names, ctx.dataset)

    def tasks(self, ctx: ImportContext) -> CrowdTasks:
        """The published tasks, samples and verdicts, checked under ``crowd.policy``."""
        study = read_study(ctx.file.path, ctx.label_names, ctx.dataset, self.methods)
        enforce_policy(study.rejects, self.policy, ctx.file.path)
        return study

    def read(self, path: str | Path, label_names: Sequence[str], dataset: str) -> CrowdImport:
        """Read and check the published file (``path`` overrides ``crowd.path``)."""
        aggregated, rejects, info = read_lu2024(
            path, label_names, dataset, self.methods, self.encoding
        )
        enforce_policy(rejects, self.policy, path)
        aggregated = tables.AGGREGATED.validate(aggregated, where=str(path))
        report = {
            "format": self.format,
            "policy": str(self.policy),
            **info,
            "n_accepted": len(aggregated),
            "rejects_by_field": rejects["field"].value_counts().to_dict(),
            "aggregator": {"name": "published majority vote (Correct column)"},
            "agreement": {"note": "individual answers are not published; no agreement statistic"},
            "filters": [],
            "label_names": list(label_names),
        }
        return CrowdImport(empty_annotations(), aggregated, rejects, report)


def aggregate_answers(
    path: str | Path, tasks: pd.DataFrame, bundles: pd.DataFrame | None, label_names: Sequence[str]
) -> CrowdImport:
    """Answers in the import format read, filtered and aggregated as ``crowd=answers``
    does with its defaults: what ``saleval-import`` would make of them (a simulated
    crowd's answers to a published study, in ``saleval-simulate``)."""
    return AnswersSource().read(path, tasks, bundles, label_names)
