"""The simulated crowd (docs/study-design.md): seeded, reproducible, labelled SIMULATED, and it
behaves like a crowd should: more shown words, more correct answers."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from omegaconf.errors import ConfigKeyError

import saleval.pipeline.stage  # noqa: F401  (registers the config resolvers)
from saleval.analysis.validation import calibration_note
from saleval.config.crowd import SimulationConfig, SimulationError
from saleval.crowd.simulation.readers import build_reader
from saleval.crowd.simulation.workers import simulate_crowd
from saleval.modeling.data import load_dataset
from saleval.pipeline import tables
from saleval.schema import to_schema
from saleval.vocab import IDK, PROBS
from saleval.words import word_spans
from tests.conftest import DATA_ROOT, compose_config
from tests.crowd_support import AG_LABELS, METHODS, synthetic_explain, write_explain_run

#: the shipped IMDB figures as a notice quotes them: the reader, then its cell MAE
VALIDATED_IMDB = re.compile(r"imdb: [\w-]+ reader: cell MAE")

needs_data = pytest.mark.skipif(not DATA_ROOT.is_dir(), reason="../shared/data not present")

_TOKEN = re.compile(r"[a-z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def class_log_odds(
    texts: list[str], labels: list[int], n_classes: int, alpha: float = 1.0
) -> dict[str, np.ndarray]:
    """Per token, log-odds of each class against the rest (Dirichlet-smoothed counts)."""
    counts = [Counter() for _ in range(n_classes)]
    for t, y in zip(texts, labels):
        counts[y].update(set(_tokens(t)))
    vocab = set().union(*counts)
    totals = np.array([sum(c.values()) for c in counts], dtype=float)
    v = len(vocab)
    out = {}
    for w in vocab:
        n = np.array([c[w] for c in counts], dtype=float)
        p_in = (n + alpha) / (totals + alpha * v)
        p_out = (n.sum() - n + alpha) / (totals.sum() - totals + alpha * v)
        out[w] = np.log(p_in) - np.log(p_out)
    return out


def real_ag_news_explain(run_dir: Path, n_per_class: int = 10) -> Path:
    """An explain run on real AG News test texts with two honest rankings:

    * ``random``: i.i.d. uniform scores (seeded);
    * ``oracle``: how strongly a word signals the sample's true class, from class
      log-odds counted on the *validation* split (disjoint from the test texts and
      from the train split the simulated workers learn from).
    """
    ds = load_dataset(compose_config("train", ["dataset=ag_news"]).dataset)
    test = ds["test"].sort_values("sample_id").groupby("label").head(n_per_class)
    lo = class_log_odds(ds["validation"]["text"].tolist(), ds["validation"]["label"].tolist(), 4)
    rng = np.random.default_rng(0)
    preds, attrs = [], []
    for r in test.itertuples(index=False):
        spans = word_spans(r.text)
        prob = np.full(4, 0.02)
        prob[r.label] = 0.94
        preds.append(
            {"sample_id": r.sample_id, "text": r.text, "label": r.label, "pred": r.label}
            | dict(zip(PROBS.columns(AG_LABELS), map(float, prob)))
        )
        rand = rng.uniform(size=len(spans))
        for j, (s, e) in enumerate(spans):
            word = r.text[s:e]
            toks = _tokens(word)
            oracle = max((lo[t][r.label] for t in toks if t in lo), default=-5.0)
            attrs.append((r.sample_id, "random", j, word, s, e, float(rand[j])))
            attrs.append((r.sample_id, "oracle", j, word, s, e, float(oracle)))
    cols = ["sample_id", "method", "word_index", "word", "char_start", "char_end", "score"]
    return write_explain_run(run_dir, pd.DataFrame(preds), pd.DataFrame(attrs, columns=cols))


def _strict_majority(answers: pd.DataFrame, tasks: pd.DataFrame) -> pd.DataFrame:
    """A[i,j,k] of docs/aggregation.md (true label strictly more often than every other answer)."""
    a = answers.merge(tasks[["task_id", "label", "method", "k", "is_gold"]], on="task_id")
    a = a[~a["is_gold"]]
    a["truth"] = a["label"].map(lambda c: AG_LABELS[int(c)])
    rows = []
    for (_, m, k), g in a.groupby(["task_id", "method", "k"]):
        counts = g["answer"].value_counts()
        right = int(counts.get(g["truth"].iloc[0], 0))
        others = counts.drop(g["truth"].iloc[0], errors="ignore")
        rows.append(
            {"method": m, "k": k, "correct": int(right > (others.max() if len(others) else 0))}
        )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def synthetic_task_run(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    from saleval.stages import tasks as tasks_stage

    tmp = tmp_path_factory.mktemp("simtasks")
    preds, attrs = synthetic_explain(140, 30, methods=METHODS[:4])
    explain = write_explain_run(tmp / "explain", preds, attrs)
    cfg = compose_config(
        "tasks",
        [
            f"inputs.explain={explain}",
            "study.n_samples=40",
            "study.bundle_size=40",
            "study.repeats=3",
            "study.gold_rate=0.1",
            "study.gold_pool=8",
            "kgrid=smoke",
        ],
        tmp / "tasks",
    )
    return Path(tasks_stage.run(cfg)["run_dir"])


@needs_data
def test_simulated_crowd_is_seeded_complete_and_marked(
    synthetic_task_run: Path, make_cfg: Callable, mlflow_uri: str
) -> None:
    from saleval.stages import simulate

    out_a = simulate.run(make_cfg("simulate", [f"inputs.tasks={synthetic_task_run}"], name="a"))
    out_b = simulate.run(make_cfg("simulate", [f"inputs.tasks={synthetic_task_run}"], name="b"))
    out_c = simulate.run(
        make_cfg("simulate", [f"inputs.tasks={synthetic_task_run}", "seed=7"], name="c")
    )
    a = tables.ANSWERS.read(out_a["run_dir"])
    b = tables.ANSWERS.read(out_b["run_dir"])
    c = tables.ANSWERS.read(out_c["run_dir"])
    pd.testing.assert_frame_equal(a, b)
    assert not a["answer"].equals(c["answer"])

    tasks = tables.TASKS.read(synthetic_task_run)
    bundles = tables.BUNDLES.read(synthetic_task_run)
    # every bundle answered by one worker, every task as often as the bundles say
    assert len(a) == len(bundles)
    assert a.groupby("bundle_id")["worker_id"].nunique().eq(1).all()
    assert a["worker_id"].nunique() == bundles["bundle_id"].nunique()
    merged = a.merge(bundles, on=["bundle_id", "position"], suffixes=("", "_b"))
    assert (merged["task_id"] == merged["task_id_b"]).all()
    study = tasks[~tasks["is_gold"]]
    assert a[a["task_id"].isin(study["task_id"])]["task_id"].value_counts().eq(3).all()
    assert set(a["answer"]) <= {*AG_LABELS, IDK}
    assert a["simulated"].all() and (a["duration_s"] > 0).all()
    t0 = pd.to_datetime(a["started_at"])
    t1 = pd.to_datetime(a["submitted_at"])
    assert np.allclose((t1 - t0).dt.total_seconds(), a["duration_s"], atol=1e-3)

    # spammers are there, fast, and findable; honest workers take their time
    workers = pd.read_csv(Path(out_a["run_dir"]) / "workers.csv")
    total = a.groupby("worker_id")["duration_s"].sum()
    spam = workers[workers["kind"] != "honest"]["worker_id"]
    assert len(spam) == round(0.1 * len(workers)) >= 1
    assert (total[spam] < 120).all()
    assert (total.drop(spam) > 120).all()
    for w in workers[workers["kind"] == "idk"]["worker_id"]:
        assert (a[a["worker_id"] == w]["answer"] == IDK).all()

    # SIMULATED in MLflow, in run.json, and next to the answers
    info = json.loads((Path(out_a["run_dir"]) / "run.json").read_text())
    assert info["simulated"] == "true"
    tags = MlflowClient().get_run(info["run_id"]).data.tags
    assert tags["simulated"] == "true" and tags["stage"] == "simulate"
    assert (
        tags["parent.tasks"] == json.loads((synthetic_task_run / "run.json").read_text())["run_id"]
    )
    notice = (Path(out_a["run_dir"]) / "SIMULATED.md").read_text()
    assert "SIMULATED crowd validated against real workers" in notice
    assert VALIDATED_IMDB.search(notice)


@pytest.mark.parametrize(
    ("overrides", "expect"),
    [
        ([], "validated against real workers (docs"),
        (["simulation.seed=7"], "validated against real workers (docs"),  # not calibrated
        (
            ["simulation/reader=embedding"],
            "reader._target_ = saleval.crowd.simulation.readers.Embedding",
        ),
        (
            ["simulation.reader.corpus.dot_weight=0.5"],
            "reader.corpus.dot_weight = 0.5 (validated: 2.0)",
        ),
        (
            ["simulation.reader.lexicon.polar_threshold=1.0"],
            "reader.lexicon.polar_threshold = 1.0 (validated: 1.5)",
        ),
        (["simulation.temperature=0.5"], "temperature = 0.5 (validated: 1.0)"),
        (["simulation.noise.b=18"], "noise.b = 18.0 (validated: 11.33)"),
        (["simulation=noisy"], "was not validated against real workers"),
    ],
)
def test_notices_repeat_the_validation_only_for_the_validated_calibration(
    overrides: list[str], expect: str
) -> None:
    """The validation figures describe one worker model: a run that changes its reader or
    a calibrated setting must not repeat them as its own."""
    sim = to_schema(SimulationConfig, compose_config("simulate", overrides).simulation)
    note = calibration_note(dataclasses.asdict(sim))
    assert expect in note
    assert ("cell MAE" in note) == (expect.startswith("validated against"))


@pytest.mark.parametrize(
    ("dataset", "study", "outside"),
    [
        ("ag_news", None, None),
        ("lu2024_imdb", None, None),  # the published samples the figures were measured on
        ("sst2", None, "sst2 was not part"),
        ("ag_news", "forward prediction", "forward prediction was not part"),
        ("sst2", "forward prediction", "sst2 and forward prediction were not part"),
    ],
)
def test_the_validation_says_which_runs_it_does_not_cover(
    dataset: str, study: str | None, outside: str | None
) -> None:
    """The figures were measured on the main study of IMDB and AG News: a forward-prediction
    or SST-2 run must not carry them as its own, in long notes or plot captions."""
    sim = dataclasses.asdict(to_schema(SimulationConfig, compose_config("simulate", []).simulation))
    note = calibration_note(sim, False, dataset, study)
    short = calibration_note(sim, True, dataset, study)
    assert VALIDATED_IMDB.search(note) and VALIDATED_IMDB.search(short)
    if outside is None:
        assert "carry over" not in note and "not on" not in short
    else:
        assert outside in note and "do not carry over" in note
        assert (
            f"not on {outside.split(' was')[0].split(' were')[0].replace(' and ', ', ')}" in short
        )


def test_simulation_options_compose() -> None:
    for name in ("default", "ideal", "noisy"):
        cfg = compose_config("simulate", [f"simulation={name}"])
        sim = to_schema(SimulationConfig, cfg.simulation)
        assert sim.seed == 42 and build_reader(sim.reader).split == "train" and sim.name == name
    tuned = compose_config("simulate", ["simulation/reader=finetuned"]).simulation.reader
    assert tuned["_target_"] == "saleval.crowd.simulation.readers.FinetunedReader"
    ideal = compose_config("simulate", ["simulation=ideal"])
    assert (
        ideal.simulation.spammers.fraction == 0.0
        and ideal.simulation.spammers.seconds_median == 0.8
    )


def test_reading_model_must_not_have_seen_the_study_texts() -> None:
    tasks = pd.DataFrame(
        {
            "task_id": ["x|random|k1"],
            "sample_id": ["x"],
            "display_text": ["goal "],
            "label": [1],
            "n_words_shown": [1],
            "k": [1],
            "is_gold": [False],
            "method": ["random"],
        }
    )
    bundles = pd.DataFrame(
        {"bundle_id": ["b1"], "position": [1], "task_id": ["x|random|k1"], "is_gold": [False]}
    )
    train = pd.DataFrame(
        {"sample_id": ["x", "y"], "text": ["goal match", "stocks fall"], "label": [1, 2]}
    )
    with pytest.raises(SimulationError, match="in the simulated workers' training split"):
        simulate_crowd(tasks, bundles, train, AG_LABELS, SimulationConfig())
    with pytest.raises(ConfigKeyError, match="nosie"):
        to_schema(SimulationConfig, {"nosie": 0.1})
    with pytest.raises(ConfigKeyError, match="fractoin"):  # nested fields are checked too
        to_schema(SimulationConfig, {"spammers": {"fractoin": 0.1}})
    with pytest.raises(SimulationError, match=r"spammers.fraction must lie in \[0, 1\]"):
        to_schema(SimulationConfig, {"spammers": {"fraction": 1.5}})


@needs_data
def test_simulated_accuracy_rises_with_k_on_real_ag_news(
    tmp_path: Path, make_cfg: Callable, mlflow_uri: str
) -> None:
    from saleval.stages import simulate
    from saleval.stages import tasks as tasks_stage

    explain = real_ag_news_explain(tmp_path / "explain", n_per_class=25)
    t_cfg = make_cfg(
        "tasks",
        [f"inputs.explain={explain}", "study.repeats=3", "kgrid.ks=[5,10,20,40]"],
        name="tasks",
    )
    task_dir = tasks_stage.run(t_cfg)["run_dir"]
    # a cautious crowd ("I don't know" below 0.2; the default is 0 ± 0.05, so that
    # people's rare abstentions leave little to see) to watch the abstentions fall with k
    sim_cfg = make_cfg(
        "simulate", [f"inputs.tasks={task_dir}", "simulation.idk_threshold=0.2"], name="sim"
    )
    out = simulate.run(sim_cfg)
    answers = tables.ANSWERS.read(out["run_dir"])
    tasks = tables.TASKS.read(task_dir)
    a = answers.merge(tasks[["task_id", "method", "k", "label"]], on="task_id")
    a["correct"] = a["answer"] == a["label"].map(lambda c: AG_LABELS[int(c)])
    a["idk"] = a["answer"] == IDK
    acc = a.groupby(["method", "k"])["correct"].mean().unstack()  # 300 answers per cell
    idk = a.groupby(["method", "k"])["idk"].mean().unstack()
    # random words: every extra word helps, and "I don't know" becomes rarer
    assert acc.loc["random", 40] > acc.loc["random", 20] > acc.loc["random", 5], acc
    assert acc.loc["random", 40] > acc.loc["random", 5] + 0.15, acc
    assert idk.loc["random", 5] > idk.loc["random", 40] + 0.05, idk
    # the words that carry the class help at small k, where random words do not
    assert acc.loc["oracle", 5] > acc.loc["random", 5] + 0.15, acc
    assert acc.mean(axis=0)[40] > acc.mean(axis=0)[5], acc
    maj = _strict_majority(answers, tasks).groupby(["method", "k"])["correct"].mean().unstack()
    assert maj.loc["random", 40] > maj.loc["random", 5] + 0.15, maj
    # the run's own metrics say the same
    assert out["sim_accuracy_k40"] > out["sim_accuracy_k5"]
