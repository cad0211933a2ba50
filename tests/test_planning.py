"""saleval-plan (docs/planning.md): the planner's rules by hand, its equivalences with the
import and score code, and the stage end to end on the published crowd and a simulated one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from saleval.analysis import costing, planning, scoring
from saleval.crowd.answers import AnswerParser
from saleval.crowd.importing.aggregation import StrictMajority, aggregate, unique_winner
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError

PUBLISHED = ["crowd=lu2024", "crowd.path=${paths.data_root}/published/lu2024/IMDB.csv"]
FAST = ["plan.replicates=60", "plan.power_replicates=4", "plan.test_resamples=99"]


def _pool(p: np.ndarray, N: int, seed: int = 0) -> planning.Pool:
    """An empirical pool whose method j is recognised with probability p[j] at every k."""
    rng = np.random.default_rng(seed)
    A = (rng.random((N, len(p), 2)) < np.asarray(p)[None, :, None]).astype(float)
    methods = [f"m{j}" for j in range(len(p) - 1)] + ["random"]
    return planning.Pool("empirical", [f"s{i}" for i in range(N)], methods, [5, 10], 5, A=A)


def _design(pool: planning.Pool, n: int, R: int = 5) -> planning.Design:
    return planning.Design(n, tuple(pool.methods), tuple(pool.ks), R, 10)


def test_strict_majority_is_one_rule_for_import_and_planner() -> None:
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 3, size=(400, 5))  # 400 tasks × 5 answers; 0 = I don't know
    long = pd.DataFrame(
        {
            "task": np.repeat(np.arange(400), 5).astype(str),
            "worker": np.tile(list("abcde"), 400),
            "label": codes.ravel(),
        }
    )
    from_import = StrictMajority().fit_predict(long).reindex(np.arange(400).astype(str))
    counts = (codes[..., None] == np.arange(3)).sum(axis=1)
    won = unique_winner(counts)
    assert (won == -1).any() and (won >= 0).any()
    np.testing.assert_array_equal(from_import.isna().to_numpy(), won == -1)
    np.testing.assert_array_equal(from_import.fillna(-1).to_numpy(int), np.where(won >= 0, won, -1))
    # verdicts: the target must win outright (a tie names nothing)
    target = np.full(400, 2)
    assert (planning.verdicts(codes, target, 3) == (won == 2)).all()


def test_simulated_pool_at_full_R_equals_the_importers_aggregation() -> None:
    labels = ["neg", "pos"]
    tasks = pd.DataFrame(
        [
            {"task_id": f"{s}-{m}-{k}", "sample_id": s, "method": m, "k": k, "label": lab}
            for s, lab in (("a", 0), ("b", 1), ("c", 1))
            for m in ("lime", "random")
            for k in (5, 10)
        ]
    )
    rng = np.random.default_rng(0)
    options = ["neg", "pos", "I don't know"]
    answers = pd.DataFrame(
        [
            {"task_id": t, "worker_id": f"w{r}", "answer": options[int(rng.integers(3))]}
            for t in tasks["task_id"]
            for r in range(3)
        ]
    )
    pool = planning.simulated_pool(tasks, answers, labels, "test")
    assert pool.repeats == 3 and pool.codes is not None
    parse = AnswerParser(labels)
    ann = answers.assign(answer_code=answers["answer"].map(parse)).merge(
        tasks[["task_id", "label"]], on="task_id"
    )
    agg = aggregate(ann, tasks)
    cube = scoring.Cube.from_aggregated(agg)
    assert cube.methods == pool.methods and cube.samples == pool.samples
    design = planning.Design(3, tuple(pool.methods), tuple(pool.ks), 3, 4)
    mine = planning.verdicts(pool.codes, pool.target, pool.n_options)  # every answer, no draw
    np.testing.assert_array_equal(mine, cube.A)
    # the reference at full R is the aggregated study's score, with no draw involved
    np.testing.assert_allclose(
        pool.reference(design, np.random.default_rng(0)),
        scoring.method_scores(scoring.accuracy(cube.A)),
    )


def test_every_sample_once_reproduces_the_reference_exactly() -> None:
    pool = _pool([0.9, 0.7, 0.5, 0.3], N=40)
    d = _design(pool, 40)
    row, per_method = planning.predict(
        pool,
        d,
        planning.Settings(replicates=20, power_replicates=0),
        np.random.default_rng(0),
        replace=False,
    )
    assert row["p_best"] == 1.0 and row["spearman_mean"] == pytest.approx(1.0)
    assert row["ci_width_mean"] == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(per_method["mean_score"], per_method["reference_score"])


def test_precision_grows_as_one_over_root_n() -> None:
    pool = _pool([0.8, 0.6, 0.5, 0.4], N=400)
    settings = planning.Settings(replicates=400, power_replicates=0)
    rng = np.random.default_rng(0)
    small, _ = planning.predict(pool, _design(pool, 25), settings, rng)
    large, _ = planning.predict(pool, _design(pool, 100), settings, rng)
    assert large["ci_width_mean"] / small["ci_width_mean"] == pytest.approx(0.5, abs=0.08)
    assert large["p_best"] >= small["p_best"] and large["p_best"] > 0.95


def test_power_finds_a_real_difference_and_not_a_null_one() -> None:
    pool = _pool([0.9, 0.5, 0.5], N=200)  # m0 far above random, m1 equal to it
    settings = planning.Settings(replicates=40, power_replicates=40, test_resamples=199)
    _, pm = planning.predict(pool, _design(pool, 60), settings, np.random.default_rng(0))
    power = dict(zip(pm["method"], pm["power"]))
    assert power["m0"] > 0.95
    assert power["m1"] < 0.25  # about alpha under the null
    assert np.isnan(power["random"])


def test_half_samples_behave_like_studies_of_the_whole_pool() -> None:
    pool = _pool([0.75, 0.65, 0.55, 0.5], N=200)
    settings = planning.Settings(replicates=300, power_replicates=0)
    check = planning.half_sample_check(pool, _design(pool, 10), settings, np.random.default_rng(0))
    w = dict(zip(check["n"].astype(str) + check["sampling"], check["ci_width_mean"]))
    half, full = w["100with replacement"], w["200with replacement"]
    actual = w["100without replacement"]
    assert abs(actual - full) < abs(actual - half)
    assert actual == pytest.approx(full, rel=0.15)


def test_cost_by_hand() -> None:
    d = planning.Design(10, ("a", "b"), (5, 10, 20), 5, 4)
    assert (d.tasks, d.answers, d.bundles) == (60, 300, 75)  # ceil(60 / 4) × 5
    cost = costing.Costing(12.0, 9.0, fee=0.5).of(d)
    assert cost["worker_minutes"] == 60.0  # 300 answers × 12 s
    assert cost["cost"] == pytest.approx(9.0 * 1.5)


def test_cheapest_meets_both_targets() -> None:
    table = pd.DataFrame(
        {
            "n": [20, 40, 60],
            "cost": [10.0, 20.0, 30.0],
            "p_best": [0.95, 0.92, 0.99],
            "spearman_mean": [0.80, 0.91, 0.95],
        }
    )
    assert int(costing.cheapest(table, 0.9, 0.9)["n"]) == 40
    assert costing.cheapest(table, 0.999, 0.9) is None


@pytest.mark.parametrize(
    ("field", "design_kw", "expected"),
    [
        ("methods", {"methods": ()}, "plan.methods[0]: no methods"),
        ("ks", {"ks": (5, 400)}, "plan.ks[1]: [400] outside the k grid"),
        ("repeats", {"repeats": 3}, "plan.repeats[0]: 3; the empirical pool holds majority"),
        ("methods", {"methods": ("m0", "shap")}, "plan.methods[0]: ['shap'] not in the pool"),
    ],
)
def test_bad_designs_get_one_located_line(field, design_kw, expected) -> None:
    pool = _pool([0.8, 0.5], N=10)
    d = planning.Design(**{**vars(_design(pool, 5)), **design_kw})
    where = {
        "methods": "plan.methods[0]",
        "ks": "plan.ks[1]",
        "repeats": "plan.repeats[0]",
        "n": "plan.n[0]",
        "bundle_size": "plan.bundle_size",
    }
    with pytest.raises(planning.PlanError) as err:
        pool.check(d, where)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_rate_must_be_positive() -> None:
    with pytest.raises(planning.PlanError, match=r"plan\.cost\.hourly_rate: 0\.0; must be > 0"):
        costing.Costing(10.0, 0.0)


def test_plan_stage_on_the_published_crowd(make_cfg) -> None:
    from saleval.stages import plan

    cfg = make_cfg("plan", [*PUBLISHED, "dataset=lu2024_imdb", *FAST, "plan.n=[10,40]"])
    out = plan.run(cfg)
    run_dir = Path(out["run_dir"])
    table = tables.PLAN.read(run_dir)
    assert list(table["n"]) == [10, 40] and set(table["source"]) == {"empirical"}
    assert (table["repeats"] == 5).all() and (table["tasks"] == table["n"] * 8 * 5).all()
    assert table.loc[1, "ci_width_mean"] < table.loc[0, "ci_width_mean"]
    methods = tables.PLAN_METHODS.read(run_dir)
    assert len(methods) == 2 * 8
    check = tables.PLAN_CHECK.read(run_dir)
    assert list(check["n"]) == [50, 100, 50]
    md = (run_dir / "plan.md").read_text()
    assert "real people" in md and "SIMULATED" not in md
    assert (run_dir / "power.png").stat().st_size > 10_000
    run = mlflow.get_run(out["run_id"])
    assert run.data.tags["plan_source"] == "empirical"
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(out["run_id"])}
    assert {"plan.csv", "plan_methods.csv", "plan.md", "power.png"} <= arts
    hist = mlflow.MlflowClient().get_metric_history(out["run_id"], "p_best")
    assert sorted(m.step for m in hist) == [10, 40]


def test_plan_stage_on_an_explain_run_says_simulated(make_cfg, smoke_pipeline) -> None:
    from saleval.stages import plan

    explain = smoke_pipeline.dirs["explain"]
    cfg = make_cfg(
        "plan",
        [
            f"inputs.explain={explain}",
            "study=smoke",
            "kgrid=smoke",
            *FAST,
            "plan.n=[4,8]",
            "plan.cost.seconds_per_task=20",
        ],
    )
    out = plan.run(cfg)
    run_dir = Path(out["run_dir"])
    md = (run_dir / "plan.md").read_text()
    assert md.startswith("# SIMULATED crowd") and "rests on a simulated crowd" in md
    assert mlflow.get_run(out["run_id"]).data.tags["simulated"] == "true"
    assert json.loads((run_dir / "run.json").read_text())["provenance"]["simulated"] is True
    table = tables.PLAN.read(run_dir)
    assert set(table["source"]) == {"simulated"}
    # 20 s per answer at R = 5: n × 9 methods × 2 k × 5 answers × 20 s
    assert list(table["worker_minutes"]) == [4 * 18 * 5 * 20 / 60, 8 * 18 * 5 * 20 / 60]
    bad = make_cfg(
        "plan",
        [f"inputs.explain={explain}", "study=smoke", "kgrid=smoke", "plan.ks=[[2,999]]"],
        name="bad",
    )
    with pytest.raises(planning.PlanError, match=r"plan\.ks\[0\]: k = 999 exceeds every"):
        plan.run(bad)


def test_plan_stage_refuses_empirical_without_real_answers(make_cfg, smoke_pipeline) -> None:
    from saleval.stages import plan

    explain = smoke_pipeline.dirs["explain"]
    cfg = make_cfg("plan", [f"inputs.explain={explain}", "plan.source=empirical"])
    with pytest.raises(InputError, match="plan.source=empirical needs real answers"):
        plan.run(cfg)
    with pytest.raises(InputError, match="exactly one source"):
        plan.run(make_cfg("plan", [], name="none"))


def test_discrepancy_widens_intervals_and_lowers_p_best_only_when_measured() -> None:
    """docs/planning.md#discrepancy: zero residuals leave every figure as it was; large
    ones (the simulated crowd is far off) widen the intervals and lower P(best)."""
    pool = _pool(np.array([0.8, 0.7, 0.6, 0.5]), N=200, seed=3)
    design = _design(pool, 40)
    settings = planning.Settings(replicates=300, power_replicates=0)
    plain = planning.predict(pool, design, settings, np.random.default_rng(7))
    zero = dataclasses.replace(
        pool, discrepancy=planning.Discrepancy({m: (0.0, 0.0) for m in pool.methods}, "zeros")
    )
    same = planning.predict(zero, design, settings, np.random.default_rng(7))
    np.testing.assert_equal(same[0], plain[0])
    pd.testing.assert_frame_equal(same[1], plain[1])
    # the simulated crowd measured 15 points off either way, per method
    big = dataclasses.replace(pool, discrepancy=planning.Discrepancy({"x": (-15.0, 15.0)}, "large"))
    wide = planning.predict(big, design, settings, np.random.default_rng(7))
    assert wide[0]["ci_width_mean"] > plain[0]["ci_width_mean"] + 10
    assert wide[0]["p_best"] < plain[0]["p_best"] - 0.2
    assert wide[0]["spearman_mean"] < plain[0]["spearman_mean"]


def test_discrepancy_draws_sizes_half_own_half_any_with_either_sign() -> None:
    """docs/planning.md#discrepancy by hand: a method's error is one of its own residuals
    with chance ½, else any residual, and up or down with chance ½ each."""
    d = planning.Discrepancy({"a": (2.0,), "b": (-1.0, 3.0)}, "")
    assert d.pooled == (2.0, -1.0, 3.0)
    x = 100 * d.draw(["a", "b", "occlusion"], 40_000, np.random.default_rng(0))
    sizes = np.abs(x).round(6)
    # a: own 2 with chance 1/2, else any of 2, 1, 3 (1/3 each): 2 -> 2/3, 1 and 3 -> 1/6
    for size, p in ((2.0, 2 / 3), (1.0, 1 / 6), (3.0, 1 / 6)):
        assert np.mean(sizes[:, 0] == size) == pytest.approx(p, abs=0.01)
    # b: own 1 or 3 (1/4 each) + any (1/6 each): 1 and 3 -> 5/12, 2 -> 1/6
    for size, p in ((1.0, 5 / 12), (3.0, 5 / 12), (2.0, 1 / 6)):
        assert np.mean(sizes[:, 1] == size) == pytest.approx(p, abs=0.01)
    # a method without residuals of its own draws from all of them
    for size in (1.0, 2.0, 3.0):
        assert np.mean(sizes[:, 2] == size) == pytest.approx(1 / 3, abs=0.01)
    # the measured sign does not carry over: up and down equally often, for every method
    np.testing.assert_allclose(np.mean(x > 0, axis=0), 0.5, atol=0.01)


def test_discrepancy_uses_a_validated_datasets_own_residuals() -> None:
    cfg = {"imdb": {"lomo": {"m0": 20.0}}, "ag_news": {"x": {"m1": 1.0, "random": -2.0}}}
    pooled = planning.Discrepancy.from_config(cfg, "")
    assert pooled.residuals == {"m0": (20.0,), "m1": (1.0,), "random": (-2.0,)}
    assert pooled.own == ""
    own = planning.Discrepancy.from_config(cfg, "", own="ag_news")
    assert own.residuals == {"m1": (1.0,), "random": (-2.0,)} and own.own == "ag_news"
    with pytest.raises(planning.PlanError, match="no residuals for 'sst2'"):
        planning.Discrepancy.from_config(cfg, "", own="sst2")
    # IMDB's large error on m0 is not applied to AG News: its studies keep the simulated
    # winner, where the pooled residuals (m0 20 points off) often overturn it
    pool = _pool(np.array([0.9, 0.8, 0.5]), N=300, seed=4)
    design = _design(pool, 100)
    settings = planning.Settings(replicates=200, power_replicates=0)
    p_best = {
        name: planning.predict(
            dataclasses.replace(pool, discrepancy=disc), design, settings, np.random.default_rng(0)
        )[0]["p_best"]
        for name, disc in (("pooled", pooled), ("own", own))
    }
    assert p_best["own"] > 0.9 and p_best["pooled"] < p_best["own"] - 0.15, p_best


@pytest.mark.parametrize(
    ("dataset", "own", "count"),
    [("lu2024_imdb", "imdb", 16), ("ag_news", "ag_news", 16), ("sst2", "", 32)],
)
def test_plan_picks_own_or_pooled_residuals_by_dataset(dataset, own, count) -> None:
    """The shipped residuals: IMDB's for both IMDB datasets, AG News' for AG News, all 32
    elsewhere; plan.md's line says which."""
    from saleval.config.plan import PlanConfig
    from saleval.schema import to_schema
    from saleval.stages import plan
    from tests.conftest import compose_config

    cfg = compose_config("plan", [f"dataset={dataset}"])
    found, line = plan.discrepancy(cfg, to_schema(PlanConfig, cfg.plan))
    assert found is not None and found.own == own and len(found.pooled) == count
    assert f"{count} in all" in line
    if own:
        assert f"{dataset}'s own residuals" in line
    else:
        assert "pooled: sst2 has no validated crowd of its own" in line


def test_plan_md_names_the_discrepancy_it_used(make_cfg, smoke_pipeline) -> None:
    from saleval.stages import plan

    explain = smoke_pipeline.dirs["explain"]
    base = [f"inputs.explain={explain}", "study=smoke", "kgrid=smoke", *FAST, "plan.n=[4]"]
    md = (Path(plan.run(make_cfg("plan", base))["run_dir"]) / "plan.md").read_text()
    assert "Discrepancy: per drawn study" in md and "16 in all" in md
    assert "ag_news's own residuals" in md  # profile=smoke is AG News
    assert "leave one method out" in md and "Kennedy & O'Hagan" in md
    off = make_cfg("plan", [*base, "plan.discrepancy=false"], name="off")
    md_off = (Path(plan.run(off)["run_dir"]) / "plan.md").read_text()
    assert "none (plan.discrepancy=false)" in md_off
