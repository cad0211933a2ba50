"""The human-lexicon reader (docs/simulated-crowd.md#the-lexicon-reader): hand-worked
readings, the "I don't know" path of a view without a polar word, and the rule that picks
a reader for a dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from saleval.config.crowd import SimulationConfig, SimulationError
from saleval.crowd.simulation.lexicon import AutoReader, Lexicon, LexiconReader, read_phrases
from saleval.crowd.simulation.readers import BowReader, build_reader
from saleval.crowd.simulation.workers import Reading, draw_workers, read_tasks, simulate_answers

# word -> (negative, positive) weights; polar above 1.5: "great" (spread 2), "bad" (4)
HAND = Lexicon(
    ("negative", "positive"),
    {"great": 0, "bad": 1, "good": 2, "the": 3},
    np.array([[-1.0, 1.0], [2.0, -2.0], [-0.7, 0.7], [0.05, -0.05]]),
)


def _reader(labels: tuple[str, ...] = ("negative", "positive")) -> LexiconReader:
    reader = LexiconReader(phrases="unused.tsv")
    reader.use(HAND, labels)
    return reader


def test_hand_worked_views() -> None:
    reader = _reader()
    views = ["..great ", "great .........great ", ".good .the ", "great bad ", "", "Great!"]
    p = reader.predict_proba(views)
    sigma = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    # one polar word: logits (-1, 1), p(positive) = σ(2); two: σ(4); hidden words count 0
    np.testing.assert_allclose(p[0], [1 - sigma(2), sigma(2)])
    np.testing.assert_allclose(p[1], [1 - sigma(4), sigma(4)])
    # "good" (spread 1.4) and "the" are not clearly polar: nothing to go on, uniform
    np.testing.assert_allclose(p[2], [0.5, 0.5])
    # great (+1) and bad (−2 for positive, +2 for negative): logits (1, −1)
    np.testing.assert_allclose(p[3], [sigma(2), 1 - sigma(2)])
    np.testing.assert_allclose(p[4], [0.5, 0.5])
    np.testing.assert_allclose(p[5], p[0])  # case and punctuation do not matter
    # the dataset's label order decides the columns
    np.testing.assert_allclose(_reader(("Positive", "negative")).predict_proba(views), p[:, ::-1])


def test_hidden_words_do_not_dilute_the_evidence() -> None:
    reader = _reader()
    few, many = "great bad great ", "." * 400 + "great .bad " + "." * 50 + "great "
    np.testing.assert_allclose(reader.predict_proba([few]), reader.predict_proba([many]))


def test_a_view_without_a_polar_word_takes_the_idk_or_guess_path() -> None:
    reader = _reader()
    tasks = pd.DataFrame(
        {
            "task_id": ["none", "one"],
            "display_text": [".good .the ..", "..bad ."],
            "n_words_shown": [2, 1],
        }
    )
    probs = reader.predict_proba(tasks["display_text"].tolist())
    bundles = pd.DataFrame({"bundle_id": ["b"] * 2, "position": [1, 2], "task_id": ["none", "one"]})
    careful = SimulationConfig(idk_threshold=0.1, idk_jitter=0.0, temperature=0.1)
    careful.noise.distribution, careful.noise.value = "fixed", 0.0  # type: ignore[assignment]
    careful.spammers.fraction = 0.0
    workers = draw_workers(["b"], 2, careful)
    answers = simulate_answers(tasks, bundles, probs, workers, ["negative", "positive"], careful)
    assert answers.set_index("task_id").loc["none", "answer"] == "I don't know"
    assert answers.set_index("task_id").loc["one", "answer"] == "negative"
    # a worker who never abstains guesses: uniform over the labels
    guess = SimulationConfig(idk_threshold=0.0, idk_jitter=0.0)
    guess.noise.distribution, guess.noise.value = "fixed", 0.0  # type: ignore[assignment]
    guess.spammers.fraction = 0.0
    many = pd.DataFrame(
        {"bundle_id": [f"b{i}" for i in range(400)], "position": 1, "task_id": "none"}
    )
    who = draw_workers(list(many["bundle_id"]), 2, guess)
    said = simulate_answers(tasks, many, probs, who, ["negative", "positive"], guess)["answer"]
    assert set(said) == {"negative", "positive"} and 0.4 < (said == "positive").mean() < 0.6


def test_polar_words_are_those_whose_weights_spread_beyond_the_threshold() -> None:
    assert sorted(HAND.polar(1.5).vocabulary) == ["bad", "great"]
    assert sorted(HAND.polar(0.0).vocabulary) == ["bad", "good", "great", "the"]
    assert HAND.polar(5.0).weights.shape == (0, 2)


def test_fitted_on_human_phrases_and_read_in_steps(tmp_path: Path) -> None:
    phrases = tmp_path / "phrases.tsv"
    rows = [("a great film", 1), ("great", 1), ("wonderful acting", 1), ("the plot", 1)]
    rows += [("a dull film", 0), ("dull", 0), ("awful acting", 0), ("the plot", 0)]
    pd.DataFrame(rows * 20, columns=["text", "label"]).to_csv(phrases, sep="\t", index=False)
    reader = LexiconReader(phrases=str(phrases), polar_threshold=1.0)
    reader.fit([], [], ["negative", "positive"])
    p = reader.predict_proba(["", "great ", "great .wonderful ", "the plot film "])[:, 1]
    assert p[0] == 0.5 and p[3] == 0.5  # no clearly polar word
    assert 0.5 < p[1] < p[2]  # one, then two polar words shown


def test_bad_phrase_files_get_one_located_line(tmp_path: Path) -> None:
    with pytest.raises(SimulationError, match=r"phrases: .*missing.tsv not found"):
        read_phrases(tmp_path / "missing.tsv", "text", "label")
    bad = tmp_path / "bad.tsv"
    bad.write_text("text\tlabel\ngood\t1\nbad\tneg\n")
    with pytest.raises(SimulationError, match=r"bad.tsv, row 2, field label: 'neg' is not a class"):
        read_phrases(bad, "text", "label")
    with pytest.raises(SimulationError, match=r"row header: no column 'sentence'"):
        read_phrases(bad, "sentence", "label")
    with pytest.raises(SimulationError, match=r"do not name every label of the dataset"):
        _reader(("World", "Sports"))


def test_auto_picks_the_lexicon_for_sentiment_and_the_corpus_reader_elsewhere(
    tmp_path: Path,
) -> None:
    phrases = tmp_path / "p.tsv"
    pd.DataFrame({"text": ["great", "dull"] * 5, "label": [1, 0] * 5}).to_csv(
        phrases, sep="\t", index=False
    )
    node = {"_target_": "saleval.crowd.simulation.lexicon.AutoReader"}
    node["lexicon"] = {
        "_target_": "saleval.crowd.simulation.lexicon.LexiconReader",
        "phrases": str(phrases),
        "polar_threshold": 0.5,
    }
    auto = build_reader(node)
    assert isinstance(auto, AutoReader)
    assert isinstance(auto.choose(["negative", "positive"]), LexiconReader)
    assert isinstance(auto.choose(["World", "Sports", "Business", "Sci/Tech"]), BowReader)
    train = pd.DataFrame(
        {"text": ["goal match team", "vote war minister"] * 6, "label": [0, 1] * 6}
    )
    tasks = pd.DataFrame({"display_text": ["..match ", "great "]})
    cfg = SimulationConfig(reader=node)
    topic = read_tasks(tasks, train, ["Sports", "World"], cfg)
    sentiment = read_tasks(tasks, train.assign(label=[0, 1] * 6), ["negative", "positive"], cfg)
    assert isinstance(topic, Reading) and topic.reader == "corpus reader (BowReader)"
    assert sentiment.reader == "human-lexicon reader (LexiconReader)"
    assert sentiment.probs[0].tolist() == [0.5, 0.5] and sentiment.probs[1, 1] > 0.5
