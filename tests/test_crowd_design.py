"""Study design (docs/study-design.md): sampling, rendering, nested top-k, bundles, exports."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from saleval.config.crowd import DesignError, StudyConfig
from saleval.crowd.design import (
    assign_bundles,
    build_study,
    build_tasks,
    check_design,
    noisy_shown,
    render,
    task_id,
)
from saleval.crowd.design.duplicates import identical_methods, methods_to_drop
from saleval.crowd.design.sampling import SamplingError, select_samples
from saleval.crowd.export.formats import bundles_wide
from saleval.pipeline import tables
from saleval.pipeline.records.provenance import ProvenanceError
from saleval.schema import to_schema
from saleval.vocab import IDK
from tests.conftest import compose_config
from tests.crowd_support import AG_LABELS, METHODS, synthetic_explain, write_explain_run

PAPER_KS = [5, 10, 20, 30, 40]


@pytest.fixture(scope="module")
def paper_design() -> tuple[pd.DataFrame, pd.DataFrame, StudyConfig]:
    """The paper's design: N=100, 8 methods, k-grid 5..40, B=100, R=5 on 60-word texts."""
    preds, attrs = synthetic_explain(140, 60)
    study = StudyConfig(seed=3)
    d = build_study(preds, attrs, AG_LABELS, study, PAPER_KS)
    return d.tasks, d.bundles, study


# --- rendering and rankings ------------------------------------------------------------


def test_render_reproduces_the_spec_example() -> None:
    words = ["i", "saw", "jason", "in", "a", "film", "about", "the", "creative", "writing", "just",
             "like", "my", "old", "school", "first", "crush"]  # fmt: skip
    shown = {2, 8, 9, 10, 16}
    assert render(words, shown) == "..jason .....creative writing just .....crush "


def test_render_edge_cases() -> None:
    assert render(["a", "b", "c"], []) == "..."
    assert render(["a", "b", "c"], [0, 1, 2]) == "a b c "
    assert render(["it's", "U.S.", "3.5"], [1]) == ".U.S. ."
    with pytest.raises(DesignError, match="outside"):
        render(["a"], [1])


def _one_sample(scores: Sequence[float], order: Sequence[int] | None = None) -> pd.DataFrame:
    """Attribution rows of one sample "a" and method "m" (rows in ``order``, default 0..n-1)."""
    n = len(scores)
    df = pd.DataFrame(
        {
            "sample_id": "a",
            "method": "m",
            "word_index": np.arange(n),
            "word": [f"w{j}" for j in range(n)],
            "char_start": 0,
            "char_end": 1,
            "score": np.asarray(scores, dtype=float),
        }
    )
    return df if order is None else df.iloc[list(order)]


def test_top_k_breaks_ties_by_word_index_and_nests() -> None:
    sample = pd.DataFrame({"sample_id": ["a"], "label": [0], "pred": [0]})
    t = build_tasks(sample, _one_sample([0.5, 0.9, 0.5, 0.9, 0.1]), ["m"], [1, 2, 3, 4])
    assert t.set_index("k")["shown_words"].to_dict() == {1: "1", 2: "1 3", 3: "0 1 3", 4: "0 1 2 3"}
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=50).astype(float)  # many ties
    ks = [1, 5, 10, 20, 30, 40, 50]
    t = build_tasks(sample, _one_sample(scores), ["m"], ks)
    sets = [set(map(int, s.split())) for s in t.sort_values("k")["shown_words"]]
    assert [len(x) for x in sets] == ks
    assert all(a < b for a, b in itertools.pairwise(sets))
    # the most salient words first; among equal scores the earlier word first
    first5 = sorted(range(50), key=lambda j: (-scores[j], j))[:5]
    assert sets[1] == set(first5)
    # a permuted input table gives the same tasks
    shuffled = build_tasks(sample, _one_sample(scores, rng.permutation(50)), ["m"], ks)
    pd.testing.assert_frame_equal(shuffled, t)
    with pytest.raises(DesignError, match=r"sample 'a', method 'm': word scores are not finite"):
        build_tasks(sample, _one_sample([0.1, float("nan")]), ["m"], [1])


