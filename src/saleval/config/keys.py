"""Keys a composed config has but its schema does not: the rule that makes ``+key=value``
fail like ``key=value`` (docs/architecture.md, section 4).

Hydra's ``+`` opens a node and adds the key, even inside a structured (dataclass) node, so
``+data.n_sample=8`` would compose, be ignored by every stage and start the default run.
Only the open mappings of a schema (``inputs``, ``profile.stages``, a method's
arguments...) may grow; a key added to a dataclass node is a typo and is refused here,
before anything runs, with the node's own keys and the nearest one.

>>> from omegaconf import OmegaConf
>>> from saleval.config.stages import ExplainStageConfig
>>> cfg = OmegaConf.structured(ExplainStageConfig)
>>> OmegaConf.update(cfg, "data.n_sample", 8, force_add=True)  # what `+data.n_sample=8` does
>>> print(unknown_key_error(cfg))  # doctest: +NORMALIZE_WHITESPACE
data.n_sample is not a setting of data (ExplainData): did you mean data.n_samples? Its
keys: split, n_samples, sample_ids, population
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from saleval.errors import UserError


class UnknownKeyError(UserError, KeyError):
    """A config key no schema declares (added with ``+``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def unknown_keys(node: DictConfig | ListConfig, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(full key, schema) of every key under ``node`` that a dataclass node does not declare.

    Interpolations are not resolved (a key's presence is all that is asked); the ``hydra``
    node is Hydra's own and is skipped.
    """
    if node._is_none() or node._is_missing() or node._is_interpolation():
        return
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            child = node._get_node(i)
            if isinstance(child, DictConfig | ListConfig):
                yield from unknown_keys(child, f"{prefix}[{i}]")
        return
    schema = OmegaConf.get_type(node)
    declared = (
        {f.name for f in dataclasses.fields(schema)}
        if isinstance(schema, type) and dataclasses.is_dataclass(schema)
        else None
    )
    for key in map(str, node):
        child = node._get_node(key)
        full = f"{prefix}.{key}" if prefix else key
        if not prefix and key == "hydra":
            continue
        if declared is not None and key not in declared:
            assert isinstance(schema, type)
            yield full, schema
        elif isinstance(child, DictConfig | ListConfig):
            yield from unknown_keys(child, full)


def unknown_key_error(cfg: DictConfig) -> str | None:
    """One line about the first undeclared key of ``cfg`` (its node's keys and the nearest
    one), or None when every key is declared."""
    for full, schema in unknown_keys(cfg):
        parent, _, key = full.rpartition(".")
        keys = [f.name for f in dataclasses.fields(schema)]
        near = difflib.get_close_matches(key, keys, n=1)
        hint = f"did you mean {parent + '.' if parent else ''}{near[0]}? " if near else ""
        return (
            f"{full} is not a setting of {parent or 'the config'} ({schema.__name__}): "
            f"{hint}Its keys: {', '.join(keys)}"
        )
    return None


def check_keys(cfg: DictConfig) -> None:
    """Raise :class:`UnknownKeyError` when ``cfg`` has a key its schema does not declare."""
    message = unknown_key_error(cfg)
    if message is not None:
        raise UnknownKeyError(message)
