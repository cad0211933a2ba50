"""The notebook API (``saleval.api``, issue 16 item 6): the stages' numbers, not a copy.

The explain and metrics stages run on a ``save_pretrained`` checkpoint of a random tiny
BERT (no training), and the API on the same texts and model must give the same tables;
labels are optional unless the gold class is explained; the highlights mark exactly the
top-k words of :func:`saleval.words.rank_words`; and the code of ``docs/api.md`` runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import saleval
from saleval import api, paths
from saleval.analysis.metric_columns import select_columns, wide_metrics
from saleval.attribution import AttributionError, explain_frame
from saleval.modeling.models import build_model, load_tokenizer
from saleval.pipeline import tables
from saleval.vocab import PROBS
from saleval.words import rank_words
from tests.conftest import compose_config
from tests.metrics_support import TINY_CFG

AG = ["World", "Sports", "Business", "Sci/Tech"]
METHODS = "[random,occlusion,vanilla_gradient,lime]"
TEXTS = [
    "Stocks rallied after strong earnings from chip makers.",
    "The team won the final in extra time!",
    "Rescue workers searched the coast after the storm.",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny BERT with AG News' classes, saved as a user's own checkpoint."""
    d = tmp_path_factory.mktemp("api") / "tiny-ag"
    build_model(TINY_CFG, AG, attn_implementation="eager", seed=7).save_pretrained(d)
    load_tokenizer(TINY_CFG).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def clf() -> api.Classifier:
    return saleval.load_model("tiny", label_names=["neg", "pos"], device="cpu")


@pytest.fixture(scope="module")
def stage_runs(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str):
    """An explain run and a metrics run of the stages on ``checkpoint``."""
    from saleval.stages import explain, metrics

    root = tmp_path_factory.mktemp("api_runs")
    e = explain.run(
        compose_config(
            "explain",
            [
                f"inputs.model={checkpoint}",
                "dataset=ag_news",
                "dataset.max_test=64",
                "data.n_samples=4",
                f"method={METHODS}",
                "method.lime.num_samples=20",
                "trainer=cpu",
                "progress=false",
                "view.samples=1",
                "view.overlap_k=5",
            ],
            root / "explain",
        )
    )
    m = metrics.run(
        compose_config(
            "metrics",
            [
                f"inputs.model={checkpoint}",
                f"inputs.explain={e['run_dir']}",
                "kgrid=smoke",
                "metrics=quick",
                "progress=false",
            ],
            root / "metrics",
        )
    )
    return Path(e["run_dir"]), Path(m["run_dir"])


def _api_explain(checkpoint: Path, explain_dir: Path) -> pd.DataFrame:
    texts = tables.PREDICTIONS.read(explain_dir)[["sample_id", "text", "label"]]
    return saleval.explain(
        texts,
        checkpoint,
        methods={"random": None, "occlusion": None, "vanilla_gradient": None,
                 "lime": {"num_samples": 20}},
        device="cpu",
    )  # fmt: skip


@pytest.mark.slow
def test_explain_gives_the_explain_stages_tables(checkpoint: Path, stage_runs) -> None:
    explain_dir, _ = stage_runs
    words = _api_explain(checkpoint, explain_dir)
    stage_attr = tables.ATTRIBUTIONS.read(explain_dir)
    stage_pred = tables.PREDICTIONS.read(explain_dir)
    assert set(stage_attr["method"]) == {"random", "occlusion", "vanilla_gradient", "lime"}
    ours_pred, ours_attr = api._tables(words)
    key = ["sample_id", "method", "word_index"]
    pd.testing.assert_frame_equal(
        ours_attr.sort_values(key).reset_index(drop=True),
        stage_attr[ours_attr.columns].sort_values(key).reset_index(drop=True),
        check_dtype=False,
    )
    cols = ["sample_id", "text", "label", "pred", *PROBS.columns(AG), "n_words"]
    pd.testing.assert_frame_equal(
        ours_pred[cols].sort_values("sample_id").reset_index(drop=True),
        stage_pred[cols].sort_values("sample_id").reset_index(drop=True),
        check_dtype=False,
    )
    # the stage's max_length (a checkpoint without a train run: 256, capped by the tiny
    # BERT's 128 positions) travels with the frame
    assert words.attrs == {"max_length": 128, "model": "tiny-ag"}
    # and an explain run read back is the same frame
    back = saleval.read_explanations(explain_dir)
    assert back.attrs["max_length"] == 128
    assert len(back) == len(words) and set(back.columns) >= set(words.columns) - {"label"}


