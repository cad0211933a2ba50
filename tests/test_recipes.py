"""The ablation recipes (conf/experiment, docs/recipes.md): every recipe composes with the
stage it belongs to, at every point of its sweep, and the quick ones run end to end."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.pipeline import tables
from saleval.pipeline.compose import register_configs, stage_overrides
from saleval.stages.run import check_profile

#: recipe → the console script it runs under (saleval-<stage>); every file in
#: conf/experiment is listed, so a new recipe cannot go untested
RECIPES = {
    "train_imdb": "train",
    "train_ag_news": "train",
    "published_imdb": "score",
    "published_ag_news": "score",
    "misclassified": "run",
    "forward": "run",
    "forward_noise": "run",
    "variants_gradient": "run",
    "variants_ig": "run",
    "variants_lime": "run",
    "variants_output": "run",
    "preset_lu2024": "run",
    "metrics_removal": "run",
    "cheaper_variants": "run",
    "shortcut": "shortcut",
    "shortcut_piece": "shortcut",
    "shortcut_full": "shortcut",
    "shortcut_table11": "shortcut",
    "shortcut_table11_imdb": "shortcut",
}
EXPERIMENTS = paths.conf_dir() / "experiment"
PUBLISHED = paths.default_data_root() / "published" / "lu2024"


def _compose(stage: str, overrides: list[str], hydra_node: bool = False) -> DictConfig:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose(stage, overrides=overrides, return_hydra_config=hydra_node)


def sweep_points(name: str) -> list[list[str]]:
    """Every job of the recipe's own sweep (``hydra.sweeper.params``) as override lists;
    ``[[]]`` for a single-run recipe."""
    cfg = _compose(RECIPES[name], [f"+experiment={name}"], hydra_node=True)
    node = cfg.hydra.sweeper.get("params")
    params = {} if node is None else OmegaConf.to_container(node)
    assert isinstance(params, dict)
    parser = OverridesParser.create()
    axes = []
    for key, values in params.items():
        (ov,) = parser.parse_overrides([f"{key}={values}"])
        axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
    return [list(p) for p in itertools.product(*axes)]


def test_every_recipe_file_is_listed() -> None:
    assert sorted(p.stem for p in EXPERIMENTS.glob("*.yaml")) == sorted(RECIPES)


def every_value(points: list[list[str]]) -> list[list[str]]:
    """The first sweep point plus, per axis, the points that change only that axis:
    every value of every axis composes, without the product's cost."""
    first = points[0]
    return [p for p in points if sum(a != b for a, b in zip(p, first)) <= 1]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_composes_with_its_stage(name: str) -> None:
    stage = RECIPES[name]
    points = sweep_points(name)
    checked: set[tuple[str, tuple[str, ...]]] = set()
    for point in every_value(points):
        cfg = _compose(stage, [f"+experiment={name}", *point])
        if stage == "run":
            # every stage the profile runs composes with its overrides (what saleval-run
            # checks before its first stage); stages whose overrides this point leaves
            # as an earlier point had them are not composed twice
            profile = cfg.profile
            selected = list(profile.stages_to_run or _all_stages())
            todo = [s for s in selected if (s, tuple(stage_overrides(profile, s))) not in checked]
            check_profile(profile, todo)
            checked |= {(s, tuple(stage_overrides(profile, s))) for s in todo}
            assert profile.name == name
        else:
            OmegaConf.to_container(cfg, resolve=True)  # no dangling interpolation
    if name.startswith(("variants_", "forward_noise", "metrics_removal", "shortcut")):
        assert len(points) > 1, f"{name} is a sweep recipe: hydra.sweeper.params"


def _all_stages() -> list[str]:
    from saleval.stages.run import PIPELINE

    return [s for s, *_ in PIPELINE]


