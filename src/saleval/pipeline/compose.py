"""Every schema in Hydra's ConfigStore before a stage's config is composed, plugins first.

Composing needs three kinds of schema in the ConfigStore: each stage's root (the
dataclass its row of :data:`saleval.pipeline.stage_table.TABLE` names), the group
schemas that YAML ``defaults`` lists name (``study/study_schema``,
``crowd/answers_schema``, ...: :func:`saleval.config.crowd.register_schemas`) and
``metrics/schema``, whose ``settings`` node holds the settings of every registered
metric (:mod:`saleval.metrics.config`). A metric registers when its module is imported,
so :func:`register_configs` imports the modules ``metrics.plugins`` names first —
on the command line, in a ``metrics`` group file, a recipe or a profile — and their
settings are then checked at compose like every other key (docs/extending.md, *An
automated metric*). The console scripts, ``saleval-run`` and the tests' compose helper
all call it.

>>> register_configs() == register_configs() == []  # idempotent; no plugin named
True
>>> from hydra.core.config_store import ConfigStore
>>> "train_schema.yaml" in ConfigStore.instance().list("")
True
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.config import crowd, stages
from saleval.metrics.config import plugins_named, store_schema
from saleval.pipeline import stage_table
from saleval.pipeline.stage_table import StageSpec

_static_stored = False


def root_schema(row: StageSpec) -> type:
    """The root schema a stage-table row names: a dataclass of :mod:`saleval.config.stages`,
    or one named by its dotted path (``mypkg.mystage.MyStageConfig``), so a stage's schema
    may live in its own module (docs/extending.md, "A stage")."""
    if "." in row.schema:
        module, _, name = row.schema.rpartition(".")
        schema = getattr(importlib.import_module(module), name, None)
    else:
        schema = getattr(stages, row.schema, None)
    if not isinstance(schema, type):
        raise TypeError(f"stage {row.name}: no schema class {row.schema} in {stages.__name__}")
    return schema


def root_schemas() -> dict[str, type]:
    """ConfigStore name → root schema of every stage; ``conf/<stage>.yaml`` lists the name
    first in its ``defaults``."""
    return {row.schema_name: root_schema(row) for row in stage_table.TABLE}


def register_configs(overrides: Sequence[str] = (), config_name: str | None = None) -> list[str]:
    """Store every schema; returns the plugin modules imported for ``overrides``.

    The stage roots and group schemas once per process; ``metrics/schema`` on every call,
    after importing the plugin modules that ``overrides`` (a command line) name and, given
    ``config_name`` (the root config about to be composed), those that the config it
    composes names in YAML (:func:`plugins_in_yaml`)."""
    global _static_stored
    paths.register_resolvers()  # ${saleval.root:}, ${saleval.data_root:}
    if not _static_stored:
        cs = ConfigStore.instance()
        for name, schema in root_schemas().items():
            cs.store(name=name, node=schema)
        crowd.register_schemas()
        _static_stored = True
    plugins = plugins_named(overrides)
    if config_name is not None and _has_metrics(config_name):
        plugins += plugins_in_yaml(config_name, overrides)
    plugins = list(dict.fromkeys(plugins))
    store_schema(plugins)
    return plugins


def _has_metrics(config_name: str) -> bool:
    """Whether ``config_name``'s root has a ``metrics`` node (only those name plugins)."""
    row = next((r for r in stage_table.TABLE if r.name == config_name), None)
    return row is not None and any(f.name == "metrics" for f in fields(root_schema(row)))


def plugins_in_yaml(config_name: str, overrides: Sequence[str]) -> list[str]:
    """The modules ``metrics.plugins`` names in the config that ``overrides`` compose
    (a group file, a recipe), found by composing it once with ``metrics.settings`` open,
    so settings of metrics that are not registered yet do not stop it. A command line
    that does not compose names nothing here: the composition proper reports it. A
    ``-m`` sweep is composed once per value of each swept key."""
    store_schema(open_settings=True)
    found: list[str] = []
    for attempt in _single_configs(overrides):
        try:
            cfg = compose_root(config_name, attempt)
        except Exception:  # reported by the composition that follows, with its context
            continue
        named = OmegaConf.select(cfg, "metrics.plugins", default=None)
        found.extend(str(m) for m in (named or []))
    return found


def _single_configs(overrides: Sequence[str]) -> Iterator[list[str]]:
    """The override lists to compose: the fixed overrides, then with each value of each
    swept key added (``metrics.settings.*`` left out: they name no module)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    fixed: list[str] = []
    swept: list[tuple[str, list[str]]] = []
    for arg in overrides:
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue
        if override.get_key_element().lstrip("+~").startswith("metrics.settings"):
            continue
        if override.is_sweep_override():
            values = list(override.sweep_string_iterator())
            swept.append((override.get_key_element(), values))
        else:
            fixed.append(arg)
    yield fixed
    for key, values in swept:
        for value in values:
            yield [*fixed, f"{key}={value}"]


def stage_overrides(profile: DictConfig, stage: str) -> list[str]:
    """A ``saleval-run`` profile's ``common`` then ``stages.<stage>`` overrides of one stage
    (what the pipeline composes that stage with; the SLURM launcher reads it too)."""
    common = [f"{k}={v}" for k, v in profile.common.items()]
    return common + [str(o) for o in profile.stages.get(stage, [])]


def compose_root(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """``config_name`` composed with ``overrides``: in the running Hydra app's search path
    when there is one (``saleval-run`` composing its stages), else in ``conf/``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=list(overrides))
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def search_path_override(args: Sequence[str]) -> list[str]:
    """A console script's ``--config-dir DIR`` (``-cd``) as the override that adds it to
    the search path, so :func:`plugins_in_yaml` sees the user's group files too.

    >>> search_path_override(["-cd", "/x", "metrics=mine"])
    ['hydra.searchpath=[file:///x]']
    """
    out: list[str] = []
    for i, arg in enumerate(args):
        value: Any = None
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--config-dir="):
            value = arg.partition("=")[2]
        if value:
            out.append(f"hydra.searchpath=[file://{Path(value).expanduser().resolve()}]")
    return out