@pytest.mark.slow
def test_evaluate_gives_the_metrics_stages_numbers(checkpoint: Path, stage_runs) -> None:
    explain_dir, metrics_dir = stage_runs
    stage = tables.METRICS.read(metrics_dir)
    want = wide_metrics(stage, select_columns(stage, "all"), ["method"])
    for frame in (saleval.read_explanations(explain_dir), _api_explain(checkpoint, explain_dir)):
        got = saleval.evaluate(
            frame, checkpoint, metrics="quick", kgrid="smoke", columns="all", device="cpu"
        )
        assert list(got.columns) == list(want.columns) and len(got.columns) > 8
        pd.testing.assert_frame_equal(
            got.sort_index(),
            want.sort_index(),
            check_names=False,
            check_index_type=False,
            rtol=1e-9,
        )
    per = saleval.evaluate(
        frame, checkpoint, metrics="quick", kgrid="smoke", per_example=True, device="cpu"
    )
    assert set(per.columns) == set(tables.METRICS_PER_EXAMPLE.columns)
    assert per["sample_id"].nunique() == 4


def test_the_prediction_is_explained_without_labels(clf: api.Classifier) -> None:
    words = saleval.explain(TEXTS, clf, methods=["random", "occlusion"])
    assert "label" not in words.columns
    assert (words["target"] == words["pred"]).all()
    assert words["sample_id"].unique().tolist() == ["0", "1", "2"]
    per_text = words.drop_duplicates(["sample_id", "method"]).groupby("method").size()
    assert per_text.to_dict() == {"occlusion": 3, "random": 3}
    probs = words[["prob_neg", "prob_pos"]].to_numpy()
    assert np.allclose(probs.sum(1), 1.0) and (words["pred"] == probs.argmax(1)).all()
    # labels given, prediction still explained: the labels ride along
    labelled = saleval.explain(TEXTS, clf, methods="random", labels=["pos", "neg", "pos"])
    assert labelled.drop_duplicates("sample_id")["label"].tolist() == [1, 0, 1]
    assert (labelled["target"] == labelled["pred"]).all()


def test_the_gold_target_needs_labels(clf: api.Classifier) -> None:
    with pytest.raises(AttributionError, match=r"lacks column\(s\) \['label'\].*target=gold"):
        saleval.explain(TEXTS, clf, methods="random", target="gold")
    words = saleval.explain(TEXTS, clf, methods="random", target="gold", labels=[0, 0, 1])
    assert words.drop_duplicates("sample_id")["target"].tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match=r"labels, row 1: 'meh' is not one of \['neg', 'pos'\]"):
        saleval.explain(TEXTS, clf, methods="random", labels=["neg", "meh", "pos"])
    with pytest.raises(ValueError, match="labels: 2 labels for 3 texts"):
        saleval.explain(TEXTS, clf, methods="random", labels=[0, 1])