def test_sweep_points_set_what_the_recipe_names() -> None:
    ig = sweep_points("variants_ig")
    assert len(ig) == 15
    cfg = _compose("run", ["+experiment=variants_ig", *ig[1]])  # zero, 50 steps
    explain = stage_overrides(cfg.profile, "explain")
    assert "method.integrated_gradients.baseline=zero" in explain
    assert "method.integrated_gradients.n_steps=50" in explain
    noise = [p[0] for p in sweep_points("forward_noise")]
    assert noise == [f"profile.params.noise={v}" for v in ("0.0", "0.2", "0.4")]
    cfg = _compose("run", ["+experiment=forward_noise", noise[1]])
    assert "study.noise=0.2" in stage_overrides(cfg.profile, "tasks")
    assert "study=forward" in stage_overrides(cfg.profile, "tasks")
    assert cfg.profile.dataset == "sst2"
    for name in (
        "shortcut",
        "shortcut_piece",
        "shortcut_full",
        "shortcut_table11",
        "shortcut_table11_imdb",
    ):
        assert [p[0] for p in sweep_points(name)] == [f"shortcut={k}" for k in ("st", "tic", "op")]
    piece = _compose("shortcut", ["+experiment=shortcut_piece", "shortcut=op"])
    assert piece.shortcut.unit == "piece" and piece.shortcut.kind == "op"
    full = _compose("shortcut", ["+experiment=shortcut_full"])
    assert list(full.explain.budget) == [] and list(full.explain.skip) == []
    assert _compose("shortcut", ["+experiment=shortcut"]).shortcut.unit == "word"
    t11 = _compose("shortcut", ["+experiment=shortcut_table11"])
    assert t11.shortcut.unit == "piece" and t11.explain.n_samples == 50
    assert str(t11.reference).endswith("published/bastings2022/table11_bert.csv")
    assert {"grad_x_input_logits_wemb", "ig_zero_all_100_logits", "occlusion"} <= set(t11.method)
    imdb = _compose("shortcut", ["+experiment=shortcut_table11_imdb", "shortcut=st"])
    assert imdb.dataset.name == "imdb" and imdb.model.max_length == 512
    assert imdb.shortcut.unit == "piece" and set(imdb.method) == set(t11.method)
    assert imdb.reference == t11.reference and list(imdb.explain.skip) == list(t11.explain.skip)
    cheap = stage_overrides(_compose("run", ["+experiment=cheaper_variants"]).profile, "explain")
    default = stage_overrides(_compose("run", []).profile, "explain")
    assert set(default) < set(cheap)  # the default study, plus the two opt-in settings only
    assert set(cheap) - set(default) == {
        "method.integrated_gradients.convergence_tolerance=0.05",
        "method.lime.stable_top_k=5",
        "method.lime.sample_step=50",
    }
    mis = _compose("run", ["+experiment=misclassified"])
    assert "data.population=misclassified" in stage_overrides(mis.profile, "explain")
    assert "study=misclassified" in stage_overrides(mis.profile, "tasks")


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason="published lu2024 data absent")
def test_published_recipe_reproduces_the_imdb_table(
    make_cfg: Callable[..., DictConfig],
) -> None:
    from saleval.stages import score

    cfg = make_cfg(
        "score",
        ["+experiment=published_imdb", "scoring.bootstrap.n=50", "scoring.test_resamples=99"],
        name="published",
    )
    out = score.run(cfg)
    # README, "The published crowd results": IMDB scores and ranks
    want = {
        "all_attention": (78.48, 3),
        "last_attention": (66.95, 4),
        "vanilla_gradient": (79.49, 2),
        "input_x_gradient": (52.10, 6),
        "integrated_gradients": (82.27, 1),
        "deeplift": (53.47, 5),
        "lime": (38.98, 8),
        "random": (42.86, 7),
    }
    scores = tables.SCORES.read(out["run_dir"]).set_index("method")
    for method, (s, r) in want.items():
        assert scores.loc[method, "score"] == pytest.approx(s, abs=0.005), method
        assert scores.loc[method, "rank"] == r, method
    assert "82.27" in (Path(out["run_dir"]) / "scores.md").read_text()


def test_ig_variant_recipe_explains_on_the_tiny_model(
    tiny_train_run: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    """One point of variants_ig (zero_all baseline) through the explain stage, with the
    overrides saleval-run would hand it, shrunk to smoke size."""
    from saleval.stages import explain

    run_cfg = _compose(
        "run",
        ["+experiment=variants_ig", "profile.params.baseline=zero_all", "profile.params.n_steps=4"],
    )
    overrides = stage_overrides(run_cfg.profile, "explain")
    smoke = [f"inputs.model={tiny_train_run}", "data.n_samples=4", "progress=false"]
    cfg = make_cfg("explain", [*overrides, *smoke], name="explain_ig")
    assert cfg.method.integrated_gradients.baseline == "zero_all"
    out = explain.run(cfg)
    attr = tables.ATTRIBUTIONS.read(out["run_dir"])
    assert set(attr["method"]) == {"random", "integrated_gradients"}
    assert attr["sample_id"].nunique() == 4
    ig = attr[attr["method"] == "integrated_gradients"]
    assert ig["score"].notna().all() and (ig["score"] != 0).any()
    # zero_all differs from zero: [CLS]/[SEP] take part in the path
    cfg0 = make_cfg("explain", [*overrides, *smoke, "method.integrated_gradients.baseline=zero"])
    ig0 = tables.ATTRIBUTIONS.read(explain.run(cfg0)["run_dir"])
    ig0 = ig0[ig0["method"] == "integrated_gradients"]
    merged = pd.merge(ig, ig0, on=["sample_id", "word_index"], suffixes=("_all", "_zero"))
    assert len(merged) == len(ig) and not (merged["score_all"] == merged["score_zero"]).all()