def test_build_tasks_on_hand_made_sample_with_text_shorter_than_k() -> None:
    samples = pd.DataFrame({"sample_id": ["a", "b"], "label": [1, 0], "pred": [1, 1]})
    attrs = pd.DataFrame(
        {
            "sample_id": ["a"] * 5 + ["b"] * 3,
            "method": ["m"] * 8,
            "word_index": [0, 1, 2, 3, 4, 0, 1, 2],
            "word": ["the", "match", "was", "won", "easily", "stocks", "fell", "sharply"],
            "char_start": 0,
            "char_end": 1,
            "score": [0.1, 0.9, 0.0, 0.8, 0.3, 0.2, 0.7, 0.1],
        }
    )
    t = build_tasks(samples, attrs, ["m"], [2, 4], target="gold").set_index("task_id")
    assert t.loc["a|m|k2", "display_text"] == ".match .won ."
    assert t.loc["a|m|k4", "display_text"] == "the match .won easily "
    assert t.loc["a|m|k4", "shown_words"] == "0 1 3 4"
    assert not t.loc["a|m|k4", "all_shown"]
    # 3 words, k=4: everything shown and flagged
    assert t.loc["b|m|k4", "display_text"] == "stocks fell sharply "
    assert t.loc["b|m|k4", "n_words_shown"] == 3 and t.loc["b|m|k4", "n_words"] == 3
    assert t.loc["b|m|k4", "all_shown"]
    assert t.loc["b|m|k2", "display_text"] == "stocks fell ."
    # target gold vs prediction
    assert t.loc["b|m|k2", "label"] == 0
    tp = build_tasks(samples, attrs, ["m"], [2], target="prediction").set_index("task_id")
    assert tp.loc["b|m|k2", "label"] == 1 and tp.loc["b|m|k2", "gold_label"] == 0
    assert task_id("ag_news-17", "lime", 5) == "ag_news-17|lime|k5"


def test_tasks_survive_the_csv_round_trip(tmp_path: Path) -> None:
    preds, attrs = synthetic_explain(8, [3, 12])
    samples = preds.assign(cell="x")
    t = build_tasks(samples, attrs, ["random", "lime"], [2, 5])
    tables.TASKS.write(t, tmp_path)
    back = tables.TASKS.read(tmp_path)
    assert back["display_text"].tolist() == t["display_text"].tolist()
    assert (
        back["display_text"].str.endswith(" ").any()
        and back["display_text"].str.startswith(".").any()
    )
    assert back["shown_words"].tolist() == t["shown_words"].tolist()


def test_noise_ablation_swaps_a_fraction_of_the_shown_words() -> None:
    ranking = np.arange(60)[::-1].copy()  # word 59 most salient
    top10 = set(ranking[:10].tolist())
    shown = noisy_shown(ranking, 10, 0.4, np.random.default_rng(1))
    assert len(shown) == 10
    assert len(set(shown.tolist()) & top10) == 6
    again = noisy_shown(ranking, 10, 0.4, np.random.default_rng(1))
    assert again.tolist() == shown.tolist()
    # not enough other words: swap what there is
    assert sorted(noisy_shown(np.arange(12), 10, 0.5, np.random.default_rng(0)).tolist()) != list(
        range(10)
    )
    assert len(noisy_shown(np.arange(5), 10, 0.5, np.random.default_rng(0))) == 5


# --- sampling ----------------------------------------------------------------------