def test_explain_frame_label_column_follows_the_input(clf: api.Classifier) -> None:
    df = pd.DataFrame({"sample_id": ["a", "b"], "text": TEXTS[:2]})
    methods = {"random": "random"}
    _, pred = explain_frame(clf.model, clf.tokenizer, df, methods, max_length=64)
    assert "label" not in pred.columns
    partial = df.assign(label=pd.array([1, None], dtype="Int64"))
    _, pred = explain_frame(clf.model, clf.tokenizer, partial, methods, max_length=64)
    assert pred["label"].isna().tolist() == [False, True]
    with pytest.raises(AttributionError, match=r"row 1 \(sample_id 'b'\) has no label"):
        explain_frame(clf.model, clf.tokenizer, partial, methods, target="gold", max_length=64)
    _, pred = explain_frame(clf.model, clf.tokenizer, df.assign(label=[1, 0]), methods)
    assert pred["label"].dtype == np.int64  # what tables.PREDICTIONS declares


def test_highlight_marks_each_methods_top_k_words(clf: api.Classifier) -> None:
    words = saleval.explain(TEXTS, clf, methods=["random", "occlusion"], labels=[1, 0, 1])
    page = saleval.highlight(words, k=3, samples=["1"], methods=["occlusion", "random"])
    assert isinstance(page, str) and page._repr_html_() == page
    assert "gold: neg" in page and "predicted: " in page
    rows = re.findall(r"<tr><td class='m'>(\w+)</td><td>(.*?)</td></tr>", page)
    assert [m for m, _ in rows] == ["occlusion", "random"]  # the order asked for
    for method, cell in rows:
        g = words[(words["sample_id"] == "1") & (words["method"] == method)]
        top = g["word"].to_numpy()[rank_words(g["score"].to_numpy())[:3]]
        marked = re.findall(r'title="rank (\d)">([^<]*)</mark>', cell)
        assert [w for _, w in sorted(marked)] == list(top), method
    unlabelled = saleval.explain(TEXTS[:1], clf, methods="random")
    assert "gold:" not in saleval.highlight(unlabelled, k=2)
    with pytest.raises(ValueError, match=r"method\(s\) \['lime'\] not in the explanations"):
        saleval.highlight(words, methods=["lime"])


def test_method_settings_come_from_conf_method(clf: api.Classifier) -> None:
    configs = api._method_configs({"lime": {"num_samples": 7}, "random": None}, seed=3)
    assert configs["lime"]["num_samples"] == 7 and configs["lime"]["kernel_width"] == 25.0
    assert configs["random"]["seed"] == 3 and configs["lime"]["seed"] == 3
    assert api._method_configs(None, None)["random"]["seed"] == 42  # saleval-explain's seed
    assert set(api._method_configs("preset/lu2024", None)) >= {"captum_lime", "deeplift"}


def test_metrics_settings_come_from_conf_metrics() -> None:
    assert api._metrics_config("quick", "smoke").eraser_grid == [0.05, 0.2]
    mine = api._metrics_config({"aopc_k": 5, "removal": "mask"}, "paper")
    assert (mine.aopc_k, str(mine.removal), mine.ks) == (5, "mask", [5, 10, 20, 30, 40])
    with pytest.raises(ValueError, match="aopc_kk"):
        api._metrics_config({"aopc_kk": 5}, "paper")


def test_view_k_is_the_highlight_key() -> None:
    cfg = compose_config("explain", ["inputs.model=x", "view.k=3"])
    assert cfg.view.k == 3
    with pytest.raises(Exception, match="top_k"):
        compose_config("explain", ["inputs.model=x", "view.top_k=3"])


def test_import_saleval_stays_light() -> None:
    code = (
        "import sys, saleval; heavy = [m for m in ('torch', 'transformers', 'lightning') "
        "if m in sys.modules]; import saleval.api as a; print(heavy, saleval.explain is a.explain)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def test_docs_api_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of docs/api.md, in order, in one namespace (a notebook)."""
    blocks = _python_blocks((paths.project_root() / "docs" / "api.md").read_text())
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_api"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
        except Exception as err:  # say which block broke
            raise AssertionError(f"docs/api.md block {i + 1} fails: {err!r}\n{code}") from err
