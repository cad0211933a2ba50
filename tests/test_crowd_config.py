"""The crowd side's config schemas (saleval.config.crowd): defaults written once, YAML
that states only what differs, unknown keys and bad values rejected, and the crowd
source and aggregator picked by ``_target_``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from saleval import paths
from saleval.attribution import published_names
from saleval.config.crowd import (
    SCHEMAS,
    AnswersCrowdConfig,
    DesignError,
    PublishedCrowdConfig,
    SimulationConfig,
    SimulationError,
    StudyConfig,
)
from saleval.config.keys import UnknownKeyError
from saleval.crowd.answers import AnswerParser, normalise
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.aggregation import StrictMajority
from saleval.crowd.importing.builtin import AnswersSource, PublishedSource, aggregator_options
from saleval.crowd.importing.published_format import method_names
from saleval.crowd.importing.source import crowd_source
from saleval.schema import to_schema
from saleval.vocab import IDK_ALIASES
from tests.conftest import compose_config

GROUPS = {"study": "tasks", "simulation": "simulate", "crowd": "import"}


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def _base(group: str, defaults: list[Any]) -> DictConfig:
    """What a group file starts from: its defaults list without itself (schemas, parents)."""
    base = OmegaConf.create({})
    for entry in defaults:
        if entry == "_self_" or isinstance(entry, dict | DictConfig):  # a nested group choice
            continue
        schema = SCHEMAS.get((group, entry))
        if schema is not None:
            part = OmegaConf.structured(schema)
        else:
            parent = OmegaConf.load(paths.conf_dir() / group / f"{entry}.yaml")
            part = OmegaConf.merge(_base(group, list(parent.pop("defaults", []))), parent)
        base = OmegaConf.merge(base, part)
    return base


@pytest.mark.parametrize(
    "path",
    sorted(p for g in GROUPS for p in (paths.conf_dir() / g).glob("*.yaml")),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_group_files_state_only_what_differs_from_their_defaults(path: Path) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict)
    defaults = list(raw.pop("defaults", []))
    assert any(e in {n for (g, n) in SCHEMAS if g == path.parent.name} for e in defaults) or any(
        (paths.conf_dir() / path.parent.name / f"{e}.yaml").is_file()
        for e in defaults
        if isinstance(e, str)
    ), f"{path}: its defaults list names neither a schema nor another file of the group"
    base = OmegaConf.to_container(_base(path.parent.name, defaults))
    for key, value in _leaves(raw):
        before = OmegaConf.select(OmegaConf.create(base), key, default="<unset>")
        assert value != before, f"{path}: {key}: {value!r} restates the default"


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_option_composes_into_its_schema(group: str) -> None:
    options = sorted(p.stem for p in (paths.conf_dir() / group).glob("*.yaml"))
    for opt in options:
        extra = ["crowd.path=x"] if opt == "lu2024" else []
        cfg = compose_config(GROUPS[group], [f"{group}={opt}", *extra])
        schema = {(g, n): s for (g, n), s in SCHEMAS.items() if g == group}
        assert OmegaConf.get_type(cfg[group]) in schema.values(), (group, opt)
        if group == "crowd":
            source = crowd_source(cfg.crowd)
            assert source.name == opt
        else:
            typed = to_schema(StudyConfig if group == "study" else SimulationConfig, cfg[group])
            assert typed.name == opt and typed.seed == 42


def test_unknown_keys_and_bad_values_fail_naming_the_key() -> None:
    with pytest.raises(ConfigCompositionException, match="study.nsamples"):
        compose_config("tasks", ["study.nsamples=5"])
    with pytest.raises(ConfigCompositionException, match="simulation.spammers.fractoin"):
        compose_config("simulate", ["simulation.spammers.fractoin=0.5"])
    with pytest.raises(ConfigCompositionException, match="crowd.filters.min_seconds"):
        compose_config("import", ["crowd.filters.min_seconds=5"])
    with pytest.raises(ConfigCompositionException, match="study.target=bogus"):
        compose_config("tasks", ["study.target=bogus"])  # an enum: gold | prediction
    with pytest.raises(ConfigCompositionException, match="crowd.policy=lenient"):
        compose_config("import", ["crowd.policy=lenient"])
    # `+` forces a key in: refused at compose (saleval.config.keys) and by the typed object
    with pytest.raises(UnknownKeyError, match="study.bogus is not a setting of study"):
        compose_config("tasks", ["+study.bogus=1"])
    with pytest.raises(ConfigKeyError, match="bogus"):
        to_schema(StudyConfig, {"bogus": 1})
    # ranges are checked when the typed object is built
    with pytest.raises(DesignError, match=r"study.noise must lie in \[0, 1\]"):
        to_schema(StudyConfig, compose_config("tasks", ["study.noise=2"]).study)
    with pytest.raises(SimulationError, match=r"needs \['simulation.noise.low'"):
        to_schema(SimulationConfig, {"noise": {"distribution": "uniform", "high": 0.3}})
    with pytest.raises(DesignError, match="study: 'nobody' is not a valid Population"):
        StudyConfig(population="nobody")  # type: ignore[arg-type]


def test_defaults_live_in_one_place() -> None:
    answers = compose_config("import", []).crowd
    assert list(answers.idk) == list(IDK_ALIASES)
    assert list(AnswersCrowdConfig().idk) == list(IDK_ALIASES)
    published = compose_config("import", ["crowd=lu2024"]).crowd
    # the published method names are the methods' own, declared where they register; the
    # config holds only names read otherwise, over them
    assert dict(published.methods) == {} == PublishedCrowdConfig().methods
    assert method_names() == published_names()
    assert method_names({"IG": "integrated_gradients", "LIME": "captum_lime"}) == {
        **published_names(),
        "IG": "integrated_gradients",
        "LIME": "captum_lime",
    }
    # the aliases the stage read before they were defined once (conf/crowd/answers.yaml)
    # are exactly the ones it reads now
    before = ["I don't know", "I do not know", "dont know", "don't know", "idk", "unknown", "?"]
    assert {normalise(a) for a in before} == AnswerParser(["a", "b"]).idk


def test_the_crowd_source_is_picked_by_target() -> None:
    answers = crowd_source(compose_config("import", []).crowd)
    assert type(answers) is AnswersSource and answers.filters.min_bundle_seconds == 120
    published = crowd_source(compose_config("score", ["crowd=lu2024", "crowd.path=f.csv"]).crowd)
    assert type(published) is PublishedSource and published.path == "f.csv"
    # a plain dict with a _target_ gets the target's schema (defaults, unknown keys)
    assert (
        crowd_source({"_target_": "saleval.crowd.importing.builtin.PublishedSource"}).name
        == "lu2024"
    )
    with pytest.raises(ConfigKeyError, match="bogus"):
        crowd_source({"_target_": "saleval.crowd.importing.builtin.AnswersSource", "bogus": 1})
    with pytest.raises(CrowdImportError, match="names no _target_"):
        crowd_source({"name": "answers", "format": "answers"})
    with pytest.raises(CrowdImportError, match="StudyConfig is not a crowd source.*CrowdSource"):
        crowd_source({"_target_": "saleval.config.crowd.StudyConfig"})
    with pytest.raises(CrowdImportError, match="crowd._target_=mylab.Nope: cannot import it"):
        crowd_source({"_target_": "mylab.Nope"})


@pytest.mark.parametrize(
    "option,cls",
    [
        ("strict_majority", "saleval.crowd.importing.aggregation.StrictMajority"),
        ("majority_vote", "crowdkit.aggregation.classification.majority_vote.MajorityVote"),
        ("dawid_skene", "crowdkit.aggregation.classification.dawid_skene.DawidSkene"),
        ("mace", "crowdkit.aggregation.classification.mace.MACE"),
        ("glad", "crowdkit.aggregation.classification.glad.GLAD"),
    ],
)
def test_every_aggregator_option_instantiates(option: str, cls: str) -> None:
    cfg = compose_config("import", [f"crowd/aggregator={option}", "seed=7"])
    agg = crowd_source(cfg.crowd).build_aggregator()
    assert f"{type(agg).__module__}.{type(agg).__name__}" == cls
    if option == "mace":
        assert agg.random_state == 7  # seeded with the run's seed


def test_aggregator_extras_and_the_old_spelling() -> None:
    cfg = compose_config("import", ["crowd/aggregator=dawid_skene", "+crowd.aggregator.n_iter=7"])
    assert crowd_source(cfg.crowd).build_aggregator().n_iter == 7
    assert isinstance(
        crowd_source(compose_config("import", []).crowd).build_aggregator(), StrictMajority
    )
    with pytest.raises(ConfigCompositionException, match="crowd.aggregator.name"):
        compose_config("import", ["crowd.aggregator.name=dawid_skene"])
    forced = compose_config("import", ["+crowd.aggregator.name=dawid_skene"])
    with pytest.raises(CrowdImportError, match=r"crowd/aggregator=<[a-z_|]+>") as err:
        crowd_source(forced.crowd).build_aggregator()
    assert f"<{'|'.join(aggregator_options())}>" in str(err.value)
