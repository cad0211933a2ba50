"""Hand-worked checks of the aggregation (docs/aggregation.md) and of the scores, flips and
reports (docs/scores.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from saleval.analysis import reports, scoring
from saleval.config.crowd import FiltersConfig
from saleval.crowd.answers import AnswerParser
from saleval.crowd.importing import aggregation, quality
from saleval.crowd.importing.source import crowd_source
from tests.conftest import compose_config

# --- strict majority (docs/aggregation.md#strict-majority) ---------------------------

# Answer codes: 0 = "I don't know", 1 = label 0, 2 = label 1. The target is label 0 (code 1).
STRICT_CASES = [
    ([1, 1, 2], 1),  # true label wins
    ([1, 1, 2, 2], 0),  # tie with another label
    ([1, 1, 0, 0, 2], 0),  # tie with "I don't know"
    ([0, 0, 0, 1, 1], 0),  # "I don't know" wins
    ([1, 0, 2], 0),  # three-way tie
    ([1, 1, 0], 1),  # beats "I don't know"
    ([2, 2, 1], 0),  # wrong majority
    ([1], 1),  # a single answer
    ([], 0),  # nobody answered: nothing beats anything
]


def _tasks(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": [f"t{i}" for i in range(n)],
            "sample_id": [f"s{i}" for i in range(n)],
            "method": "m",
            "k": 5,
            "label": 0,
            "display_text": "x",
            "n_words_shown": 1,
        }
    )


def _annotations(answers: list[list[int]], label: int = 0) -> pd.DataFrame:
    rows = [
        {
            "worker_id": f"w{m}",
            "task_id": f"t{i}",
            "sample_id": f"s{i}",
            "method": "m",
            "k": 5,
            "answer_code": code,
            "label": label,
        }
        for i, codes in enumerate(answers)
        for m, code in enumerate(codes)
    ]
    return pd.DataFrame(
        rows, columns=["worker_id", "task_id", "sample_id", "method", "k", "answer_code", "label"]
    )


def test_strict_majority_hand_worked() -> None:
    answers = [codes for codes, _ in STRICT_CASES]
    agg = aggregation.aggregate(_annotations(answers), _tasks(len(answers)))
    assert agg["correct"].tolist() == [want for _, want in STRICT_CASES]
    assert agg["n_answers"].tolist() == [len(a) for a in answers]
    assert agg["frac_correct"].iloc[0] == pytest.approx(2 / 3)
    assert np.isnan(agg["frac_correct"].iloc[-1])


def test_strict_majority_label_is_na_on_ties() -> None:
    data = pd.DataFrame(
        {"task": ["a", "a", "b", "b", "b"], "worker": list("xyxyz"), "label": [1, 2, 0, 0, 2]}
    )
    got = aggregation.StrictMajority().fit_predict(data)
    assert got.name == "agg_label"
    assert pd.isna(got["a"]) and got["b"] == 0


@pytest.mark.parametrize(
    "name,params",
    [
        ("majority_vote", {}),
        ("dawid_skene", {"n_iter": 20}),
        ("mace", {"n_restarts": 1, "n_iter": 10}),  # defaults (10 × 50) take ~30 s here
        ("glad", {"n_iter": 20}),
    ],
)
def test_crowdkit_aggregators_agree_on_clear_majorities(name: str, params: dict) -> None:
    # 12 tasks, 5 workers; 4 agree on the target, one answers "I don't know".
    answers = [[1, 1, 1, 1, 0] if i % 2 else [2, 2, 2, 2, 0] for i in range(12)]
    ann = _annotations(answers)
    extras = [f"+crowd.aggregator.{k}={v}" for k, v in params.items()]
    cfg = compose_config("import", [f"crowd/aggregator={name}", *extras])
    aggregator = crowd_source(cfg.crowd).build_aggregator()
    assert type(aggregator).__module__.startswith("crowdkit.aggregation")
    agg = aggregation.aggregate(ann, _tasks(12), aggregator)
    assert agg["correct"].tolist() == [i % 2 for i in range(12)]


def test_label_tensor_encoding() -> None:
    ann = _annotations([[1, 0], [2]])  # t0: w0 label 0, w1 IDK; t1: w0 label 1
    L, axes = aggregation.label_tensor(ann)
    assert axes["sample_id"] == ["s0", "s1"] and axes["worker_id"] == ["w0", "w1"]
    assert L.shape == (2, 1, 1, 2)
    assert L[:, 0, 0, :].tolist() == [[1, 0], [2, -1]]  # -1: w1 did not do t1


def test_unknown_aggregator_is_named() -> None:
    with pytest.raises(Exception, match=r"crowd/aggregator/nope[\s\S]*dawid_skene"):
        compose_config("import", ["crowd/aggregator=nope"])


def test_krippendorff_alpha_perfect_and_idk_as_missing() -> None:
    ann = _annotations([[1, 1, 1], [2, 2, 2], [1, 1, 1]])
    assert aggregation.krippendorff_alpha(ann) == pytest.approx(1.0)
    noisy = _annotations([[1, 1, 0], [2, 2, 0], [1, 1, 0]])
    assert aggregation.krippendorff_alpha(noisy, idk="category") < 0.5
    assert aggregation.krippendorff_alpha(noisy, idk="missing") == pytest.approx(1.0)


def test_expert_check_agreement_rate() -> None:
    tasks = _tasks(4)
    # crowd: correct on t0, t2
    agg = aggregation.aggregate(_annotations([[1, 1], [2, 2], [1, 1], [0, 0]]), tasks)
    assert agg["correct"].tolist() == [1, 0, 1, 0]
    # experts: correct on t0, t1, t2 (two experts agree on t1), wrong on t3
    expert = pd.DataFrame(
        {
            "task_id": ["t0", "t1", "t1", "t2", "t3"],
            "expert_id": ["e1", "e1", "e2", "e1", "e1"],
            "answer": ["negative", "NEGATIVE", "0", "negative", "positive"],
        }
    )
    got = aggregation.expert_check(expert, agg, tasks, AnswerParser(["negative", "positive"]))
    assert got["n_tasks"] == 4
    assert got["agreement"] == pytest.approx(0.75)
    assert got["expert_accuracy"] == pytest.approx(0.75)


# --- answer parsing ------------------------------------------------------------------


def test_answers_are_names_indices_or_idk_case_and_space_insensitive() -> None:
    parse = AnswerParser(["World", "Sports", "Business", "Sci/Tech"])
    assert [parse(a) for a in ["world", " SPORTS ", "Sci / Tech", "sci/tech", "3", "0", "2.0"]] == [
        1,
        2,
        4,
        4,
        4,
        1,
        3,
    ]
    assert {parse(a) for a in ["I don't know", "I DON’T  KNOW", "idontknow", "IDK"]} == {0}
    for bad in ["4", "-1", "Politics", ""]:
        with pytest.raises(ValueError):
            parse(bad)


# --- quality filters -----------------------------------------------------------------


def test_quality_filters_remove_fast_idk_and_gold_failing_workers() -> None:
    rows = []
    for w, codes, secs in [
        ("fast", [1, 2, 1, 2], 10.0),  # 40 s in total < 120 s
        ("idk", [0, 0, 0, 0], 60.0),
        ("goldfail", [1, 1, 1, 2], 60.0),  # gold answer wrong
        ("good", [1, 1, 2, 1], 60.0),
    ]:
        for i, code in enumerate(codes):
            rows.append(
                {
                    "worker_id": w,
                    "task_id": f"t{i}",
                    "sample_id": f"s{i}",
                    "method": "m",
                    "k": 5,
                    "answer_code": code,
                    "label": 0,
                    "duration_s": secs,
                    "is_gold": i == 3,
                }
            )
    ann = pd.DataFrame(rows)
    kept, removed, log = quality.apply_filters(
        ann, FiltersConfig(min_bundle_seconds=120, all_idk=True, gold_min_accuracy=0.5)
    )
    assert set(kept["worker_id"]) == {"good"}
    assert [(f["name"], f["workers"], f["n_answers"]) for f in log] == [
        ("min_bundle_seconds", ["fast"], 4),
        ("all_idk", ["idk"], 4),
        ("gold_min_accuracy", ["goldfail"], 4),
    ]
    assert len(removed) == 12 and set(removed["filter"]) == {f["name"] for f in log}
    # disabled filters remove nothing
    kept2, removed2, log2 = quality.apply_filters(
        ann, FiltersConfig(min_bundle_seconds=None, all_idk=False, gold_min_accuracy=None)
    )
    assert len(kept2) == len(ann) and removed2.empty and log2 == []


# --- formulas of docs/scores.md -----------------------------------------------------


def test_weight_formula_hand_worked() -> None:
    p = np.array([[0.2, 0.6], [0.4, 0.8]])  # 2 methods, K = 2
    # Σ_j Σ_k p = 2.0; Σ_j p_j1 = 0.6, Σ_j p_j2 = 1.4; K² = 4
    w = scoring.k_weights(p)
    assert w.tolist() == pytest.approx([2.0 / (4 * 0.6), 2.0 / (4 * 1.4)])
    s = scoring.method_scores(p)
    assert s.tolist() == pytest.approx(
        [0.2 * 2 / 2.4 + 0.6 * 2 / 5.6, 0.4 * 2 / 2.4 + 0.8 * 2 / 5.6]
    )
    # equal column sums: w_k = 1/K and s_j is the plain mean over k
    q = np.array([[0.3, 0.9, 0.6], [0.9, 0.3, 0.6]])
    assert scoring.k_weights(q).tolist() == pytest.approx([1 / 3] * 3)
    assert scoring.method_scores(q).tolist() == pytest.approx(q.mean(axis=1).tolist())
    # a column where every method scored 0 gets weight 0 (no division by zero)
    assert scoring.k_weights(np.array([[0.0, 0.5], [0.0, 0.5]])).tolist() == [0.0, 1.0 / (4 * 1.0)]
    # batched: leading dimensions are bootstrap replicates
    assert scoring.k_weights(np.stack([p, q[:, :2]])).shape == (2, 2)


def test_rank_ties_share_the_best_rank() -> None:
    assert scoring.rank_desc(np.array([0.5, 0.7, 0.5, 0.1])).tolist() == [2, 1, 2, 4]
    assert scoring.rank_desc(np.array([0.1 + 0.2, 0.3, 0.2])).tolist() == [1, 1, 3]
    cols = scoring.rank_desc(np.array([[0.5, 0.1], [0.5, 0.9], [0.2, 0.9]]), axis=0)
    assert cols.tolist() == [[1, 3], [1, 1], [3, 1]]


def _aggregated(A: dict[str, list[list[int]]], ks: list[int]) -> pd.DataFrame:
    rows = [
        {"sample_id": f"s{i}", "method": m, "k": k, "correct": a}
        for m, per_sample in A.items()
        for i, seq in enumerate(per_sample)
        for k, a in zip(ks, seq)
    ]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # order must not matter


def test_flips_and_aids_on_a_constructed_A() -> None:
    A = {
        "lime": [[1, 1, 1], [0, 1, 1], [1, 0, 1], [0, 0, 0], [0, 1, 0]],
        "random": [[1, 0, 0]] * 5,
    }
    cube = scoring.Cube.from_aggregated(_aggregated(A, [5, 10, 20]))
    assert cube.methods == ["lime", "random"] and cube.ks == [5, 10, 20]
    fl = scoring.flip_analysis(cube.A)
    # lime: s2 (1,0,1) and s4 (0,1,0) flip; s0 always; s3 never (counted in aids by the
    # formula of docs/scores.md#flips); s1 (0,1,1) is aided
    assert fl["flips"].tolist() == [2, 5]
    assert fl["always"].tolist() == [1, 0]
    assert fl["never"].tolist() == [1, 0]
    assert fl["aids"].tolist() == [5 - 2 - 1, 0]
    hist = scoring.flip_histogram(fl["flipped"])
    assert hist["n_samples"].tolist() == [0, 3, 2]  # s0,s1,s3 flip under one method; s2,s4 two


def test_score_end_to_end_on_a_small_A() -> None:
    A = {
        "integrated_gradients": [[1, 1], [1, 1], [0, 1], [1, 1]],
        "lime": [[0, 1], [0, 1], [0, 0], [1, 1]],
        "random": [[0, 1], [0, 1], [0, 0], [1, 1]],
    }
    res = scoring.score(_aggregated(A, [5, 10]), n_bootstrap=200, n_resamples=999)
    acc = res.accuracy.set_index(["method", "k"])["accuracy"]
    assert acc[("integrated_gradients", 5)] == pytest.approx(75.0)
    assert acc[("lime", 10)] == pytest.approx(75.0)
    # p = [[.75, 1], [.25, .75], [.25, .75]]: Σ = 3.75, columns 1.25 and 2.5, K² = 4
    w5, w10 = 3.75 / (4 * 1.25), 3.75 / (4 * 2.5)
    assert res.weights == pytest.approx({5: w5, 10: w10})
    sc = res.scores.set_index("method")
    assert sc.loc["integrated_gradients", "score"] == pytest.approx(100 * (0.75 * w5 + 1.0 * w10))
    assert sc["rank"].tolist() == [1, 2, 2]  # lime ties random
    assert sc.loc["lime", "p_vs_random"] == 1.0 and np.isnan(sc.loc["random", "p_vs_random"])
    assert (sc["ci_low"] <= sc["score"]).all() and (sc["score"] <= sc["ci_high"]).all()
    r = res.accuracy.set_index(["method", "k"])["rank"]
    assert r[("lime", 10)] == 2 and r[("random", 10)] == 2 and r[("integrated_gradients", 10)] == 1


def test_paired_test_separates_a_clear_winner_from_random() -> None:
    rng = np.random.default_rng(0)
    A = np.zeros((40, 2, 3))
    A[:, 0, :] = 1.0
    A[:, 1, :] = rng.random((40, 3)) < 0.3
    p = scoring.paired_test(A, baseline=1, n_resamples=9999, seed=0)
    assert p[0] < 0.001 and np.isnan(p[1])


def test_missing_cells_are_left_out_not_counted_wrong() -> None:
    agg = _aggregated({"lime": [[1, 1], [0, 1]], "random": [[0, 0], [0, 1]]}, [5, 10])
    agg = agg[~((agg["sample_id"] == "s1") & (agg["method"] == "lime") & (agg["k"] == 5))]
    res = scoring.score(agg, n_bootstrap=50, n_resamples=99)
    a = res.accuracy.set_index(["method", "k"])
    assert a.loc[("lime", 5), "accuracy"] == 100.0 and a.loc[("lime", 5), "n"] == 1
    assert res.flips.set_index("method").loc["lime", "always"] == 1  # s1 incomplete: left out


def test_forward_prediction_outcomes_and_misclassified_counts() -> None:
    # binary; target = the model's prediction; positive class 1
    rows = []
    for i, (gold, pred) in enumerate([(1, 1), (0, 0), (0, 1), (1, 0)]):  # TP TN FP FN
        for k, correct in [(5, i % 2), (10, 1)]:
            rows.append(
                {
                    "sample_id": f"s{i}",
                    "method": "lime",
                    "k": k,
                    "correct": correct,
                    "label": pred,
                    "gold_label": gold,
                    "pred": pred,
                }
            )
    agg = pd.DataFrame(rows)
    out = scoring.outcome_breakdown(agg, positive=1, n_labels=2)
    k5 = out[out["k"] == "5"].set_index("outcome")["accuracy"]
    assert k5.to_dict() == {"FN": 100.0, "FP": 0.0, "TN": 100.0, "TP": 0.0}
    pooled = out[out["k"] == "all"].set_index("outcome")
    assert pooled.loc["TP", "accuracy"] == 50.0 and pooled.loc["TP", "n"] == 2
    counts = scoring.recognised_counts(scoring.Cube.from_aggregated(agg))
    assert counts.set_index("k")["recognised"].to_dict() == {5: 2, 10: 4}


# --- reports -------------------------------------------------------------------------


def test_paper_table_bold_best_underline_top3_and_simulated_title(tmp_path) -> None:
    A = {
        m: [[1, 1]] * (4 - i) + [[0, 0]] * i
        for i, m in enumerate(["integrated_gradients", "vanilla_gradient", "deeplift", "lime"])
    }
    res = scoring.score(_aggregated(A, [5, 10]), n_bootstrap=20, n_resamples=99)
    md = reports.scores_markdown(res.accuracy, res.scores, "toy", simulated=True, flips=res.flips)
    assert md.startswith("# SIMULATED crowd: toy")
    rows = {
        line.split(" | ")[0][2:]: line
        for line in md.split("\n## ")[0].splitlines()
        if line.startswith("| ")
    }
    # paper row order: vanilla gradient before integrated gradients
    assert list(rows)[1:5] == ["Vanilla Gradient", "Integrated Gradients", "DeepLIFT", "LIME"]
    assert rows["Integrated Gradients"].startswith("| Integrated Gradients | **100.0 (1)** |")
    assert "<u>75.0 (2)</u>" in rows["Vanilla Gradient"] and "<u>50.0 (3)</u>" in rows["DeepLIFT"]
    assert rows["LIME"] == "| LIME | 25.0 (4) | 25.0 (4) | 25.00 (4) |"
    tex = reports.scores_latex(res.accuracy, res.scores, "toy", simulated=False)
    assert r"\textbf{100.0 (1)}" in tex and r"\underline{75.0 (2)}" in tex
    assert "SIMULATED" not in tex
    png = reports.plot_flip_histogram(res.histogram, tmp_path / "h.png", "toy", simulated=True)
    assert png.stat().st_size > 1000
