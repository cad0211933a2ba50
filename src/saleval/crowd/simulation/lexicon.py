"""A reader that weighs words as people do (docs/simulated-crowd.md#the-lexicon-reader),
and the rule that picks a reader for a dataset.

:class:`LexiconReader` takes its word evidence from **human judgments**, not from the
study's own corpus: a word model (logistic regression on binary word presence) fitted on
phrases that people labelled, by default the Stanford Sentiment Treebank's phrase labels
as GLUE's SST-2 ships them (Socher et al. 2013; every phrase of a parse tree rated by
three annotators, neutral phrases removed). A word is *clearly polar* when its weights
for two classes differ by more than ``polar_threshold``; a view's evidence is the sum of
the weights of the polar words **shown** (each occurrence counts), so

* hidden words do not dilute it (the analysis of the published IMDB crowd found that
  people's accuracy depends on how many polar words they see, not on how many words are
  hidden);
* it rises in steps, one polar word at a time (people: 20 % right with none shown,
  53 % with one, 69 % with two, 82 % with three or more, on the published IMDB tasks);
* a view without a polar word reads as uniform, so a worker takes the "I don't know" or
  guess path.

A corpus-fitted bag of words (:class:`saleval.crowd.simulation.readers.BowReader`)
credits cues of the corpus that people do not read as sentiment ("just", "no", "too" on
IMDB) and was 7 points off per (method, k) cell there; this reader brings it under 5
(docs/simulated-crowd.md#validation).

:class:`AutoReader` (``simulation/reader=auto``, the default) uses the lexicon reader on
a dataset whose label names are all classes of the lexicon (negative/positive for the
SST-2 lexicon: IMDB, SST-2, the published IMDB samples) and the corpus reader elsewhere.
For topic labels (AG News) no human word-level judgments are at hand here, and the
corpus reader's error on the published AG News crowd is already at the crowd's own
sampling noise (docs/simulated-crowd.md#topic-data).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression

from saleval.config.crowd import BOW_READER, ReaderConfig, SimulationError

log = logging.getLogger(__name__)

LEXICON_READER = "saleval.crowd.simulation.lexicon.LexiconReader"
TOKEN_PATTERN = r"(?u)\b\w+\b"
"""Lower-cased runs of word characters: how both the phrases and the views are split
(``don't`` gives ``don`` and ``t`` on both sides; a display text's dots are not words)."""


@dataclass(frozen=True)
class Lexicon:
    """Word weights fitted on human-labelled phrases: ``weights[v, c]`` is the centred
    log-odds that word ``v`` adds for class ``classes[c]`` (binary: ±β/2)."""

    classes: tuple[str, ...]
    vocabulary: dict[str, int]
    weights: np.ndarray

    def polar(self, threshold: float) -> Lexicon:
        """Only the clearly polar words: largest minus smallest class weight > ``threshold``.

        >>> lex = Lexicon(("neg", "pos"), {"bad": 0, "the": 1}, np.array([[1.0, -1.0], [0.1, -0.1]]))
        >>> sorted(lex.polar(1.5).vocabulary)
        ['bad']
        """
        spread = self.weights.max(axis=1) - self.weights.min(axis=1)
        keep = np.flatnonzero(spread > float(threshold))
        words = sorted(self.vocabulary, key=self.vocabulary.__getitem__)
        return Lexicon(
            self.classes, {words[int(i)]: j for j, i in enumerate(keep)}, self.weights[keep]
        )


def fit_lexicon(
    texts: Sequence[str], labels: Sequence[int], classes: Sequence[str], C: float = 1.0
) -> Lexicon:
    """Logistic regression on binary word presence over labelled phrases (L2, ``C``):
    each word's weight is what it adds to a phrase's log-odds when people read it."""
    vec = CountVectorizer(binary=True, lowercase=True, token_pattern=TOKEN_PATTERN)
    x = vec.fit_transform(list(texts))
    y = np.asarray(labels, dtype=np.int64)
    present = sorted(set(y.tolist()))
    if present != list(range(len(classes))):
        raise SimulationError(
            f"lexicon phrases: labels {present} do not index the {len(classes)} classes "
            f"{list(classes)} (expected 0..{len(classes) - 1})"
        )
    lr = LogisticRegression(C=float(C), max_iter=2000).fit(x, y)
    coef = lr.coef_
    weights = np.stack([-coef[0] / 2, coef[0] / 2], axis=1) if coef.shape[0] == 1 else coef.T
    weights = weights - weights.mean(axis=1, keepdims=True)
    vocab = {str(w): int(i) for w, i in vec.vocabulary_.items()}
    return Lexicon(tuple(str(c) for c in classes), vocab, np.asarray(weights, dtype=np.float64))


def read_phrases(path: str | Path, text_column: str, label_column: str) -> pd.DataFrame:
    """The labelled phrase file (CSV, or TSV by its extension), text and label columns
    named; one line naming the file and the column when it cannot be used."""
    p = Path(path)
    if not p.is_file():
        raise SimulationError(
            f"simulation.reader.phrases: {p} not found; point it at a file of human-labelled "
            "phrases (default: <data root>/sst2/train.tsv) or use simulation/reader=bow"
        )
    sep = "\t" if p.suffix.lower() in {".tsv", ".tab"} else ","
    frame = pd.read_csv(p, sep=sep, quoting=3 if sep == "\t" else 0, keep_default_na=False)
    for col in (text_column, label_column):
        if col not in frame.columns:
            raise SimulationError(
                f"{p}, row header: no column {col!r} (columns: {list(frame.columns)}); set "
                "simulation.reader.text_column / label_column"
            )
    labels = pd.to_numeric(frame[label_column], errors="coerce")
    bad = labels.isna() | (labels != labels.round())
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0]) + 1
        raise SimulationError(
            f"{p}, row {row}, field {label_column}: {frame[label_column].iloc[row - 1]!r} is "
            "not a class index; the phrase labels must be integers 0..C-1"
        )
    return pd.DataFrame({"text": frame[text_column].astype(str), "label": labels.astype("int64")})


@lru_cache(maxsize=4)
def _cached_lexicon(
    path: str, mtime: float, text_column: str, label_column: str, classes: tuple[str, ...], C: float
) -> Lexicon:
    """One fit per phrase file, settings and file version, however many simulated crowds
    (seeds, planner pools) a process builds."""
    phrases = read_phrases(path, text_column, label_column)
    log.info(
        "lexicon reader: word model fitted on %d human-labelled phrases of %s", len(phrases), path
    )
    return fit_lexicon(phrases["text"].tolist(), phrases["label"].tolist(), classes, C)


def class_order(lexicon_classes: Sequence[str], label_names: Sequence[str]) -> list[int] | None:
    """For each dataset label, its column in the lexicon (names compared case-insensitively);
    None when some label is not a class of the lexicon.

    >>> class_order(["negative", "positive"], ["Positive", "negative"])
    [1, 0]
    >>> class_order(["negative", "positive"], ["World", "Sports"]) is None
    True
    """
    index = {str(c).strip().lower(): i for i, c in enumerate(lexicon_classes)}
    cols = [index.get(str(n).strip().lower()) for n in label_names]
    return None if any(c is None for c in cols) else [int(c) for c in cols if c is not None]


@dataclass
class LexiconReader(ReaderConfig):
    """Sum of human-lexicon weights over the clearly polar words shown (module docstring).

    It learns nothing from the study's dataset (``split`` and ``max_train`` are unused):
    its evidence comes from ``phrases``, which never hold a study text of another corpus.
    """

    _target_: str = LEXICON_READER
    # human-labelled phrases: a CSV/TSV with a text and an integer label column
    phrases: str | None = None
    phrase_labels: list[str] = field(default_factory=lambda: ["negative", "positive"])
    text_column: str = "text"
    label_column: str = "label"
    C: float = 1.0  # inverse L2 strength of the word model
    # a word is clearly polar when its class weights differ by more than this (log-odds);
    # fitted with the worker model on the published crowds (docs/simulated-crowd.md)
    polar_threshold: float = 1.5

    def lexicon(self) -> Lexicon:
        """The word model of ``phrases`` (fitted once per process and file version)."""
        if not self.phrases:
            raise SimulationError(
                "simulation.reader.phrases is not set: the lexicon reader needs a file of "
                "human-labelled phrases (simulation/reader=lexicon sets <data root>/sst2/train.tsv)"
            )
        path = Path(self.phrases)
        mtime = path.stat().st_mtime if path.is_file() else 0.0
        return _cached_lexicon(
            str(path),
            mtime,
            self.text_column,
            self.label_column,
            tuple(str(c) for c in self.phrase_labels),
            float(self.C),
        )

    def covers(self, label_names: Sequence[str]) -> bool:
        """Whether every dataset label is a class of the lexicon (by name)."""
        return class_order(self.phrase_labels, label_names) is not None

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int = 0
    ) -> LexiconReader:
        """Ready the polar words for ``label_names``; the dataset's texts are not used."""
        return self.use(self.lexicon(), label_names)

    def use(self, lexicon: Lexicon, label_names: Sequence[str]) -> LexiconReader:
        """Read with ``lexicon``'s clearly polar words, its classes in the dataset's order."""
        order = class_order(lexicon.classes, label_names)
        if order is None:
            raise SimulationError(
                f"simulation.reader: the lexicon's classes {list(lexicon.classes)} do not "
                f"name every label of the dataset {list(label_names)}; use simulation/reader=auto "
                "(the corpus reader for such labels) or a lexicon of these labels"
            )
        polar = lexicon.polar(float(self.polar_threshold))
        if not polar.vocabulary:
            raise SimulationError(
                f"simulation.reader.polar_threshold={self.polar_threshold}: no word of the "
                f"lexicon ({len(lexicon.vocabulary)} words) is that polar; lower the threshold"
            )
        self._vec = CountVectorizer(
            lowercase=True, token_pattern=TOKEN_PATTERN, vocabulary=polar.vocabulary
        )
        self._weights = polar.weights[:, order]
        return self

    def evidence(self, texts: Sequence[str]) -> np.ndarray:
        """Per view and dataset label, the summed weights of the polar words shown."""
        counts = self._vec.transform(list(texts))
        return np.asarray(counts @ self._weights)

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        z = self.evidence(texts)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


