"""Structured config schemas (dataclasses) registered in Hydra's ConfigStore.

Every config group this package covers and every stage root has a schema here, so an
unknown key fails when a config is composed (naming the key) and each default is
written once, in its dataclass; the YAML group files state only what differs.
:func:`register_configs` must run before Hydra composes a config (``saleval.stage``'s
console scripts, ``saleval-run``, the tests' compose helpers do).

>>> register_configs(); register_configs()  # idempotent
>>> from hydra.core.config_store import ConfigStore
>>> "train_schema.yaml" in ConfigStore.instance().list("")
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from saleval.config.annotate import AnnotateAction, AnnotateConfig
from saleval.config.common import KGridConfig, PathsConfig, TrackingConfig
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
from saleval.crowd.config import register_schemas as crowd_schemas
from saleval.metrics_config import store_schema as metrics_schema

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

T = TypeVar("T")


def to_schema(schema: type[T], cfg: T | Mapping[str, Any] | DictConfig) -> T:
    """``cfg`` as an instance of the dataclass ``schema``: a composed node (resolved in its
    own config, so ``${paths.data_root}`` works), or a plain mapping such as a run's
    recorded ``config.yaml`` node. Unknown keys, wrong types and missing values raise
    OmegaConf's errors, which name the key.

    >>> to_schema(KGridConfig, {"name": "g", "ks": ["5", 10]}).ks
    [5, 10]
    >>> to_schema(KGridConfig, {"name": "g", "ks": [5], "k": 3})
    Traceback (most recent call last):
    ...
    omegaconf.errors.ConfigKeyError: Key 'k' not in 'KGridConfig'
        full_key: k
        object_type=KGridConfig
    """
    if isinstance(cfg, schema):
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    assert isinstance(obj, schema)
    return obj


_registered = False


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (once per process): the stage roots here,
    the group schemas the YAML defaults lists name (``metrics/schema``,
    ``study/study_schema``, ``simulation/simulation_schema``, ``crowd/answers_schema``,
    ``crowd/lu2024_schema``) from the modules that own them."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for name, schema in ROOTS.items():
        cs.store(name=name, node=schema)
    crowd_schemas()
    metrics_schema()
    _registered = True
