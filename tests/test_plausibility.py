"""Plausibility metrics (ERASER: AUPRC, token F1, IOU F1) on hand-made rationales."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from saleval.metrics import plausibility as P
from saleval.pipeline import tables
from saleval.words import word_spans
from tests.conftest import DATA_ROOT, compose_config
from tests.metrics_support import fake_explain_run, fake_train_run, load_tok


@pytest.fixture(scope="module")
def tok():
    return load_tok()


@pytest.fixture(scope="module")
def train_run(tmp_path_factory, tok) -> Path:
    # the eraser_movies classes: the metrics stage checks the model's labels against them
    return fake_train_run(tmp_path_factory.mktemp("train") / "run", tok, ("negative", "positive"))


TEXT = "the acting was superb but the plot dragged"
#        0   1      2   3      4   5   6    7
HUMAN_SPAN = [[4, 21]]  # "acting was superb"


def human_mask() -> np.ndarray:
    return P.rationale_word_mask(word_spans(TEXT), HUMAN_SPAN)


def test_rationale_words_by_character_overlap() -> None:
    assert human_mask().tolist() == [False, True, True, True, False, False, False, False]
    # a span that ends inside a word still makes it a rationale word
    assert P.rationale_word_mask(word_spans(TEXT), [[37, 39]]).tolist()[-1]
    assert not P.rationale_word_mask(word_spans(TEXT), []).any()


def test_auprc_by_hand() -> None:
    scores = [0, 0.8, 0.1, 0.9, 0, 0, 0.7, 0]
    # ranking: superb (R), acting (R), plot (-), was (R): precisions at hits 1, 1, 3/4
    assert P.auprc(human_mask(), scores) == pytest.approx((1 + 1 + 0.75) / 3)
    assert P.auprc(human_mask(), [0, 3, 2, 1, 0, 0, 0, 0]) == pytest.approx(1.0)
    assert math.isnan(P.auprc(np.zeros(8, bool), scores))


def test_token_f1_and_iou_f1_by_hand() -> None:
    h = human_mask()
    # top-3 = superb, acting, plot: 2 of 3 right, 2 of 3 found
    s = P.plausibility_scores(h, [0, 0.8, 0.1, 0.9, 0, 0, 0.7, 0])
    assert s["token_f1"] == pytest.approx(2 / 3)
    # predicted spans [1,2) [3,4) [6,7) each have IOU 1/3 with the human span [1,4): no match
    assert s["iou_f1"] == 0.0
    # top-3 = the human span exactly
    s = P.plausibility_scores(h, [0, 0.8, 0.85, 0.9, 0, 0, 0.7, 0])
    assert s["token_f1"] == 1.0 and s["iou_f1"] == 1.0
    # fixed k = 2: 'acting was' -> span [1,3), IOU 2/3 >= 0.5 matches; token F1 = 2*1*(2/3)/(5/3)
    s = P.plausibility_scores(h, [0, 0.9, 0.8, 0, 0, 0, 0, 0], top_k=2)
    assert s["iou_f1"] == 1.0
    assert s["token_f1"] == pytest.approx(0.8)
    # two human spans, one predicted matching one of them: P = 1, R = 1/2
    two = np.array([1, 1, 0, 0, 1, 1, 0, 0], bool)
    assert P.iou_f1(two, np.array([1, 1, 0, 0, 0, 0, 0, 0], bool)) == pytest.approx(2 / 3)
    assert P.iou_f1(two, np.array([1, 1, 0, 0, 0, 0, 0, 0], bool), threshold=1.01) == 0.0


def test_contiguous_spans() -> None:
    assert P.contiguous_spans(np.array([1, 1, 0, 1, 0, 0, 1], bool)) == [(0, 2), (3, 4), (6, 7)]
    assert P.contiguous_spans(np.zeros(3, bool)) == []


@pytest.mark.skipif(not DATA_ROOT.is_dir(), reason="../shared/data not present")
def test_metrics_stage_adds_plausibility_on_eraser_movies(
    make_cfg,
    train_run,
    tok,
    tmp_path,
) -> None:
    from saleval.modeling.data import load_dataset
    from saleval.stages import metrics as stage

    dcfg = compose_config("train", ["dataset=eraser_movies"]).dataset
    test = load_dataset(dcfg)["test"]
    early = test["rationale_spans"].map(lambda spans: min(s for s, _ in spans) < 150)
    test = test[early].head(3)  # rationales inside the tiny model's 64-token window
    ds = OmegaConf.to_container(dcfg, resolve=True)
    texts = dict(zip(test["sample_id"], test["text"]))
    explain = fake_explain_run(tmp_path / "explain", tok, texts, ds)
    # an 'oracle' method scoring exactly the human rationale words (within the 64-token window)
    attrs = tables.ATTRIBUTIONS.read(explain)
    oracle = []
    for sid, spans in zip(test["sample_id"], test["rationale_spans"]):
        a = attrs[(attrs.sample_id == sid) & (attrs.method == "random")].copy()
        human = P.rationale_word_mask(list(zip(a.char_start, a.char_end)), spans)
        oracle.append(a.assign(method="oracle", score=human.astype(float)))
    tables.ATTRIBUTIONS.write(pd.concat([attrs, *oracle], ignore_index=True), explain)
    cfg = make_cfg(
        "metrics",
        [
            f"inputs.model={train_run}",
            f"inputs.explain={explain}",
            "metrics=quick",
            "metrics.ks=[5]",
            "metrics.plausibility.convention=both",
            "progress=false",
        ],
    )
    out = stage.run(cfg)
    summary = tables.METRICS.read(out["run_dir"]).set_index(["method", "metric"])
    for m in ("auprc", "token_f1", "iou_f1", "eraser_auprc", "eraser_token_f1", "eraser_iou_f1"):
        assert (("oracle", m) in summary.index) and (("random", m) in summary.index)
    has_rationale = summary.loc[("oracle", "auprc"), "n"]
    assert has_rationale >= 1  # texts whose rationale lies beyond the window are skipped
    assert summary.loc[("oracle", "auprc"), "value"] == pytest.approx(1.0)
    assert summary.loc[("oracle", "token_f1"), "value"] == pytest.approx(1.0)
    assert summary.loc[("random", "auprc"), "value"] < 1.0
    # ERASER's convention: whole documents on ERASER's tokens, so the oracle, which scores
    # the rationale words inside the 64-token window only, misses punctuation and the rest
    assert summary.loc[("oracle", "eraser_token_f1"), "n"] == 3
    assert summary.loc[("oracle", "eraser_token_f1"), "value"] < 0.5
    p, r = (summary.loc[("oracle", f"eraser_iou_{x}"), "value"] for x in ("precision", "recall"))
    f1 = summary.loc[("oracle", "eraser_iou_f1"), "value"]
    assert f1 == pytest.approx(0.0 if p * r == 0 else 2 * p * r / (p + r))
    run = mlflow.get_run(out["run_id"])
    assert run.data.tags["plausibility_document"] == "rank_last"  # 64 tokens: every text cut
    assert run.data.metrics["eraser_texts_cut"] == 3
    # what ERASER's scorer reads: its documents as it tokenizes them (lines stripped,
    # split on single spaces), one soft score per token, hard spans inside, not overlapping
    eraser_dir = Path(out["run_dir"]) / "eraser"
    ids = {f"{sid}.txt" for sid in test["sample_id"]}
    kept = [json.loads(x) for x in (eraser_dir / "test.jsonl").read_text().splitlines()]
    assert {a["annotation_id"] for a in kept} == ids and (eraser_dir / "docs").is_dir()
    for method in ("oracle", "random"):
        lines = [json.loads(x) for x in (eraser_dir / f"{method}.jsonl").read_text().splitlines()]
        assert {x["annotation_id"] for x in lines} == ids
        for line in lines:
            (rat,) = line["rationales"]
            doc = (eraser_dir / "docs" / rat["docid"]).read_text().splitlines()
            n = sum(len([t for t in ln.strip().split(" ") if t]) for ln in doc if ln.strip())
            assert len(rat["soft_rationale_predictions"]) == n
            spans = sorted(
                (h["start_token"], h["end_token"]) for h in rat["hard_rationale_predictions"]
            )
            assert all(0 <= a < b <= n for a, b in spans)
            assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(spans))


# -- ERASER's own convention (docs/metrics.md#eraser) --------------------------------
#
# One review in ERASER's tokens, punctuation included, with two evidence spans annotated
# side by side ([1,4) "plot , sadly" and [4,7) ", drags .") and a third, [9,11):
#
#   token  0    1    2  3     4  5     6  7   8   9    10     11
#          the  plot ,  sadly ,  drags .  but the cast shines .
#   gold        x    x  x     x  x     x          x    x
#
# and a method's word scores (punctuation is no word, so it has none):
#   the .1, plot .9, sadly .8, drags .2, but .05, the 0, cast .7, shines .6.
#
# saleval's convention (words, spans merged across punctuation, per-text means): the 5
# rationale words are exactly the top 5, so AUPRC = token F1 = IOU F1 = 1.
#
# ERASER's: 8 gold tokens, so k = 8 tokens; the punctuation ranks last (one value below
# every word's), so the top 8 are 0 1 3 5 7 8 9 10, runs [0,2) [3,4) [5,6) [7,11).
# * token F1: 5 of 8 right, 5 of 8 found: 0.625.
# * IOU: [0,2)~[1,4) 1/4, [3,4)~[1,4) 1/3, [5,6)~[4,7) 1/3, [7,11)~[9,11) 2/4 = 0.5, a
#   match. P = 1/4 of predicted spans, R = 1 matched / 3 gold spans: F1 = 2/7. (Merged
#   into [1,7), the first two spans would score otherwise: the annotated spans count.)
# * AUPRC: ranking .9 .8 .7 .6 .2 all gold (precision 1 up to recall 5/8), then .1 .05 0
#   not (precision 5/6, 5/7, 5/8 at recall 5/8), then the four punctuation tokens, tied
#   at the bottom, 3 gold of 4: precision 8/12 at recall 1. Trapezoid: 5/8 · 1 +
#   3/8 · (5/8 + 2/3)/2 = 0.8671875; average precision would be 5/8 + 3/8 · 2/3 = 0.875.

REVIEW = "the plot , sadly , drags . but the cast shines ."
EVIDENCE = [(1, 4), (4, 7), (9, 11)]
WORD_SCORES = [0.1, 0.9, 0.8, 0.2, 0.05, 0.0, 0.7, 0.6]


def _review_document(top_k: int | None = None):
    from saleval.metrics import eraser as E

    tokens = E.document_tokens(REVIEW)
    chars = [[tokens[s][0], tokens[e - 1][1]] for s, e in EVIDENCE]
    gold = E.gold_token_spans(EVIDENCE, tokens, chars, "review")
    scores, scored = E.token_scores(tokens, word_spans(REVIEW), WORD_SCORES)
    return E.Document.build("review", gold, scores, top_k), chars, scored


def test_eraser_convention_by_hand_differs_from_salevals() -> None:
    from saleval.metrics import eraser as E

    doc, chars, scored = _review_document()
    assert len(doc.scores) == 12 and scored.tolist() == [True, True, False, True, False,
        True, False, True, True, True, True, False]  # fmt: skip
    assert doc.predicted == ((0, 2), (3, 4), (5, 6), (7, 11))
    assert E.token_f1(doc) == pytest.approx(0.625)
    assert E.iou_counts(doc, 0.5) == (1, 4, 3)
    figures = E.summary(pd.DataFrame([E.per_document(doc, 0.5)]))
    assert figures["eraser_iou_f1"] == pytest.approx(2 / 7)
    assert figures["eraser_auprc"] == pytest.approx(0.8671875)
    assert figures["eraser_token_f1"] == pytest.approx(0.625)
    # saleval's convention on the same text and scores
    human = P.rationale_word_mask(word_spans(REVIEW), chars)
    assert human.tolist() == [False, True, True, True, False, False, True, True]
    assert P.plausibility_scores(human, WORD_SCORES) == {
        "auprc": 1.0,
        "token_f1": 1.0,
        "iou_f1": 1.0,
    }


def test_eraser_iou_f1_is_f1_of_macro_precision_and_recall() -> None:
    """Two documents: the review (P 1/4, R 1/3) and one found exactly (P = R = 1). ERASER:
    F1 of P = 5/8 and R = 2/3, 20/31; the mean of per-text F1 would be (1 + 2/7)/2 = 9/14."""
    from saleval.metrics import eraser as E

    review, _, _ = _review_document()
    exact = E.Document.build("exact", [(0, 2)], np.array([1.0, 1.0, 0.0]))
    values = pd.DataFrame([E.per_document(d, 0.5) for d in (review, exact)])
    assert E.summary(values)["eraser_iou_f1"] == pytest.approx(20 / 31)
    # documents without a prediction count 0 in recall, and are not in precision's average
    silent = E.Document.build("silent", [(1, 2)], np.array([1.0, 0.0, 0.0]), top_k=0)
    values = pd.DataFrame([E.per_document(d, 0.5) for d in (exact, silent)])
    s = E.summary(values)
    assert (s["eraser_iou_precision"], s["eraser_iou_recall"]) == (1.0, 0.5)
    assert s["eraser_token_f1"] == 0.5  # the silent one scores 0


def test_eraser_recall_counts_matched_predicted_spans() -> None:
    """As ERASER's scorer: recall's hits are predicted spans whose best IOU passes, so one
    wide prediction over two overlapping gold spans finds one of two."""
    from saleval.metrics import eraser as E

    doc = E.Document("d", frozenset({(0, 4), (2, 6)}), np.zeros(6), ((0, 6),))  # IOU 4/6 with each
    assert E.iou_counts(doc, 0.5) == (1, 1, 2)
    assert E.token_f1(doc) == 1.0  # the gold tokens, counted once: 0..5


def test_eraser_words_past_the_window_rank_last() -> None:
    """A truncated explanation scores only the words in the window: the rest of the
    document ranks below them, tied, and its gold tokens still count."""
    from saleval.metrics import eraser as E

    tokens = E.document_tokens(REVIEW)
    window = word_spans(REVIEW)[:3]  # the model read 'the plot , sadly'
    scores, scored = E.token_scores(tokens, window, [-3.0, -1.0, -2.0])
    assert scored.sum() == 3 and scores[scored].tolist() == [-3.0, -1.0, -2.0]
    assert (scores[~scored] == -6.0).all()  # one value below the lowest, whatever the scale
    doc = E.Document.build("review", EVIDENCE, scores)
    # top 8: plot sadly the, then the first five unscored tokens in text order (2 4 5 6 7):
    # tokens 0..7, of which 1..6 are gold (6 of 8 gold found, 6 of 8 right)
    assert doc.predicted == ((0, 8),)
    assert E.token_f1(doc) == pytest.approx(0.75)
    assert E.iou_counts(doc, 0.5) == (0, 1, 3)  # [0,8) has IOU 3/8 with [1,4) and [4,7)


def test_eraser_results_line_is_what_the_scorer_reads() -> None:
    from saleval.metrics import eraser as E

    doc, _, _ = _review_document()
    line = E.results_line("negR_001.txt", "negR_001.txt", doc)
    (rat,) = line["rationales"]
    assert line["annotation_id"] == "negR_001.txt" and rat["docid"] == "negR_001.txt"
    assert [(h["start_token"], h["end_token"]) for h in rat["hard_rationale_predictions"]] == [
        (0, 2), (3, 4), (5, 6), (7, 11)]  # fmt: skip
    assert rat["soft_rationale_predictions"] == doc.scores.tolist()
    with pytest.raises(ValueError, match="do not cover the rationale's characters"):
        E.gold_token_spans([(1, 4)], E.document_tokens(REVIEW), [[0, 3]], "review")


def test_eraser_auprc_of_a_document_without_gold_is_the_scorers() -> None:
    """ERASER's scorer takes scikit-learn's curve as it comes, and so does saleval. For a
    document without a gold token (posR_161 of the movies' training split) scikit-learn
    (≥ 1.1, as locked) sets recall to 1 at every threshold, where precision is 0, and
    closes the curve at recall 0, precision 1: the trapezoid is 1 · (0 + 1) / 2 = 0.5,
    whatever the scores. Checked against the scorer (docs/benchmarks.md#eraser-agreement);
    under its own pinned scikit-learn 0.20.3 recall there is 0/0 and its AUPRC NaN."""
    from saleval.metrics import eraser as E

    for scores in ([0.1, 0.5, 0.2, 0.2], [3.0, 2.0, 1.0, 0.0]):
        doc = E.Document.build("none", [], np.array(scores), top_k=2)
        assert E.auprc(doc) == 0.5
        values = E.per_document(doc, 0.5)
        assert values["eraser_token_f1"] == 0.0  # predicted, nothing to find: F1 0, counted
        assert values["eraser_iou_precision"] == 0.0 and math.isnan(values["eraser_iou_recall"])
    # with k = its gold tokens (none) nothing is predicted: out of token F1 and IOU
    silent = E.per_document(E.Document.build("none", [], np.array([1.0, 0.0])), 0.5)
    assert math.isnan(silent["eraser_token_f1"]) and math.isnan(silent["eraser_iou_precision"])


class _RunDir:
    """What write_eraser_inputs asks of a Stage: a path in the run dir, a file to log."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        pass


@pytest.mark.skipif(not DATA_ROOT.is_dir(), reason="../shared/data not present")
def test_eraser_inputs_warn_when_a_method_explains_fewer_documents(tmp_path, caplog) -> None:
    """The scorer takes every annotation of eraser/test.jsonl as truth, so a method missing
    one of them scores 0 there in ERASER's terms, while saleval leaves it out: said."""
    from saleval.metrics import eraser as E
    from saleval.stages.metrics import write_eraser_inputs

    dcfg = compose_config("train", ["dataset=eraser_movies"]).dataset
    doc = E.Document.build("d", [(0, 1)], np.array([1.0, 0.0]))
    line = {a: E.results_line(a, a, doc) for a in ("negR_900.txt", "negR_901.txt")}
    both = {"random": list(line.values()), "oracle": list(line.values())}
    scored = E.Scored(pd.DataFrame(), pd.DataFrame(), both, E.Coverage(2, 0, 2, 0))
    with caplog.at_level("WARNING", logger="saleval.stages.metrics"):
        out = write_eraser_inputs(_RunDir(tmp_path), scored, dcfg, "test")
    assert not caplog.records
    kept = [json.loads(x)["annotation_id"] for x in (out / "test.jsonl").read_text().splitlines()]
    assert sorted(kept) == ["negR_900.txt", "negR_901.txt"]
    scored.results["oracle"] = [line["negR_900.txt"]]
    with caplog.at_level("WARNING", logger="saleval.stages.metrics"):
        write_eraser_inputs(_RunDir(tmp_path), scored, dcfg, "test")
    (record,) = caplog.records
    assert "eraser/oracle.jsonl explains 1 of the 2 documents in eraser/test.jsonl" in (
        record.getMessage()
    )
