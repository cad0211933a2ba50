"""Structured configs: every stage root composes with every profile and recipe, and an
unknown key anywhere (a project file, a user's ``--config-dir`` file, a profile's
overrides) fails when the config is composed, naming the key. Composition only: no
training, no data."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from saleval import paths
from saleval.pipeline.compose import register_configs, root_schemas, stage_overrides
from saleval.schema import to_schema
from saleval.stages import run as pipeline
from tests.conftest import compose_config

register_configs()
ROOTS = root_schemas()
STAGES = sorted(name.removesuffix("_schema") for name in ROOTS)
PROFILES = sorted(p.stem for p in (paths.conf_dir() / "profile").glob("*.yaml"))
# the training recipes; every recipe, each with its own stage: tests/test_recipes.py
EXPERIMENTS = sorted(p.stem for p in (paths.conf_dir() / "experiment").glob("train_*.yaml"))
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_root_composes_typed_by_its_schema(stage: str) -> None:
    cfg = compose_config(stage)
    assert OmegaConf.get_type(cfg) is ROOTS[f"{stage}_schema"]
    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        compose_config(stage, ["no_such_key=1"])


@pytest.mark.parametrize("profile", PROFILES)
def test_every_stage_composes_with_every_profile(profile: str) -> None:
    # a profile's required parameter (prompted_smoke: the causal LM's directory) given
    required = {"prompted_smoke": ["profile.params.lm=/path/to/causal-lm"]}
    cfg = compose_config("run", [f"profile={profile}", *required.get(profile, [])])
    selected = list(cfg.profile.stages_to_run or [s for s, *_ in pipeline.PIPELINE])
    pipeline.check_profile(cfg.profile, selected)  # raises on the first stage that fails
    for stage, _, config_name, _ in pipeline.PIPELINE:
        stage_cfg = compose_config(config_name, stage_overrides(cfg.profile, stage))
        assert stage_cfg.task_name == stage


def test_a_profile_parameter_left_out_is_one_line_naming_it() -> None:
    cfg = compose_config("run", ["profile=prompted_smoke"])
    with pytest.raises(pipeline.ProfileError, match=r"stage train: .*profile\.params\.lm"):
        pipeline.check_profile(cfg.profile, ["train"])


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_recipe_composes(experiment: str) -> None:
    cfg = compose_config("train", [f"+experiment={experiment}"])
    assert cfg.trainer.max_epochs == 2 and cfg.model.name == "minilm"


def test_group_file_typo_fails_at_compose_time_naming_the_key(tmp_path: Path) -> None:
    """A user's own dataset file, found through --config-dir, is checked like ours."""
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "mine.yaml").write_text(
        "name: mine\nlabel_names: [a, b]\nfiles: {all: reviews.csv}\ntext_colum: review\n"
    )
    proc = subprocess.run(
        [str(BIN / "saleval-train"), "--config-dir", str(tmp_path), "dataset=mine", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "text_colum" in proc.stderr and "DatasetConfig" in proc.stderr, proc.stderr
    (tmp_path / "dataset" / "mine.yaml").write_text(
        "name: mine\nlabel_names: [a, b]\nfiles: {all: reviews.csv}\ntext_column: review\n"
    )
    proc = subprocess.run(
        [str(BIN / "saleval-train"), "--config-dir", str(tmp_path), "dataset=mine", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "text_column: review" in proc.stdout


@pytest.mark.parametrize(
    ("stage", "override", "key"),
    [
        ("train", "trainer.optimizer.learning_rate=1", "learning_rate"),
        ("train", "trainer.lr=1", "lr"),  # moved to trainer.optimizer.lr
        ("train", "model.pretrianed=x", "pretrianed"),
        ("explain", "data.outcome=correct", "outcome"),  # now data.population
        ("explain", "data.population=incorrect", "incorrect"),  # now misclassified
        ("explain", "target=predicted", "predicted"),  # now prediction
        ("shortcut", "shortcut.verify.min=1", "min"),
        ("shortcut", "explain.target=predicted", "predicted"),
        ("annotate", "annotate.prot=1", "prot"),
        ("tasks", "kgrid.k=[1]", "k"),
        ("score", "scoring.bootstrap.m=1", "m"),
        ("compare", "compare.column=all", "column"),
        ("metrics", "tracking.urii=x", "urii"),
        ("run", "profile.stage_to_run=[train]", "stage_to_run"),
    ],
)
def test_unknown_key_or_value_fails_naming_it(stage: str, override: str, key: str) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(stage, [override])
    chain, e = [], err.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert key in " ".join(chain)


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_each_root_schema_rejects_an_unknown_key(name: str) -> None:
    schema = ROOTS[name]
    with pytest.raises(Exception, match="not_a_field"):
        to_schema(schema, {"not_a_field": 1})
    for f in dataclasses.fields(schema):  # every nested schema is closed too
        if dataclasses.is_dataclass(f.type) or (
            isinstance(f.type, str) and f.type.endswith("Config")
        ):
            node = OmegaConf.structured(schema)
            with pytest.raises(Exception, match="not_a_field"):
                OmegaConf.merge(node, {f.name: {"not_a_field": 1}})


def test_profile_typo_fails_saleval_run_before_any_stage_runs(
    tmp_path: Path, mlflow_uri: str
) -> None:
    cfg = compose_config("run", ["profile=smoke"], tmp_path / "run")
    cfg.profile.stages.explain.append("method.lime.num_sampels=300")
    with pytest.raises(pipeline.ProfileError, match=r"stage explain.*method\.lime\.num_sampels"):
        pipeline.run(cfg)
    assert not (tmp_path / "run").exists()  # not even the train stage's run dir
    cfg = compose_config("run", ["profile=smoke"], tmp_path / "run")
    with open_dict(cfg):
        cfg.profile.stages.evaluate = ["seed=1"]
    with pytest.raises(pipeline.ProfileError, match=r"unknown stages \['evaluate'\]"):
        pipeline.run(cfg)
    assert not (tmp_path / "run").exists()


def test_implementations_are_picked_by_target() -> None:
    from saleval.modeling.data import load_dataset
    from saleval.modeling.data_checks import DataError
    from saleval.modeling.models import ModelError, PretrainedSource, RandomSource, model_source

    assert isinstance(model_source(compose_config("train", ["model=tiny"]).model), RandomSource)
    bert = compose_config("train", ["model=bert_base"]).model
    assert isinstance(model_source(bert), PretrainedSource)
    with pytest.raises(ModelError, match="model._target_='os.path.join' is not"):
        model_source(compose_config("train", ["model=tiny", "model._target_=os.path.join"]).model)
    cfg = compose_config("train", ["dataset._target_=saleval.modeling.data.no_such_reader"])
    with pytest.raises(
        DataError, match="_target_='saleval.modeling.data.no_such_reader' is not a reader"
    ):
        load_dataset(cfg.dataset)


def test_batch_limits_null_means_all_and_zero_means_none_only_for_training() -> None:
    from saleval.modeling.training import _positive_or_all

    assert _positive_or_all(None, "limit_train_batches") == 1.0  # null: every batch
    assert _positive_or_all(1, "limit_train_batches") == 1  # an int: that many batches
    assert _positive_or_all(0, "limit_train_batches") == 0  # Lightning's 0: no training
    with pytest.raises(ValueError, match=r"trainer.val_check_interval=0: must be > 0"):
        _positive_or_all(0, "val_check_interval")
    with pytest.raises(ValueError, match=r"trainer.limit_train_batches=-1: must be >= 0"):
        _positive_or_all(-1, "limit_train_batches")
