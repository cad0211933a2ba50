"""Plausibility metrics (ERASER: AUPRC, token F1, IOU F1) on hand-made rationales."""

from __future__ import annotations

import math
from pathlib import Path

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
            "progress=false",
        ],
    )
    out = stage.run(cfg)
    summary = tables.METRICS.read(out["run_dir"]).set_index(["method", "metric"])
    for m in ("auprc", "token_f1", "iou_f1"):
        assert (("oracle", m) in summary.index) and (("random", m) in summary.index)
    has_rationale = summary.loc[("oracle", "auprc"), "n"]
    assert has_rationale >= 1  # texts whose rationale lies beyond the window are skipped
    assert summary.loc[("oracle", "auprc"), "value"] == pytest.approx(1.0)
    assert summary.loc[("oracle", "token_f1"), "value"] == pytest.approx(1.0)
    assert summary.loc[("random", "auprc"), "value"] < 1.0