def test_sampling_is_balanced_seeded_and_correct_only() -> None:
    preds, _ = synthetic_explain(200, 5, methods=["random"])
    a = select_samples(preds, 100, AG_LABELS, "correct", "label", seed=1)
    assert len(a) == 100 and a["sample_id"].is_unique
    assert (a["label"] == a["pred"]).all()
    assert a["label"].value_counts().to_dict() == {0: 25, 1: 25, 2: 25, 3: 25}
    b = select_samples(preds.sample(frac=1.0, random_state=5), 100, AG_LABELS, "correct", seed=1)
    assert a["sample_id"].tolist() == b["sample_id"].tolist()  # input order does not matter
    c = select_samples(preds, 100, AG_LABELS, "correct", seed=2)
    assert set(c["sample_id"]) != set(a["sample_id"])
    odd = select_samples(preds, 10, AG_LABELS, "correct", seed=1)
    assert sorted(odd["label"].value_counts().tolist()) == [2, 2, 3, 3]


def test_misclassified_population_and_clear_error_when_short() -> None:
    preds, _ = synthetic_explain(280, 5, methods=["random"])  # 40 wrong, 10 per gold class
    m = select_samples(preds, 20, AG_LABELS, "misclassified", "label", seed=0)
    assert (m["label"] != m["pred"]).all()
    assert m["label"].value_counts().to_dict() == {0: 5, 1: 5, 2: 5, 3: 5}
    with pytest.raises(
        SamplingError, match=r"not enough misclassified samples.*World: 10 available, 25 needed"
    ):
        select_samples(preds, 100, AG_LABELS, "misclassified", "label", seed=0)


def test_outcome_balance_for_forward_prediction() -> None:
    preds, _ = synthetic_explain(
        200, 5, methods=["random"], labels=["negative", "positive"], wrong_every=3
    )
    s = select_samples(preds, 20, ["negative", "positive"], "all", "outcome", seed=0)
    assert s["outcome"].value_counts().to_dict() == {"TN": 5, "FP": 5, "TP": 5, "FN": 5}


# --- the paper's design --------------------------------------------------------------


def test_paper_design_has_4000_tasks_in_200_verified_bundles(paper_design) -> None:
    tasks, bundles, _ = paper_design
    assert len(tasks) == 4000 and tasks["task_id"].is_unique
    assert tasks.groupby(["method", "k"]).size().eq(100).all()
    assert bundles["bundle_id"].nunique() == 200
    assert bundles.groupby("bundle_id").size().eq(100).all()
    assert check_design(tasks, bundles, repeats=5, bundle_size=100) == []
    # and the same facts directly, not only through the checker
    b = bundles.merge(tasks, on="task_id")
    assert b["task_id"].value_counts().eq(5).all() and b["task_id"].nunique() == 4000
    assert not b.duplicated(["bundle_id", "sample_id"]).any()
    per_method = b.groupby(["bundle_id", "method"]).size()
    assert per_method.between(12, 13).all() and len(per_method) == 200 * 8
    assert b.groupby(["bundle_id", "k"]).size().eq(20).all()
    # the five answers of a task come from five different bundles with different company
    copies = b[b["task_id"] == tasks["task_id"].iloc[0]]["bundle_id"].tolist()
    contents = [frozenset(b[b["bundle_id"] == x]["task_id"]) for x in copies]
    assert len(set(copies)) == 5 and len(set(contents)) == 5
    # positions are shuffled: bundles do not share one sample order
    orders = {tuple(g.sort_values("position")["sample_id"]) for _, g in b.groupby("bundle_id")}
    assert len(orders) == 200
    # nested top-k for every sample and method
    for (_, _), g in tasks.groupby(["sample_id", "method"]):
        sets = [set(map(int, s.split())) for s in g.sort_values("k")["shown_words"]]
        assert all(a < b_ for a, b_ in itertools.pairwise(sets))


def test_design_is_reproducible_from_its_seed() -> None:
    preds, attrs = synthetic_explain(60, 12, methods=METHODS[:3])
    study = StudyConfig(n_samples=20, bundle_size=20, repeats=2, seed=9)
    a = build_study(preds, attrs, AG_LABELS, study, [2, 5])
    b = build_study(preds, attrs, AG_LABELS, study, [2, 5])
    pd.testing.assert_frame_equal(a.bundles, b.bundles)
    pd.testing.assert_frame_equal(a.tasks, b.tasks)
    c = build_study(
        preds,
        attrs,
        AG_LABELS,
        StudyConfig(n_samples=20, bundle_size=20, repeats=2, seed=10),
        [2, 5],
    )
    assert not a.bundles.equals(c.bundles)


