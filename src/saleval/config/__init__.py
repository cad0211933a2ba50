"""Structured config schemas (dataclasses) registered in Hydra's ConfigStore.

Every config group this package covers and every stage root has a schema here, so an
unknown key fails when a config is composed (naming the key) and each default is
written once, in its dataclass; the YAML group files state only what differs. The
schemas are stored in Hydra's ConfigStore by
:func:`saleval.pipeline.compose.register_configs`, which runs before any composition
(the console scripts, ``saleval-run``, the tests' compose helpers). This package imports
nothing of the packages it configures (docs/architecture.md, "Layers"); the ``metrics``
group's schema lives with the metric registry (:mod:`saleval.metrics.config`).
"""

from __future__ import annotations

from saleval.config.annotate import AnnotateAction, AnnotateConfig
from saleval.config.common import KGridConfig, PathsConfig, TrackingConfig
from saleval.config.dataset import DatasetConfig, DatasetFiles, DataSource, HubConfig
from saleval.config.model import ModelConfig
from saleval.config.profile import ProfileConfig
from saleval.config.shortcut import ShortcutConfig, ShortcutExplainConfig, ShortcutKind
from saleval.config.trainer import (
    EarlyStoppingConfig,
    LoaderConfig,
    OptimizerConfig,
    Scheduler,
    TrainerConfig,
)

__all__ = [
    "AnnotateAction",
    "AnnotateConfig",
    "DataSource",
    "DatasetConfig",
    "DatasetFiles",
    "EarlyStoppingConfig",
    "HubConfig",
    "KGridConfig",
    "LoaderConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PathsConfig",
    "ProfileConfig",
    "Scheduler",
    "ShortcutConfig",
    "ShortcutExplainConfig",
    "ShortcutKind",
    "TrackingConfig",
    "TrainerConfig",
]
