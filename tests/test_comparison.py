"""Human vs automated comparison (docs/metrics.md#comparison) on hand-made rankings and
synthetic crowd results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats

from saleval.analysis import comparison as C
from saleval.analysis import comparison_report, metric_columns
from saleval.pipeline import tables
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.stages.compare import human_score_fn
from tests.metrics_support import write_run

METHODS = ["m0", "m1", "m2", "m3", "m4"]


def test_ranks_share_the_best_rank_and_respect_direction() -> None:
    v = pd.Series([0.5, 0.7, 0.5, 0.1])
    assert metric_columns.rank_methods(v, True).tolist() == [2, 1, 2, 4]
    assert metric_columns.rank_methods(v, False).tolist() == [2, 4, 2, 1]


def test_rank_agreement_on_hand_rankings() -> None:
    human = [10, 20, 30, 40, 50]
    same = C.rank_agreement(human, [0.1, 0.2, 0.3, 0.4, 0.5], higher_better=True)
    assert same["spearman"] == pytest.approx(1.0) and same["kendall"] == pytest.approx(1.0)
    # a lower-is-better metric ordering the methods the same way agrees perfectly
    low = C.rank_agreement(human, [5, 4, 3, 2, 1], higher_better=False)
    assert low["spearman"] == pytest.approx(1.0) and low["kendall"] == pytest.approx(1.0)
    rev = C.rank_agreement(human, [5, 4, 3, 2, 1], higher_better=True)
    assert rev["spearman"] == pytest.approx(-1.0) and rev["kendall"] == pytest.approx(-1.0)
    # one swap of the top two: rho = 1 - 6*2/(5*24) = 0.9; tau = (9 - 1)/10 = 0.8
    swap = C.rank_agreement(human, [0.1, 0.2, 0.3, 0.5, 0.4], higher_better=True)
    assert swap["spearman"] == pytest.approx(0.9)
    assert swap["kendall"] == pytest.approx(0.8)
    assert swap["n"] == 5


def test_columns_and_table_with_ranks_in_brackets() -> None:
    metrics = pd.DataFrame(
        [
            (m, metric, k, v)
            for j, m in enumerate(METHODS)
            for metric, k, v in (
                ("comprehensiveness", "", 0.1 * j),
                ("comprehensiveness", "5", 0.1 * j),
                ("sufficiency", "", -0.1 * j),
                ("log_odds_drop", "0.2", j),
                ("no_switch", "", 0.5),
            )
        ],
        columns=["method", "metric", "k", "value"],
    )
    cols = metric_columns.select_columns(metrics, "summary")
    assert cols == ["comprehensiveness", "sufficiency", "log_odds_drop@0.2"]
    assert "comprehensiveness@5" in metric_columns.select_columns(metrics, "all")
    with pytest.raises(metric_columns.ComparisonError, match="nope"):
        metric_columns.select_columns(metrics, ["nope"])
    human = pd.Series([10.0, 20.0, 30.0, 30.0, 50.0], index=METHODS)
    table = C.comparison_table(human, metric_columns.wide_metrics(metrics, cols, ["method"]), cols)
    assert table["method"].tolist() == ["m4", "m2", "m3", "m1", "m0"]
    assert table["human_rank"].tolist() == [1, 2, 2, 4, 5]
    assert table.set_index("method").loc["m4", "sufficiency_rank"] == 1  # lowest is best
    res = C.compare(human, metrics, metrics.assign(sample_id="s"), n_boot=0)
    md = comparison_report.markdown_report(res.comparison, res.correlations, res.columns, "T")
    assert "| m4 " in md and "50.0 (1)" in md and "0.400 (1)" in md and "30.0 (2)" in md


def synthetic(n: int = 40, seed: int = 0):
    """A[i, j, k] with method j recognised more often the larger j; metrics that agree."""
    rng = np.random.default_rng(seed)
    q = np.linspace(0.2, 0.8, len(METHODS))
    samples = [f"s{i:02d}" for i in range(n)]
    A = (rng.uniform(size=(n, len(METHODS), 2)) < q[None, :, None]).astype(float)
    agg = pd.DataFrame(
        [
            (s, m, k, int(A[i, j, c]))
            for i, s in enumerate(samples)
            for j, m in enumerate(METHODS)
            for c, k in enumerate((5, 10))
        ],
        columns=["sample_id", "method", "k", "correct"],
    )
    acc = A.mean(axis=2)
    rows = []
    for i, s in enumerate(samples):
        for j, m in enumerate(METHODS):
            rows += [
                (s, m, "comprehensiveness", "", q[j] + rng.normal(0, 0.05)),
                (s, m, "sufficiency", "", -q[j] + rng.normal(0, 0.05)),
                (s, m, "auprc", "", acc[i, j] + rng.normal(0, 0.01)),
            ]
    per_ex = pd.DataFrame(rows, columns=["sample_id", "method", "metric", "k", "value"])
    summary = per_ex.groupby(["method", "metric", "k"], as_index=False)["value"].mean()
    preds = pd.DataFrame({"sample_id": samples, "confidence": rng.uniform(0.5, 1, n), "correct": 1})
    return A, samples, agg, per_ex, summary, preds


def test_bootstrap_and_instance_level_on_synthetic_results() -> None:
    A, samples, agg, per_ex, summary, preds = synthetic()
    human = pd.Series(human_score_fn(A), index=METHODS)
    res = C.compare(
        human,
        summary,
        per_ex,
        aggregated=agg,
        human_A=A,
        human_samples=samples,
        human_methods=METHODS,
        human_score_fn=human_score_fn,
        predictions=preds,
        n_boot=200,
    )
    corr = res.correlations.set_index(["metric", "level", "statistic"])
    rho = corr.loc[("comprehensiveness", "method", "spearman")]
    assert rho["value"] == pytest.approx(1.0)
    assert -1 <= rho["ci_low"] <= rho["value"] <= rho["ci_high"] <= 1
    assert corr.loc[("sufficiency", "method", "spearman"), "value"] == pytest.approx(1.0)
    inst = corr.loc[("auprc", "instance", "spearman")]
    # the join is right: ρ equals scipy's on the (crowd accuracy, metric) pairs built by hand
    metric = per_ex[per_ex.metric == "auprc"].set_index(["sample_id", "method"])["value"]
    acc = agg.groupby(["sample_id", "method"])["correct"].mean()
    expected = stats.spearmanr(acc.sort_index(), metric.sort_index()).statistic
    assert inst["value"] == pytest.approx(expected) and inst["value"] > 0.85
    assert inst["n"] == len(samples) * len(METHODS)
    assert inst["ci_low"] <= inst["value"] <= inst["ci_high"]
    beta = corr.loc[("auprc", "instance", "ols_coef")]
    assert beta["value"] == pytest.approx(acc.std(), rel=0.05)  # per SD of a ~perfect proxy
    assert corr.loc[("auprc", "instance", "ols_r2"), "value"] > 0.95
    assert ("auprc", "instance", "ols_coef_correct") not in corr.index  # constant: dropped
    assert "dropped constant regressors: correct" in res.ols_text
    assert any("paired" in n for n in res.notes)


def test_instance_level_skipped_without_shared_samples() -> None:
    A, samples, agg, per_ex, summary, preds = synthetic(n=10)
    human = pd.Series(human_score_fn(A), index=METHODS)
    other = per_ex.assign(sample_id="x" + per_ex["sample_id"])
    res = C.compare(
        human, summary, other, aggregated=agg, human_A=A, human_samples=samples,
        human_methods=METHODS, human_score_fn=human_score_fn, predictions=preds, n_boot=20,
    )  # fmt: skip
    assert res.instance is None
    assert (res.correlations["level"] == "method").all()
    assert any("independently" in n for n in res.notes)


def fake_chain(root: Path, simulated: bool, dataset: str = "ag_news") -> tuple[Path, Path]:
    """score run (+ simulated import parent) and metrics run (+ explain parent)."""
    A, samples, agg, per_ex, summary, preds = synthetic(n=12)
    ds = {"dataset": {"name": dataset, "label_names": ["a", "b"]}}
    imp = write_run(root / "import", "import", ds, simulated=simulated)
    tables.AGGREGATED.write(agg, imp)
    score = write_run(root / "score", "score", ds, simulated=simulated, parents={"crowd": imp})
    s = human_score_fn(A)
    scores = pd.DataFrame(
        {"method": METHODS, "score": s, "rank": metric_columns.rank_methods(pd.Series(s))}
    )
    tables.SCORES.write(scores, score)
    explain = write_run(root / "explain", "explain", {**ds, "model": {"max_length": 64}})
    p = pd.DataFrame(
        {"sample_id": samples, "text": "t", "label": 0, "pred": 0, "prob_a": preds["confidence"]}
    )
    tables.PREDICTIONS.write(p.assign(prob_b=1 - p["prob_a"]), explain)
    metrics = write_run(root / "metrics", "metrics", ds, parents={"explain": explain})
    tables.METRICS.write(summary, metrics)
    tables.METRICS_PER_EXAMPLE.write(per_ex, metrics)
    return score, metrics


def test_compare_stage_writes_everything_and_flags_a_simulated_crowd(make_cfg, tmp_path) -> None:
    from saleval.stages import compare as stage

    score, metrics = fake_chain(tmp_path / "runs", simulated=True)
    cfg = make_cfg(
        "compare",
        [f"inputs.score={score}", f"inputs.metrics={metrics}", "compare.bootstrap.n=50"],
    )
    out = stage.run(cfg)
    d = Path(out["run_dir"])
    comp = tables.COMPARISON.read(d)
    assert comp["simulated"].all()
    assert {"comprehensiveness", "comprehensiveness_rank", "auprc_rank"} <= set(comp.columns)
    corr = tables.CORRELATIONS.read(d)
    assert set(corr["level"]) == {"method", "instance"} and corr["simulated"].all()
    md = (d / "comparison.md").read_text()
    assert md.startswith("# SIMULATED crowd — ") and "ag_news" in md
    assert (d / "rank_vs_rank.png").stat().st_size > 1000
    assert (d / "ols.txt").is_file() and (d / "instance_level.parquet").is_file()
    run = MlflowClient().get_run(out["run_id"])
    tags = run.data.tags
    assert tags["stage"] == "compare" and tags["simulated"] == "true"
    assert tags["dataset"] == "ag_news"
    assert {"link.score", "link.import", "link.metrics", "link.explain"} <= set(tags)
    assert "spearman_comprehensiveness" in run.data.metrics
    assert "instance_spearman_auprc" in run.data.metrics
    rows = method_rows(out["run_id"]).set_index("method")  # one child run per method
    assert rows["human_score"].to_dict() == pytest.approx(
        comp.set_index("method")["human_score"].to_dict()
    )
    assert (
        rows["comprehensiveness_rank"].to_dict()
        == comp.set_index("method")["comprehensiveness_rank"].to_dict()
    )
    assert json.loads((d / "run.json").read_text())["simulated"] == "true"


def test_compare_stage_refuses_two_datasets(make_cfg, tmp_path) -> None:
    from saleval.stages import compare as stage

    score, _ = fake_chain(tmp_path / "a", simulated=False, dataset="imdb")
    _, metrics = fake_chain(tmp_path / "b", simulated=False, dataset="ag_news")
    cfg = make_cfg("compare", [f"inputs.score={score}", f"inputs.metrics={metrics}"])
    with pytest.raises(ValueError, match="disagree on dataset.*imdb.*ag_news"):
        stage.run(cfg)