def test_smaller_bundles_and_uneven_shares_still_verify() -> None:
    # B < N (B | N): 4 groups of bundles; M=3, K=2 -> shares 10/3 and 5 per bundle
    preds, attrs = synthetic_explain(60, 12, methods=METHODS[:3])
    d = build_study(
        preds, attrs, AG_LABELS, StudyConfig(n_samples=40, bundle_size=10, repeats=3), [2, 5]
    )
    assert d.info["n_bundles"] == 40 * 6 * 3 // 10
    assert check_design(d.tasks, d.bundles, 3, 10) == []
    # B not dividing N: bundles straddle two laps; strict balance fails with a hint,
    # a tolerance of one lets it through and everything else still holds
    preds, attrs = synthetic_explain(40, 12, methods=METHODS)
    with pytest.raises(DesignError, match="study.balance_tolerance=1"):
        build_study(preds, attrs, AG_LABELS, StudyConfig(n_samples=20, bundle_size=8), [2, 5])
    loose = StudyConfig(n_samples=20, bundle_size=8, balance_tolerance=1)
    d = build_study(preds, attrs, AG_LABELS, loose, [2, 5])
    assert check_design(d.tasks, d.bundles, 5, 8, balance_tolerance=1) == []
    # class balance inside bundles (interleaved sample order)
    b = d.bundles.merge(d.tasks, on="task_id")
    assert b.groupby("bundle_id")["gold_label"].nunique().ge(3).all()


def test_check_design_catches_deliberately_broken_assignments(paper_design) -> None:
    tasks, bundles, _ = paper_design
    kinds = lambda v: {x.constraint for x in v}  # noqa: E731

    # 1. move a task into a bundle that already holds its sample
    broken = bundles.copy()
    b1 = broken[broken["bundle_id"] == "b001"]
    t_sample = tasks.set_index("task_id").loc[b1["task_id"].iloc[0], "sample_id"]
    other = tasks[(tasks["sample_id"] == t_sample) & ~tasks["task_id"].isin(b1["task_id"])][
        "task_id"
    ].iloc[0]
    broken.loc[b1.index[1], "task_id"] = other
    v = check_design(tasks, broken, 5, 100)
    assert {"same_sample", "repeats"} <= kinds(v)
    assert any(x.constraint == "same_sample" and x.where == "b001" for x in v)

    # 2. drop one answer slot
    v = check_design(tasks, bundles.drop(index=bundles.index[7]), 5, 100)
    assert {"bundle_size", "repeats", "positions"} <= kinds(v)

    # 3. a bundle of a single method
    lopsided = bundles.copy()
    rows = lopsided.index[lopsided["bundle_id"] == "b002"]
    t = tasks.set_index("task_id")
    lopsided.loc[rows, "task_id"] = [
        task_id(t.at[x, "sample_id"], "lime", int(t.at[x, "k"]))
        for x in lopsided.loc[rows, "task_id"]
    ]
    assert {"method_balance", "repeats"} <= kinds(check_design(tasks, lopsided, 5, 100))

    # 4. wrong gold flag, unknown task
    flagged = bundles.copy()
    flagged.loc[flagged.index[0], "is_gold"] = True
    flagged.loc[flagged.index[1], "task_id"] = "nope|lime|k5"
    assert {"gold_flag", "unknown_task"} <= kinds(check_design(tasks, flagged, 5, 100))

    # 5. a top-k set that is not nested, a wrong shown count, a missing task
    bad_tasks = tasks.copy()
    i = bad_tasks.index[(bad_tasks["method"] == "lime") & (bad_tasks["k"] == 10)][0]
    bad_tasks.loc[i, "shown_words"] = "0 1 2 3 4 5 6 7 8 9"
    bad_tasks.loc[bad_tasks.index[3], "n_words_shown"] = 1
    bad_tasks = pd.concat([bad_tasks, bad_tasks.iloc[[9]]]).drop(index=bad_tasks.index[5])
    v = check_design(bad_tasks, bundles, 5, 100)
    assert {"nested", "shown_count", "grid", "unknown_task", "duplicate_task"} <= kinds(v)


