"""The metric registry and the metrics config schema (issue 15).

A metric registered from outside saleval reaches ``evaluate``'s rows and the comparison
with the crowd with its declared direction; an unregistered metric in a metrics table is
named, not dropped silently; an unknown key of the ``metrics`` config fails naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hydra.errors import ConfigCompositionException

from saleval.analysis import comparison as C
from saleval.analysis import comparison_report, metric_columns
from saleval.config.keys import UnknownKeyError
from saleval.metrics import faithfulness as F
from saleval.metrics import registry as R
from saleval.metrics.config import MetricsConfig
from saleval.words import segment
from tests.conftest import compose_config
from tests.metrics_support import CFG, SCORES, TEXT, WEIGHTS, CountModel, load_tok, p1

POSITIVE_SHARE = "positive_share"


@pytest.fixture(scope="module")
def tok():
    return load_tok()


@pytest.fixture
def toy_metric() -> Iterator[str]:
    """A toy faithfulness metric: the share of words with a positive score (higher better)."""

    @R.register_metric(POSITIVE_SHARE, higher_is_better=True, citation="a test of issue 15")
    class PositiveShare(F.PerturbationMetric):
        def reduce(self, ctx: F.Context, e: F.Explanation, probs: np.ndarray) -> list[F.Row]:
            assert len(probs) == 0  # it asked for no perturbed sequence
            return [(POSITIVE_SHARE, "", float((e.scores > 0).mean()))]

    yield POSITIVE_SHARE
    R.unregister_metric(POSITIVE_SHARE)
    assert POSITIVE_SHARE not in R.outputs()


def test_builtins_declare_direction_citation_and_outputs() -> None:
    faith = [m.info.name for m in R.registered("faithfulness")]
    assert faith == [
        "comprehensiveness",
        "sufficiency",
        "aopc_most",
        "aopc_least",
        "switching_point",
        "log_odds_drop",
    ]
    assert [m.info.name for m in R.registered("plausibility")] == [
        "auprc",
        "token_f1",
        "iou_f1",
        "eraser_auprc",
        "eraser_token_f1",
        "eraser_iou_f1",
    ]
    # ERASER's IOU F1 is a corpus figure; its per-document parts are written, not ranked
    assert R.direction("eraser_iou_f1") is True and R.direction("eraser_iou_recall") is None
    assert all(m.info.citation for m in R.registered())
    directions = metric_columns.metric_directions()
    assert directions["comprehensiveness_kgrid"] is True
    assert directions["sufficiency_kgrid"] is False and directions["aopc_least"] is False
    assert "no_switch" not in directions and R.direction("no_switch") is None
    with pytest.raises(ValueError, match="already registered"):
        R.register_metric("other", higher_is_better=True, citation="x", extra_outputs={"auprc": 1})(
            type("Other", (F.PerturbationMetric,), {"reduce": lambda *a: []})
        )


def test_a_registered_metric_reaches_evaluate_and_the_comparison(tok, toy_metric) -> None:
    seg = segment(TEXT, tok, 64)
    exps = [F.Explanation("s1", m, seg, s) for m, s in SCORES.items()]
    exps.append(F.Explanation("s1", "signed", seg, [1.0, -1.0, 2.0, -3.0, -0.5]))
    model = CountModel(tok, WEIGHTS)
    res = F.evaluate(model, tok, exps, CFG)
    v = res.per_example.set_index(["method", "metric", "k"])["value"]
    assert v["signed", toy_metric, ""] == pytest.approx(2 / 5)
    assert v["oracle", toy_metric, ""] == pytest.approx(4 / 5)  # one score is 0.0
    assert v["oracle", "comprehensiveness", "1"] == pytest.approx(p1(2, 1) - p1(1, 1))
    timings = res.timings.set_index("metric")
    assert timings.loc[toy_metric, "n_forward"] == 0 and timings.loc[toy_metric, "n_sequences"] == 0
    # only the toy metric: no perturbed forward pass beyond the full text
    alone = F.evaluate(model, tok, exps, CFG, metrics=[toy_metric])
    assert set(alone.per_example["metric"]) == {toy_metric} and alone.extra["n_forward"] == 1

    summary = F.summarize(res.per_example)
    human = pd.Series({"oracle": 90.0, "neutral_first": 50.0, "bad_first": 20.0, "signed": 40.0})
    out = C.compare(human, summary, res.per_example, n_boot=0)
    assert toy_metric in out.columns
    table = out.comparison.set_index("method")
    # shares: oracle 0.8, neutral_first 1.0, bad_first 1.0, signed 0.4; higher is better
    assert table[f"{toy_metric}_rank"].to_dict() == {
        "oracle": 3,
        "neutral_first": 1,
        "bad_first": 1,
        "signed": 4,
    }
    corr = out.correlations.set_index(["metric", "statistic"])
    assert bool(corr.loc[(toy_metric, "spearman"), "higher_is_better"]) is True
    md = comparison_report.markdown_report(out.comparison, out.correlations, out.columns, "T")
    assert f"{toy_metric} ↑" in md


def test_an_unregistered_metric_is_named_not_dropped(caplog) -> None:
    methods = ["m0", "m1", "m2"]
    metrics = pd.DataFrame(
        [
            (m, metric, "", v)
            for j, m in enumerate(methods)
            for metric, v in (("comprehensiveness", 0.1 * j), ("mystery_metric", j))
        ],
        columns=["method", "metric", "k", "value"],
    )
    human = pd.Series([10.0, 20.0, 30.0], index=methods)
    with caplog.at_level(logging.WARNING, logger="saleval.analysis.comparison"):
        res = C.compare(human, metrics, metrics.assign(sample_id="s"), n_boot=0)
    assert res.columns == ["comprehensiveness"]
    assert any("mystery_metric" in n and "register" in n for n in res.notes)
    assert "mystery_metric" in caplog.text
    with pytest.raises(
        metric_columns.ComparisonError, match="mystery_metric.*no registered direction"
    ):
        metric_columns.higher_is_better("mystery_metric")


def test_unknown_metrics_keys_fail_naming_the_key() -> None:
    with pytest.raises(ValueError, match="key 'aopc_kk'"):
        MetricsConfig.from_config({"ks": [1], "aopc_kk": 3})
    with pytest.raises(ValueError, match="key 'switching.chunks'"):
        MetricsConfig.from_config({"ks": [1], "switching": {"chunks": 3}})
    with pytest.raises(ValueError, match="removal.*erase"):
        MetricsConfig.from_config({"ks": [1], "removal": "erase"})
    # at compose time: a misspelt override, or a key added to the schema's node
    with pytest.raises(ConfigCompositionException, match="metrics.aopc_kk"):
        compose_config("metrics", ["metrics.aopc_kk=3"])
    with pytest.raises(UnknownKeyError, match="metrics.aopc_kk.*did you mean metrics.aopc_k"):
        compose_config("metrics", ["+metrics.aopc_kk=3"])


def test_metrics_config_defaults_live_in_the_schema() -> None:
    cfg = compose_config("metrics", ["kgrid=smoke", "metrics=quick"])
    m = MetricsConfig.from_config(cfg.metrics)
    assert m.ks == list(cfg.kgrid.ks)  # ${kgrid.ks}: the crowd k-grid
    assert m.eraser_grid == [0.05, 0.2] and m.switching.max_fraction == 0.5  # quick.yaml
    assert m.aopc_k == 10 and m.switching.chunk == 10 and m.removal == "delete"  # schema
    assert (
        MetricsConfig.from_config(compose_config("metrics", ["metrics=unk"]).metrics).removal
        == "unk"
    )
    over = compose_config("metrics", ["metrics.ks=[2,5]", "metrics.inference.bf16=auto"])
    m = MetricsConfig.from_config(over.metrics)
    assert m.ks == [2, 5] and m.inference.bf16 == "auto"
    with pytest.raises(ValueError, match="unresolved"):
        MetricsConfig()  # ks defaults to the k-grid, which only a composed config has


def test_every_builtin_row_matches_an_independent_recomputation(tok) -> None:
    """Every row evaluate writes for the hand example, recomputed from the model's formula.

    Pins the refactor to a loop over registered metrics: same rows, same values, same
    timings families, and no more forward passes than distinct inputs.
    """
    seg = segment(TEXT, tok, 64)
    exps = [F.Explanation("s1", m, seg, s) for m, s in SCORES.items()]
    res = F.evaluate(CountModel(tok, WEIGHTS), tok, exps, CFG)
    words = seg.words

    def p(kept: list[int]) -> float:  # p(class 1) with only the words `kept` left
        return p1(sum(words[i] == "good" for i in kept), sum(words[i] == "bad" for i in kept))

    def logit(q: float) -> float:
        return float(np.log(q) - np.log1p(-q))

    full, n = p(list(range(5))), 5
    expected: dict[tuple[str, str, str], float] = {}
    for method, scores in SCORES.items():
        order = sorted(range(n), key=lambda i: (-scores[i], i))
        gone = {k: full - p(order[k:]) for k in range(n + 1)}  # comprehensiveness at k
        only = {k: full - p(order[:k]) for k in range(n + 1)}  # sufficiency at k
        for name, at in (("comprehensiveness", gone), ("sufficiency", only)):
            for k in (1, 2, 3):
                expected[method, name, str(k)] = at[k]
            expected[method, name, "0.2"], expected[method, name, "0.5"] = at[1], at[3]
            expected[method, name, ""] = (at[1] + at[3]) / 2
            expected[method, name + "_kgrid", ""] = (at[1] + at[2] + at[3]) / 3
        expected[method, "aopc_most", ""] = sum(gone[k] for k in (1, 2, 3)) / 4
        least = [full - p(order[: n - k]) for k in (1, 2, 3)]
        expected[method, "aopc_least", ""] = sum(least) / 4
        switch = next((k for k in range(1, n + 1) if p(order[k:]) <= 0.5), None)
        expected[method, "switching_point", ""] = 1.0 if switch is None else switch / n
        expected[method, "no_switch", ""] = 1.0 if switch is None else 0.0
        expected[method, "log_odds_drop", "0.2"] = logit(full) - logit(p(order[1:]))
    got = res.per_example.set_index(["method", "metric", "k"])["value"]
    assert sorted(got.index) == sorted(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key
    assert res.timings["metric"].tolist() == [
        "full_text",
        "comprehensiveness",
        "sufficiency",
        "aopc_most",
        "aopc_least",
        "switching_point",
        "log_odds_drop",
    ]
    assert res.timings["n_forward"].sum() == res.extra["n_forward"]
    assert res.extra["n_forward"] < res.timings["n_sequences"].sum()  # the cache is shared


def test_a_metrics_settings_are_checked_where_the_config_is() -> None:
    """``settings=`` at registration types ``metrics.settings.<name>`` (docs/extending.md)."""

    @dataclass
    class Window:
        width: int = 3

    with pytest.raises(ValueError, match="settings must be a dataclass"):
        R.register_metric("windowed", higher_is_better=True, citation="x", settings=dict)
    with pytest.raises(ValueError, match="needs a name like"):
        R.register_metric("window-ed", higher_is_better=True, citation="x", settings=Window)

    @R.register_metric("windowed", higher_is_better=True, citation="a test", settings=Window)
    class Windowed(F.PerturbationMetric):
        def reduce(self, ctx: F.Context, e: F.Explanation, probs: np.ndarray) -> list[F.Row]:
            return []

    try:
        assert R.registered()[-1].info.settings is Window
        assert MetricsConfig(ks=[1]).settings_of("windowed") == Window()  # its defaults
        cfg = compose_config("metrics", ["metrics.settings.windowed.width=5"])
        assert MetricsConfig.from_config(cfg.metrics).settings_of("windowed") == Window(5)
        with pytest.raises(ConfigCompositionException, match="settings.windowed.widht"):
            compose_config("metrics", ["metrics.settings.windowed.widht=5"])
        with pytest.raises(ValueError, match="key 'settings.windowed.width'"):
            MetricsConfig.from_config({"ks": [1], "settings": {"windowed": {"width": "x"}}})
        with pytest.raises(ValueError, match=r"\['nameless'\] name no registered metric"):
            MetricsConfig(ks=[1], settings={"nameless": {}})
        with pytest.raises(KeyError, match="declares no settings"):
            MetricsConfig(ks=[1]).settings_of("sufficiency")
    finally:
        R.unregister_metric("windowed")
    # once unregistered, its node is gone from the schema: the key fails at compose again
    with pytest.raises(ConfigCompositionException, match="settings.windowed"):
        compose_config("metrics", ["metrics.settings.windowed.width=5"])
