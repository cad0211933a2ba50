"""Structured config schemas (dataclasses) registered in Hydra's ConfigStore.

Every config group this package covers and every stage root has a schema here, so an
unknown key fails when a config is composed (naming the key) and each default is
written once, in its dataclass; the YAML group files state only what differs.
:func:`register_configs` must run before Hydra composes a config (``saleval.pipeline.stage``'s
console scripts, ``saleval-run``, the tests' compose helpers do).

>>> register_configs(); register_configs()  # idempotent
>>> from hydra.core.config_store import ConfigStore
>>> "train_schema.yaml" in ConfigStore.instance().list("")
True
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.config_store import ConfigStore

from saleval.config.annotate import AnnotateAction, AnnotateConfig
from saleval.config.common import KGridConfig, PathsConfig, TrackingConfig
from saleval.config.crowd import register_schemas as crowd_schemas
from saleval.config.dataset import DatasetConfig, DatasetFiles, DataSource, HubConfig
from saleval.config.model import ModelConfig
from saleval.config.profile import ProfileConfig
from saleval.config.shortcut import ShortcutConfig, ShortcutExplainConfig, ShortcutKind
from saleval.config.stages import ROOTS
from saleval.config.trainer import (
    EarlyStoppingConfig,
    LoaderConfig,
    OptimizerConfig,
    Scheduler,
    TrainerConfig,
)
from saleval.metrics.config import store_schema as metrics_schema
from saleval.schema import to_schema

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
    "register_configs",
    "to_schema",
]

_registered = False


def register_configs(overrides: Sequence[str] = ()) -> None:
    """Store every schema in Hydra's ConfigStore: the stage roots here, the group schemas
    the YAML defaults lists name (``metrics/schema``, ``study/study_schema``,
    ``simulation/simulation_schema``, ``crowd/answers_schema``, ``crowd/lu2024_schema``)
    from the modules that own them. The static ones once per process; ``metrics/schema``
    on every call, after importing the plugin modules ``overrides`` (a command line) name,
    because it holds the settings of every metric registered so far."""
    global _registered
    metrics_schema(overrides)
    if _registered:
        return
    cs = ConfigStore.instance()
    for name, schema in ROOTS.items():
        cs.store(name=name, node=schema)
    crowd_schemas()
    _registered = True