def test_numbers_that_cannot_be_met_fail_clearly() -> None:
    preds, attrs = synthetic_explain(60, 12, methods=METHODS[:3])
    with pytest.raises(DesignError, match="exceeds the N=20 samples"):
        build_study(preds, attrs, AG_LABELS, StudyConfig(n_samples=20, bundle_size=30), [2, 5])
    with pytest.raises(DesignError, match=r"do not fill bundles of B=7"):
        build_study(
            preds, attrs, AG_LABELS, StudyConfig(n_samples=20, bundle_size=7, repeats=1), [2, 5]
        )
    with pytest.raises(DesignError, match="baseline method 'random'"):
        build_study(
            preds,
            attrs[attrs["method"] != "random"],
            AG_LABELS,
            StudyConfig(n_samples=8, bundle_size=8),
            [2],
        )
    # methods that rank different words cannot be compared
    skew = attrs[~((attrs["method"] == "last_attention") & (attrs["word_index"] == 11))]
    with pytest.raises(DesignError, match="covers other words"):
        build_study(preds, skew, AG_LABELS, StudyConfig(n_samples=8, bundle_size=8, seed=1), [2])


def test_gold_questions_are_flagged_outside_the_study_and_verified() -> None:
    preds, attrs = synthetic_explain(140, 30, methods=METHODS[:2])
    study = StudyConfig(n_samples=40, bundle_size=40, repeats=2, gold_rate=0.1, gold_pool=8)
    d = build_study(preds, attrs, AG_LABELS, study, [5, 10])
    gold = d.tasks[d.tasks["is_gold"]]
    assert len(gold) == 8 and (gold["method"] == "gold").all()
    assert set(gold["label"]) == {0, 1, 2, 3}
    assert not set(gold["sample_id"]) & set(d.samples["sample_id"])
    assert (gold["label"] == gold["pred"]).all()
    assert d.bundles.groupby("bundle_id").size().eq(44).all()
    assert d.bundles.groupby("bundle_id")["is_gold"].sum().eq(4).all()
    assert check_design(d.tasks, d.bundles, 2, 40) == []


def test_assign_bundles_rejects_too_few_gold_items() -> None:
    preds, attrs = synthetic_explain(20, 8, methods=["random"])
    samples = preds.head(4)
    t = build_tasks(samples, attrs, ["random"], [2])
    with pytest.raises(DesignError, match="gold items"):
        assign_bundles(
            t,
            [samples["sample_id"].tolist()],
            ["random"],
            [2],
            4,
            1,
            gold_ids=["g"],
            gold_per_bundle=2,
        )


# --- identical methods ------------------------------------------------------------------


def _attrs(scores: dict[str, dict[str, Sequence[float]]]) -> pd.DataFrame:
    """Attribution rows by hand: sample -> method -> one score per word."""
    rows = [
        (sid, m, j, f"{sid}w{j}", 0, 1, float(v))
        for sid, by_method in scores.items()
        for m, vals in by_method.items()
        for j, v in enumerate(vals)
    ]
    cols = ["sample_id", "method", "word_index", "word", "char_start", "char_end", "score"]
    return pd.DataFrame(rows, columns=cols)


