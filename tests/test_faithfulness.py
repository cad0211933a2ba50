"""Faithfulness metrics (docs/metrics.md) on a hand-built model whose output depends on known words.

The model's logits count token ids: every ``good`` adds 1 to class 1, every ``bad``
adds 1.5 to class 0, and ``[CLS]`` adds a bias of 0.25 to class 1. So with g goods
and b bads left, p(1|x) = σ(0.25 + g − 1.5 b) and every metric has a closed form.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from scipy import stats
from transformers import PreTrainedTokenizerBase

from saleval.metrics import faithfulness as F
from saleval.metrics.config import MetricsConfig, n_words_for_fraction
from saleval.pipeline import tables
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.words import segment
from tests.metrics_support import (
    AG_TEXTS,
    CFG,
    SCORES,
    TEXT,
    WEIGHTS,
    CountModel,
    fake_explain_run,
    fake_train_run,
    load_tok,
    p1,
    sig,
)


@pytest.fixture(scope="module")
def tok():
    return load_tok()


@pytest.fixture(scope="module")
def train_run(tmp_path_factory, tok) -> Path:
    return fake_train_run(tmp_path_factory.mktemp("train") / "run", tok)


@pytest.fixture(scope="module")
def hand_result(tok):
    seg = segment(TEXT, tok, 64)
    assert seg.words == ["good", "bad", "good", "unbelievably", "plot"]
    exps = [F.Explanation("s1", m, seg, s) for m, s in SCORES.items()]
    model = CountModel(tok, WEIGHTS)
    res = F.evaluate(model, tok, exps, CFG)
    v = res.per_example.set_index(["method", "metric", "k"])["value"]
    return res, v, model


def test_full_text_prediction_and_confidence(hand_result) -> None:
    res, _, _ = hand_result
    assert res.full["pred"].tolist() == [1]
    assert res.full["confidence"].iloc[0] == pytest.approx(p1(2, 1))


def test_comprehensiveness_and_sufficiency_take_hand_values(hand_result) -> None:
    _, v, _ = hand_result
    full = p1(2, 1)
    # oracle: removing good0 leaves 1 good 1 bad; removing both goods leaves the bad
    assert v["oracle", "comprehensiveness", "1"] == pytest.approx(full - p1(1, 1))
    assert v["oracle", "comprehensiveness", "2"] == pytest.approx(full - p1(0, 1))
    assert v["oracle", "comprehensiveness", "3"] == pytest.approx(full - p1(0, 1))
    # sufficiency: only the top words are shown
    assert v["oracle", "sufficiency", "1"] == pytest.approx(full - p1(1, 0))
    assert v["oracle", "sufficiency", "2"] == pytest.approx(full - p1(2, 0))
    assert v["bad_first", "sufficiency", "1"] == pytest.approx(full - p1(0, 1))
    # ERASER bins on 5 words: 20 % -> 1 word, 50 % -> ceil(2.5) = 3 words; then averaged
    c1, c3 = full - p1(1, 1), full - p1(0, 1)
    assert v["oracle", "comprehensiveness", "0.2"] == pytest.approx(c1)
    assert v["oracle", "comprehensiveness", "0.5"] == pytest.approx(c3)
    assert v["oracle", "comprehensiveness", ""] == pytest.approx((c1 + c3) / 2)
    # the crowd-grid average over k = 1, 2, 3
    c2 = full - p1(0, 1)
    assert v["oracle", "comprehensiveness_kgrid", ""] == pytest.approx((c1 + c2 + c3) / 3)
    # removing the neutral words first changes nothing
    assert v["neutral_first", "comprehensiveness", "2"] == pytest.approx(0.0, abs=1e-6)


def test_aopc_most_and_least_take_hand_values(hand_result) -> None:
    _, v, _ = hand_result
    full = p1(2, 1)
    most = [p1(1, 1), p1(0, 1), p1(0, 1)]  # oracle order: good0, good2, unbelievably
    assert v["oracle", "aopc_most", ""] == pytest.approx(sum(full - p for p in most) / 4)
    least = [p1(2, 0), p1(2, 0), p1(2, 0)]  # reversed: bad, plot, unbelievably
    assert v["oracle", "aopc_least", ""] == pytest.approx(sum(full - p for p in least) / 4)
    assert v["oracle", "aopc_least", ""] < 0 < v["oracle", "aopc_most", ""]


def test_switching_point_takes_hand_values(hand_result) -> None:
    _, v, _ = hand_result
    # oracle: class 1 -> 0 after deleting good0 (p = σ(-0.25)): 1 of 5 words
    assert v["oracle", "switching_point", ""] == pytest.approx(1 / 5)
    # neutral first: unbelievably, plot, then good0 flips it: 3 of 5
    assert v["neutral_first", "switching_point", ""] == pytest.approx(3 / 5)
    assert v["neutral_first", "no_switch", ""] == 0.0
    # deleting the bad first only strengthens class 1; with every word gone the [CLS]
    # bias keeps it: the class never changes -> 1.0, flagged
    assert v["bad_first", "switching_point", ""] == 1.0
    assert v["bad_first", "no_switch", ""] == 1.0


def test_log_odds_drop_takes_hand_value(hand_result) -> None:
    _, v, _ = hand_result
    # 20 % of 5 words = 1 word (good0): log-odds go from 0.25 + 2 - 1.5 to 0.25 + 1 - 1.5
    assert v["oracle", "log_odds_drop", "0.2"] == pytest.approx(1.0, abs=1e-5)


def test_pure_formulas() -> None:
    assert F.aopc(1.0, [0.5, 0.0]) == pytest.approx((0.5 + 1.0) / 3)
    assert F.switching_point([1, 1, 0], target=1, n_words=6) == (0.5, True)
    assert F.switching_point([1, 1], target=1, n_words=6) == (1.0, False)
    assert n_words_for_fraction(0.01, 40) == 1
    assert n_words_for_fraction(0.2, 40) == 8
    assert n_words_for_fraction(0.5, 5) == 3
    assert F.log_odds_drop(sig(2.0), sig(-1.0)) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="fraction"):
        n_words_for_fraction(1.0, 10)


def test_deletion_works_on_ids_and_never_decodes(tok, monkeypatch) -> None:
    seg = segment(TEXT, tok, 64)
    exps = [F.Explanation("s1", m, seg, s) for m, s in SCORES.items()]

    def boom(*a, **k):
        raise AssertionError("text was decoded or re-tokenized")

    for name in ("decode", "batch_decode", "__call__", "encode", "convert_ids_to_tokens"):
        monkeypatch.setattr(PreTrainedTokenizerBase, name, boom, raising=False)
        monkeypatch.setattr(type(tok), name, boom, raising=False)
    ids = tok.convert_tokens_to_ids
    # deleting 'unbelievably' (5 pieces) removes exactly its pieces, punctuation stays
    without = F.without_words(seg, [3])
    assert len(without) == seg.n_tokens - 5
    assert ids("plot") in without and ids(",") in without
    masked = F.without_words(seg, [3], "mask", tok)
    assert len(masked) == seg.n_tokens and masked.count(tok.mask_token_id) == 5
    only = F.only_words(seg, [0])
    assert only == [tok.cls_token_id, ids("good"), tok.sep_token_id]
    for removal in ("delete", "mask", "unk"):
        cfg = MetricsConfig(ks=[1, 2], eraser_grid=[0.2], aopc_k=2, removal=removal)
        res = F.evaluate(CountModel(tok, WEIGHTS), tok, exps, cfg)
        assert res.per_example["value"].notna().all()


def test_unk_removal_puts_unk_ids_in_place_of_the_pieces(tok) -> None:
    # with [UNK] weighted like "bad", a removed good becomes one more bad
    seg = segment(TEXT, tok, 64)
    e = F.Explanation("s1", "oracle", seg, SCORES["oracle"])
    model = CountModel(tok, {**WEIGHTS, "[UNK]": (1.5, 0.0)})
    cfg = MetricsConfig(ks=[1], eraser_grid=[0.2], aopc_k=1, removal="unk")
    v = F.evaluate(model, tok, [e], cfg).per_example.set_index(["metric", "k"])["value"]
    # removing good0 -> one [UNK]: goods 1, bads 1 + 1 unk-as-bad
    assert v["comprehensiveness", "1"] == pytest.approx(p1(2, 1) - p1(1, 2))


def test_random_method_scores_near_its_expectation(tok) -> None:
    """Random rankings: comprehensiveness at k follows the hypergeometric law of hits."""
    n_good, n_words, k = 4, 20, 5
    words = ["good"] * n_good + ["plot"] * (n_words - n_good)
    seg = segment(" ".join(words), tok, 64)
    rng = np.random.default_rng(0)
    n = 400
    exps = [F.Explanation(f"s{i}", "random", seg, rng.uniform(size=n_words)) for i in range(n)]
    model = CountModel(tok, {"good": (0.0, 1.0), "[CLS]": (0.0, -2.0)})
    cfg = MetricsConfig(ks=[k], eraser_grid=[0.5], aopc_k=3)
    res = F.evaluate(model, tok, exps, cfg)
    v = res.per_example
    comp = v[(v.metric == "comprehensiveness") & (v.k == str(k))]["value"].to_numpy()

    def p(goods: int) -> float:
        return sig(-2.0 + goods)

    def expected_comp(kk: int) -> float:
        hits = stats.hypergeom(n_words, n_good, kk)
        return sum(hits.pmf(h) * (p(n_good) - p(n_good - h)) for h in range(0, min(kk, n_good) + 1))

    se = comp.std(ddof=1) / np.sqrt(n)
    assert abs(comp.mean() - expected_comp(k)) < 4 * se
    aopc = v[v.metric == "aopc_most"]["value"].to_numpy()
    expected_aopc = sum(expected_comp(kk) for kk in (1, 2, 3)) / 4
    assert abs(aopc.mean() - expected_aopc) < 4 * aopc.std(ddof=1) / np.sqrt(n)
    # identical texts share their full-text pass and their deletions: cache de-duplicates
    assert res.extra["n_forward"] < sum(res.timings["n_sequences"])


# --- the stage -----------------------------------------------------------------------


def test_metrics_stage_writes_tables_and_mlflow_names(
    make_cfg, train_run, tok, tmp_path, monkeypatch
) -> None:
    from saleval.stages import metrics as stage
    from tests.conftest import compose_config

    ds = OmegaConf.to_container(compose_config("train", ["dataset=ag_news"]).dataset, resolve=True)
    explain = fake_explain_run(tmp_path / "explain", tok, AG_TEXTS, ds)
    cfg = make_cfg(
        "metrics",
        [
            f"inputs.model={train_run}",
            f"inputs.explain={explain}",
            "metrics.ks=[2,5]",
            "metrics.eraser_grid=[0.1,0.5]",
            "progress=false",
        ],
    )

    def boom(*a, **k):
        raise AssertionError("decode called")

    monkeypatch.setattr(PreTrainedTokenizerBase, "decode", boom)
    monkeypatch.setattr(PreTrainedTokenizerBase, "batch_decode", boom)
    out = stage.run(cfg)
    run_dir = Path(out["run_dir"])
    summary = tables.METRICS.read(run_dir)
    per_ex = tables.METRICS_PER_EXAMPLE.read(run_dir)
    assert set(summary["method"]) == {"random", "first"}
    comp = summary[summary.metric == "comprehensiveness"]
    assert set(comp["k"].fillna("")) == {"2", "5", "0.1", "0.5", ""}
    assert (summary.loc[summary.metric == "switching_point", "value"].between(0, 1)).all()
    assert len(per_ex[(per_ex.metric == "aopc_most")]) == 2 * len(AG_TEXTS)
    assert not (per_ex.metric == "auprc").any()  # AG News has no human rationales
    # per-example means are the summary
    mean = per_ex[(per_ex.metric == "sufficiency") & (per_ex.k == "5")].groupby("method")["value"]
    row = summary[(summary.metric == "sufficiency") & (summary.k == "5")].set_index("method")
    assert np.allclose(mean.mean().sort_index(), row["value"].sort_index())
    timings = pd.read_csv(run_dir / stage.TIMINGS)
    assert {"comprehensiveness", "switching_point", "aopc_most"} <= set(timings["metric"])
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["stage"] == "metrics"
    assert run.data.tags["dataset"] == "ag_news"
    rows = method_rows(out["run_id"]).set_index("method")  # one child run per method
    value = summary.assign(k=summary["k"].fillna("")).set_index(["method", "metric", "k"])["value"]
    assert rows.loc["random", "comprehensiveness"] == value["random", "comprehensiveness", ""]
    assert rows.loc["first", "comprehensiveness_k5"] == value["first", "comprehensiveness", "5"]
    assert rows.loc["first", "comprehensiveness_k0_1"] == value["first", "comprehensiveness", "0.1"]
    assert rows["switching_point"].notna().all()
    assert "seconds_comprehensiveness" in run.data.metrics


def test_metrics_stage_fails_clearly_on_misaligned_words(make_cfg, train_run, tok, tmp_path):
    from saleval.stages import metrics as stage
    from tests.conftest import compose_config

    ds = OmegaConf.to_container(compose_config("train", ["dataset=ag_news"]).dataset, resolve=True)
    explain = fake_explain_run(tmp_path / "explain", tok, AG_TEXTS, ds)
    attrs = tables.ATTRIBUTIONS.read(explain)
    attrs.loc[(attrs.sample_id == "ag-2") & (attrs.word_index == 1), "char_end"] += 1
    tables.ATTRIBUTIONS.write(attrs, explain)
    cfg = make_cfg("metrics", [f"inputs.model={train_run}", f"inputs.explain={explain}"])
    with pytest.raises(
        F.AlignmentError, match=r"sample ag-2, method \w+, word_index 1, field char_end"
    ):
        stage.run(cfg)


def test_metrics_stage_runs_its_forward_passes_where_inference_accelerator_says(
    make_cfg, train_run, tok, tmp_path, monkeypatch
) -> None:
    """Issue #44: the stage moved no model, so on a GPU machine its forward passes (the
    metrics are most of a study's inference) ran on the CPU. The model now goes to
    ``device_for(metrics.inference.accelerator)`` before any pass; here that device
    is ``meta``, so only a real move puts the weights there."""
    from saleval.stages import metrics as stage
    from tests.conftest import compose_config

    ds = OmegaConf.to_container(compose_config("train", ["dataset=ag_news"]).dataset, resolve=True)
    explain = fake_explain_run(tmp_path / "explain", tok, AG_TEXTS, ds)
    seen: dict[str, object] = {}

    def device(accelerator: str, setting: str) -> torch.device:
        seen["accelerator"] = f"{setting}={accelerator}"
        return torch.device("meta")

    class Reached(Exception):
        pass

    def evaluate(model, *args, **kwargs):
        seen["device"] = {p.device for p in model.parameters()}
        raise Reached

    monkeypatch.setattr(stage, "device_for", device)
    monkeypatch.setattr(F, "evaluate", evaluate)
    cfg = make_cfg(
        "metrics",
        [
            f"inputs.model={train_run}",
            f"inputs.explain={explain}",
            "metrics.inference.accelerator=cpu",
        ],
    )
    with pytest.raises(Reached):
        stage.run(cfg)
    assert seen == {
        "accelerator": "metrics.inference.accelerator=cpu",
        "device": {torch.device("meta")},
    }


def test_metrics_inference_accelerator_is_checked(make_cfg, monkeypatch) -> None:
    """The setting is checked with the metrics config, and a GPU asked for where there is
    none stops the stage in one line naming metrics.inference.accelerator, before any run
    dir or model (the rule itself: test_attribution, device_for)."""
    from saleval.modeling.devices import DeviceError
    from saleval.stages import metrics as stage

    with pytest.raises(ValueError, match=r"metrics.inference.accelerator must be one of"):
        MetricsConfig.from_config({"ks": [1], "inference": {"accelerator": "tpu"}})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = make_cfg("metrics", ["inputs.model=unused", "inputs.explain=unused",
                               "metrics.inference.accelerator=gpu"])  # fmt: skip
    with pytest.raises(DeviceError, match=r"^metrics.inference.accelerator=gpu, but torch sees no"):
        stage.run(cfg)
    assert not Path(cfg.run_dir).exists()