@dataclass
class AutoReader(ReaderConfig):
    """The lexicon reader where its lexicon names every label of the dataset, the corpus
    reader (``corpus``) elsewhere; ``chosen`` says which one read (module docstring)."""

    _target_: str = "saleval.crowd.simulation.lexicon.AutoReader"
    lexicon: dict[str, Any] = field(default_factory=lambda: {"_target_": LEXICON_READER})
    corpus: dict[str, Any] = field(default_factory=lambda: {"_target_": BOW_READER})

    def choose(self, label_names: Sequence[str]) -> Any:
        """The reader for a dataset with these labels (not yet fitted)."""
        from saleval.crowd.simulation.readers import build_reader

        lexicon = build_reader(self.lexicon)
        if isinstance(lexicon, LexiconReader) and lexicon.covers(label_names):
            return lexicon
        return build_reader(self.corpus)

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int = 0
    ) -> AutoReader:
        self._reader = self.choose(label_names)
        self.chosen = reader_name(self._reader)
        self._reader.fit(texts, labels, label_names, seed)
        return self

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._reader.predict_proba(texts))


READER_NAMES = {
    "LexiconReader": "human-lexicon reader",
    "BowReader": "corpus reader",
    "EmbeddingReader": "embedding reader",
    "FinetunedReader": "fine-tuned reader",
}


def reader_name(reader: Any) -> str:
    """What a reader is called in notices: "human-lexicon reader (LexiconReader)"."""
    cls = type(reader).__name__
    return f"{READER_NAMES.get(cls, 'reader')} ({cls})"
