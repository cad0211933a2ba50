"""Import crowd answers (docs/aggregation.md#import): one source class per ``crowd`` config,
built by Hydra.

Two sources reach the same tables (:class:`~saleval.crowd.reading.CrowdImport`):

* :class:`AnswersSource` (``crowd=answers``): a long answer file
  (:mod:`saleval.crowd.long_format`) joined against a task run, then the quality
  filters (:mod:`saleval.crowd.quality`) and the configured aggregator
  (:mod:`saleval.crowd.aggregation`);
* :class:`PublishedSource` (``crowd=lu2024``): the published aggregated file
  (:mod:`saleval.crowd.lu2024`), A[i, j, k] as given.

Each source *is* its config schema (a subclass of the dataclass in
:mod:`saleval.config.crowd`) plus what it does, so its fields are declared once;
:func:`crowd_source` builds the one a config's ``_target_`` names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from saleval import tables
from saleval.config.crowd import AnswersCrowdConfig, PublishedCrowdConfig
from saleval.crowd import aggregation, quality
from saleval.crowd.answers import AnswerParser
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.long_format import read_answers
from saleval.crowd.lu2024 import read_lu2024
from saleval.crowd.reading import CrowdImport, empty_annotations, enforce_policy

log = logging.getLogger(__name__)


def crowd_source(node: Any) -> AnswersSource | PublishedSource:
    """The source a ``crowd`` config names in ``_target_``, built by ``hydra.utils.instantiate``.

    The node is first merged into the target's own schema, so a config composed without
    it still gets its defaults and fails on unknown keys.
    """
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(container, dict) or not container.get("_target_"):
        raise CrowdImportError(
            "the crowd config names no _target_; choose a source with crowd=answers or crowd=lu2024"
        )
    typed = OmegaConf.merge(OmegaConf.structured(get_class(container["_target_"])), container)
    source = instantiate(typed, _convert_="object", _recursive_=False)
    if not isinstance(source, AnswersSource | PublishedSource):
        raise CrowdImportError(
            f"crowd._target_={container['_target_']} is not a crowd source "
            "(AnswersSource or PublishedSource, or a subclass)"
        )
    return source


@dataclass
class AnswersSource(AnswersCrowdConfig):
    """``crowd=answers``: read, filter and aggregate one long answer file."""

    format: ClassVar[str] = "answers"

    def build_aggregator(self) -> aggregation.Aggregator:
        """The configured aggregator: ``crowd.aggregator`` through ``hydra.utils.instantiate``."""
        if "name" in self.aggregator:
            raise CrowdImportError(
                f"crowd.aggregator.name={self.aggregator['name']} is no longer read; choose the "
                "aggregator with crowd/aggregator=<strict_majority|majority_vote|dawid_skene|"
                "mace|glad>"
            )
        return instantiate(self.aggregator)

    def import_(
        self,
        path: str | Path,
        tasks: pd.DataFrame,
        bundles: pd.DataFrame | None,
        label_names: Sequence[str],
        expert: pd.DataFrame | None = None,
    ) -> CrowdImport:
        """The whole of ``saleval-import`` for long answers.

        Raises :class:`CrowdImportError` under policy ``strict`` when any row is rejected.
        """
        accepted, rejects, info = read_answers(
            path, tasks, bundles, label_names, self.idk, self.encoding, self.worker_id_case
        )
        enforce_policy(rejects, self.policy, path)
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
        return CrowdImport(kept, aggregated, rejects, report, removed)


@dataclass
class PublishedSource(PublishedCrowdConfig):
    """``crowd=lu2024``: A[i, j, k] as published, no worker-level data."""

    format: ClassVar[str] = "lu2024"

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

    def import_(self, path: str | Path, label_names: Sequence[str], dataset: str) -> CrowdImport:
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
