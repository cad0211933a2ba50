"""One rule for reading a config node as its typed schema (docs/architecture.md §4).

Every config group that has a dataclass schema (``saleval.config``,
``saleval.metrics.config``, ``saleval.config.crowd``) is turned into its typed object by
:func:`to_schema`: defaults come from the dataclass, interpolations are resolved in the
node's own config first, and an unknown key, a wrong type or a missing value fails with
OmegaConf's error, which names the key. This module imports nothing of saleval, so every
layer can use it.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Grid:
...     name: str = "paper"
...     ks: list[int] = field(default_factory=lambda: [5, 10])
>>> to_schema(Grid, {"ks": ["5", 20]}).ks
[5, 20]
>>> to_schema(Grid, {"k": 3})
Traceback (most recent call last):
...
omegaconf.errors.ConfigKeyError: Key 'k' not in 'Grid'
    full_key: k
    object_type=Grid
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


def to_schema(schema: type[T], cfg: T | Mapping[str, Any] | DictConfig) -> T:
    """``cfg`` as an instance of the dataclass ``schema``: a composed node (resolved in its
    own config, so ``${paths.data_root}`` works), or a plain mapping such as a run's
    recorded ``config.yaml`` node; an instance of ``schema`` is returned as it is."""
    if isinstance(cfg, schema):
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    assert isinstance(obj, schema)
    return obj