def test_identical_top_k_is_every_sample_at_every_k() -> None:
    # "deeplift" is input_x_gradient scaled (same ranking everywhere); "lime" agrees with
    # them on the top word of both samples but not on their top 3
    attrs = _attrs(
        {
            "a": {"random": [0.3, 0.1, 0.2, 0.4, 0.0], "ixg": [0.9, 0.1, 0.5, 0.3, 0.2],
                  "deeplift": [1.8, 0.2, 1.0, 0.6, 0.4], "lime": [0.9, 0.5, 0.1, 0.3, 0.2]},
            "b": {"random": [0.0, 0.2, 0.1, 0.4, 0.3], "ixg": [0.1, 0.7, 0.2, 0.6, 0.0],
                  "deeplift": [0.3, 2.1, 0.6, 1.8, 0.0], "lime": [0.6, 0.7, 0.2, 0.0, 0.1]},
        }
    )  # fmt: skip
    methods = ["random", "ixg", "deeplift", "lime"]
    assert identical_methods(attrs, methods, [1, 3]) == [("ixg", "deeplift")]
    # at k=1 alone lime shows the same words as well: the whole k-grid decides
    assert identical_methods(attrs, methods, [1]) == [
        ("ixg", "deeplift"), ("ixg", "lime"), ("deeplift", "lime")
    ]  # fmt: skip
    # one sample where they differ is enough to tell them apart
    differs = attrs.copy()
    at = (differs["sample_id"] == "b") & (differs["method"] == "deeplift")
    differs.loc[at, "score"] = [0.3, 0.1, 0.6, 1.8, 0.0]
    assert identical_methods(differs, methods, [1, 3]) == []
    assert identical_methods(differs, methods, [1, 3], sample_ids=["a"]) == [("ixg", "deeplift")]
    # a k past every text shows whole texts: only the smaller ks tell methods apart
    assert identical_methods(attrs, ["random", "lime"], [5]) == [("random", "lime")]
    assert identical_methods(attrs, methods, [1, 3], sample_ids=[]) == []


def test_methods_to_drop_keeps_the_first_of_each_group_and_the_baseline() -> None:
    order = ["random", "ixg", "deeplift", "ig", "lime"]
    assert methods_to_drop([("ixg", "deeplift")], order) == ["deeplift"]
    three = [("ixg", "deeplift"), ("ixg", "lime"), ("deeplift", "lime")]
    assert methods_to_drop(three, order, keep={"random"}) == ["deeplift", "lime"]
    assert methods_to_drop([("ixg", "random")], order, keep={"random"}) == ["ixg"]
    assert methods_to_drop([], order) == []


def _with_deeplift_as_ixg(attrs: pd.DataFrame) -> pd.DataFrame:
    """``attrs`` with DeepLIFT's scores twice input x gradient's, as on a decoder."""
    out = attrs.copy()
    ixg = out[out["method"] == "input_x_gradient"].set_index(["sample_id", "word_index"])["score"]
    dl = out["method"] == "deeplift"
    keys = pd.MultiIndex.from_frame(out.loc[dl, ["sample_id", "word_index"]])
    out.loc[dl, "score"] = 2 * ixg.reindex(keys).to_numpy()
    return out


def test_build_study_warns_about_identical_methods_and_drops_on_request(caplog) -> None:
    assert {"input_x_gradient", "deeplift"} <= set(METHODS)
    assert METHODS.index("input_x_gradient") < METHODS.index("deeplift")
    preds, attrs = synthetic_explain(60, 12)
    attrs = _with_deeplift_as_ixg(attrs)
    study = StudyConfig(n_samples=20, bundle_size=None, repeats=1)
    with caplog.at_level("WARNING", logger="saleval.crowd.design.study"):
        kept = build_study(preds, attrs, AG_LABELS, study, [2, 5])
    lines = [r.getMessage() for r in caplog.records if "identical top-k" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "input_x_gradient and deeplift" in lines[0] and "drop_duplicate_methods" in lines[0]
    assert kept.identical == [("input_x_gradient", "deeplift")] and kept.dropped == []
    assert "deeplift" in set(kept.tasks["method"])
    caplog.clear()
    with caplog.at_level("WARNING", logger="saleval.crowd.design.study"):
        d = build_study(preds, attrs, AG_LABELS, study, [2, 5], drop_identical=True)
    assert any("dropped" in r.getMessage() and "deeplift" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert d.dropped == ["deeplift"] and "deeplift" not in d.methods
    assert set(d.tasks["method"]) == set(METHODS) - {"deeplift"}
    assert d.info["n_dropped_methods"] == 1 and d.info["n_identical_pairs"] == 1
    # the samples are drawn before the drop: the same either way
    assert d.samples["sample_id"].tolist() == kept.samples["sample_id"].tolist()
    # distinct methods: nothing warned or dropped
    caplog.clear()
    preds, attrs = synthetic_explain(60, 12)
    with caplog.at_level("WARNING", logger="saleval.crowd.design.study"):
        d = build_study(preds, attrs, AG_LABELS, study, [2, 5], drop_identical=True)
    assert d.identical == [] and d.dropped == []
    assert not [r for r in caplog.records if "identical top-k" in r.getMessage()]


# --- the stage ------------------------------------------------------------------------


def test_tasks_stage_writes_and_logs_everything(tmp_path: Path, make_cfg: Callable) -> None:
    from saleval.stages import tasks as tasks_stage

    preds, attrs = synthetic_explain(140, 60)
    explain = write_explain_run(tmp_path / "explain", preds, attrs)
    # the synthetic explain run records only the dataset's name and labels: give the full
    # config (checked against the run's by the provenance rule)
    overrides = [f"inputs.explain={explain}", "study=main", "kgrid=paper", "dataset=ag_news"]
    out = tasks_stage.run(make_cfg("tasks", overrides))
    run_dir = Path(out["run_dir"])
    assert out["n_tasks"] == 4000 and out["n_bundles"] == 200
    t = tables.TASKS.read(run_dir)
    b = tables.BUNDLES.read(run_dir)
    assert check_design(t, b, 5, 100) == []
    wide = pd.read_csv(run_dir / "bundles_wide.csv", keep_default_na=False)
    assert len(wide) == 200 and wide["n_tasks"].eq(100).all()
    assert {"task_001_id", "task_001_text", "task_100_text"} <= set(wide.columns)
    assert wide.loc[0, "options"] == "World|Sports|Business|Sci/Tech|I don't know"
    first = b[(b["bundle_id"] == wide.loc[0, "bundle_id"]) & (b["position"] == 1)]["task_id"].item()
    assert wide.loc[0, "task_001_id"] == first
    assert wide.loc[0, "task_001_text"] == t.set_index("task_id").at[first, "display_text"]
    assert not any("label" in c or "gold" in c for c in wide.columns)
    instr = (run_dir / "instructions.md").read_text()
    assert "Judge only from the shown words" in instr and IDK in instr
    for name in AG_LABELS:
        assert f"### {name}" in instr
    assert "Sport: games, teams, athletes, results." in instr
    assert instr.count("Example (full text)") == 4
    info = json.loads((run_dir / "run.json").read_text())
    run = MlflowClient().get_run(info["run_id"])
    assert run.data.tags["stage"] == "tasks" and run.data.tags["study"] == "main"
    assert run.data.metrics["n_tasks"] == 4000
    logged = {a.path for a in MlflowClient().list_artifacts(info["run_id"])}
    assert {"tasks.csv", "bundles.csv", "bundles_wide.csv", "instructions.md"} <= logged


def test_tasks_stage_forward_study_and_dataset_checks(tmp_path: Path, make_cfg: Callable) -> None:
    from saleval.stages import tasks as tasks_stage

    preds, attrs = synthetic_explain(200, 20, methods=METHODS[:2], wrong_every=3)
    explain = write_explain_run(tmp_path / "explain", preds, attrs)
    cfg = make_cfg(
        "tasks",
        [
            f"inputs.explain={explain}",
            "dataset=ag_news",
            "study=forward",
            "kgrid=smoke",
            "study.n_samples=40",
            "study.bundle_size=40",
        ],
    )
    out = tasks_stage.run(cfg)
    t = tables.TASKS.read(out["run_dir"])
    assert (t["target"] == "prediction").all() and (t["label"] == t["pred"]).all()
    assert (t["label"] != t["gold_label"]).any()

    imdb = make_cfg("tasks", [f"inputs.explain={explain}", "dataset=imdb"], name="imdb")
    with pytest.raises(ProvenanceError, match="dataset=imdb is given.*pass dataset=ag_news"):
        tasks_stage.run(imdb)


def test_tasks_stage_drops_a_method_identical_to_another(
    tmp_path: Path, make_cfg: Callable
) -> None:
    from saleval.stages import tasks as tasks_stage

    methods = ["random", "input_x_gradient", "deeplift"]
    preds, attrs = synthetic_explain(60, 20, methods=methods)
    explain = write_explain_run(tmp_path / "explain", preds, _with_deeplift_as_ixg(attrs))
    base = [f"inputs.explain={explain}", "dataset=ag_news", "kgrid=smoke",
            "study.n_samples=20", "study.bundle_size=20"]  # fmt: skip
    assert compose_config("tasks", base).drop_duplicate_methods is False
    cfg = make_cfg("tasks", [*base, "drop_duplicate_methods=true"])
    out = tasks_stage.run(cfg)
    assert out["dropped_methods"] == ["deeplift"]
    assert set(tables.TASKS.read(out["run_dir"])["method"]) == {"random", "input_x_gradient"}
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["dropped_methods"] == "deeplift"
    assert run.data.tags["identical_methods"] == "input_x_gradient=deeplift"
    assert run.data.metrics["n_dropped_methods"] == 1


def test_study_options_compose_for_the_tasks_stage() -> None:

    main = compose_config("tasks", ["inputs.explain=x"])
    assert main.study.n_samples == 100 and main.study.bundle_size == 100 and main.study.repeats == 5
    assert main.study.population == "correct" and main.study.target == "gold"
    assert main.study.gold_rate == 0 and main.study.noise == 0 and main.study.seed == 42
    mis = compose_config("tasks", ["study=misclassified"])
    assert mis.study.population == "misclassified" and mis.study.bundle_size is None
    fwd = compose_config("tasks", ["study=forward"])
    assert fwd.study.target == "prediction" and fwd.study.balance_by == "outcome"
    for name in ("main", "misclassified", "forward", "smoke"):
        cfg = compose_config("tasks", [f"study={name}"])
        study = to_schema(StudyConfig, cfg.study)
        assert study.seed == 42 and study.name == name


def test_bundles_wide_pads_short_bundles() -> None:
    tasks = pd.DataFrame({"task_id": ["a", "b", "c"], "display_text": ["x ", ".y ", "z ."]})
    bundles = pd.DataFrame(
        {
            "bundle_id": ["b1", "b1", "b2"],
            "position": [1, 2, 1],
            "task_id": ["a", "b", "c"],
            "is_gold": False,
        }
    )
    w = bundles_wide(tasks, bundles, ["neg", "pos"])
    assert w["n_tasks"].tolist() == [2, 1]
    assert w.loc[1, "task_002_id"] is None or pd.isna(w.loc[1, "task_002_id"])
    assert w.loc[0, "task_002_text"] == ".y "


def test_instruction_examples_never_come_from_the_study() -> None:
    from saleval.crowd.export.formats import pick_examples

    preds = pd.DataFrame(
        {
            "sample_id": ["study", "wrong", "long", "short"],
            "text": ["a b c d e f", "one two three four five six", "w " * 50, "x y z q r"],
            "label": [0, 0, 1, 1],
            "pred": [0, 1, 1, 1],
            "prob_neg": [0.99, 0.4, 0.1, 0.2],
            "prob_pos": [0.01, 0.6, 0.9, 0.8],
        }
    )
    ex = pick_examples(preds, {"study"}, ["neg", "pos"], max_words=10)
    # neg: only a misclassified non-study text is left; pos: the short text beats the
    # more confident one that is too long
    assert ex == {"neg": "one two three four five six", "pos": "x y z q r"}
    assert pick_examples(preds, set(preds["sample_id"]), ["neg", "pos"]) == {
        "neg": None,
        "pos": None,
    }
