"""Planted shortcuts (docs/shortcut.md; Bastings et al. 2022, "Will you find these shortcuts?").

New tokens are added to the tokenizer's vocabulary (``#0``, ``#1`` and a context
token, ``#2`` by default) and inserted as whitespace-separated words into source
texts. Three rules decide the label of a synthetic example:

* ``st``  (single token): ``#0`` → label 0, ``#1`` → label 1;
* ``tic`` (token in context): ``#0``/``#1`` decide the label only when the context
  token is also present;
* ``op``  (ordered pair): both ``#0`` and ``#1`` present; the one that comes first decides.

Multi-token shortcuts sit at most ``max_distance`` tokens apart. Because a model
could otherwise learn "``#0`` anywhere → label 0" instead of the ``tic``/``op`` rule,
single shortcut tokens are also planted into part of the original data with the
original labels kept (*distractors*).

Every generated example keeps where its tokens landed: ``gt_tokens`` (positions in
the model's input ids, ``[CLS]`` = 0) and ``gt_words`` (indices into the kept words
of :func:`saleval.words.segment`, the unit every saliency ranking uses). Both are
read back from the real tokenisation of the final text, never predicted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.config.shortcut import ShortcutConfig
from saleval.errors import UserError
from saleval.modeling.data import DatasetSplits
from saleval.schema import to_schema
from saleval.words import segment

log = logging.getLogger(__name__)

KINDS = ("st", "tic", "op")
_CHUNK = re.compile(r"\S+")

# Columns of every generated frame (besides sample_id, text, label).
ROLE_ORIGINAL, ROLE_DISTRACTOR, ROLE_SYNTHETIC = "original", "distractor", "synthetic"


class ShortcutError(UserError, ValueError):
    """A shortcut configuration or a source dataset cannot be used as asked."""


@dataclass(frozen=True)
class ShortcutRule:
    """One shortcut type: which tokens exist and how they set the label."""

    kind: str
    tokens: tuple[str, str] = ("#0", "#1")
    context: str = "#2"
    max_distance: int = 50
    distractors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ShortcutError(f"shortcut.kind must be one of {KINDS}, got {self.kind!r}")
        if len(self.tokens) != 2 or len({*self.tokens, self.context}) != 3:
            raise ShortcutError(
                f"shortcut needs two label tokens and a distinct context token; got "
                f"tokens={list(self.tokens)}, context={self.context!r}"
            )
        if self.max_distance < 1:
            raise ShortcutError(f"shortcut.max_distance must be ≥ 1, got {self.max_distance}")
        for d in self.distractors:
            if d not in self.vocabulary:
                raise ShortcutError(f"distractor {d!r} is not one of {self.vocabulary}")
            if self.label_of([d]) is not None:
                raise ShortcutError(
                    f"distractor {d!r} alone would decide the label under {self.kind}"
                )

    @property
    def k(self) -> int:
        """Number of ground-truth tokens per example (precision@k uses this k)."""
        return 1 if self.kind == "st" else 2

    @property
    def vocabulary(self) -> list[str]:
        """All three new tokens, for every kind, so models of all kinds share a vocabulary."""
        return [*self.tokens, self.context]

    def label_of(self, present: Sequence[str]) -> int | None:
        """The rule itself: the label that the shortcut tokens ``present`` (in text order)
        decide, or ``None`` when they decide nothing."""
        found = [t for t in present if t in self.vocabulary]
        labels = [self.tokens.index(t) for t in found if t in self.tokens]
        if self.kind == "st":
            return labels[0] if len(labels) == 1 and len(found) == 1 else None
        if self.kind == "tic":
            ok = len(labels) == 1 and found.count(self.context) == 1 and len(found) == 2
            return labels[0] if ok else None
        # op: exactly #0 and #1, the first decides
        return labels[0] if sorted(labels) == [0, 1] and len(found) == 2 else None

    def plant(self, label: int, rng: np.random.Generator) -> list[str]:
        """Tokens that make ``label`` under this rule, in the text order they must keep."""
        if self.kind == "st":
            return [self.tokens[label]]
        if self.kind == "tic":
            pair = [self.tokens[label], self.context]
            return pair if rng.random() < 0.5 else pair[::-1]
        return [self.tokens[label], self.tokens[1 - label]]


def rule_from_config(cfg: ShortcutConfig | Mapping[str, Any]) -> ShortcutRule:
    """A :class:`ShortcutRule` from a ``conf/shortcut/*.yaml`` node (defaults and key
    checks from :class:`saleval.config.ShortcutConfig`)."""
    sc = to_schema(ShortcutConfig, cfg)
    return ShortcutRule(
        kind=str(sc.kind),
        tokens=tuple(str(t) for t in sc.tokens),  # type: ignore[arg-type]
        context=str(sc.context),
        max_distance=int(sc.max_distance),
        distractors=tuple(str(t) for t in sc.distractors),
    )


# ---------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------


def _token_ids(tokenizer: PreTrainedTokenizerFast, tokens: list[str]) -> list[int]:
    # a list of tokens gives a list of ids; the stubs type it int | list[int]
    return cast(list[int], tokenizer.convert_tokens_to_ids(tokens))


def extend_vocabulary(
    tokenizer: PreTrainedTokenizerFast,
    rule: ShortcutRule,
    model: PreTrainedModel | None = None,
) -> list[int]:
    """Add the shortcut tokens to ``tokenizer`` (and resize ``model``'s embeddings).

    The tokens are matched before WordPiece splitting, so ``#0`` is one token, never
    ``#`` + ``0``. Returns their ids in :attr:`ShortcutRule.vocabulary` order.
    """
    tokenizer.add_tokens(rule.vocabulary)
    ids = _token_ids(tokenizer, rule.vocabulary)
    if model is not None:
        weight = model.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)
        if weight.shape[0] != len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
    return [int(i) for i in ids]


# ---------------------------------------------------------------------------------
# Source data
# ---------------------------------------------------------------------------------


def prepare_source(
    data: DatasetSplits, rule: ShortcutRule, label_map: Sequence[int] | None = None
) -> tuple[DatasetSplits, dict[str, int]]:
    """Binary source splits: labels mapped (``label_map[i]`` = new label of class i,
    -1 drops the class; AG News → ``[0, 0, 1, 1]``) and texts that already contain a
    shortcut token dropped (an unplanted ``#1`` would be a second, unknown shortcut).

    Returns the new splits and how many rows each filter dropped.
    """
    names = list(data.label_names)
    if label_map is None:
        if len(names) != 2:
            raise ShortcutError(
                f"dataset {data.name} has {len(names)} classes {names}; shortcuts need two. "
                f"Map them, e.g. label_map=[0,0,1,1]"
            )
        mapping = [0, 1]
        new_names = names
    else:
        mapping = [int(v) for v in label_map]
        if len(mapping) != len(names) or set(mapping) - {-1} != {0, 1}:
            raise ShortcutError(
                f"label_map={mapping} must give each of the {len(names)} classes "
                f"{names} a new label 0 or 1 (or -1 to drop it), using both 0 and 1"
            )
        new_names = ["+".join(n for n, m in zip(names, mapping) if m == c) for c in (0, 1)]
    lowered = [t.lower() for t in rule.vocabulary]
    splits: dict[str, pd.DataFrame] = {}
    dropped = {"dropped_class": 0, "dropped_has_token": 0}
    for split, df in data.splits.items():
        lab = df["label"].map(lambda y: mapping[int(y)])
        keep_class = lab >= 0
        text = df["text"].astype(str).str.lower()
        has_token = text.map(lambda s: any(t in s for t in lowered))
        keep = keep_class & ~has_token
        dropped["dropped_class"] += int((~keep_class).sum())
        dropped["dropped_has_token"] += int((keep_class & has_token).sum())
        out = df.loc[keep, ["sample_id", "text"]].copy()
        out["label"] = lab[keep].astype("int64")
        splits[split] = out.reset_index(drop=True)
    info = {**data.info, **dropped}
    return DatasetSplits(f"{data.name}", new_names, splits, data.source, info), dropped


# ---------------------------------------------------------------------------------
# Insertion
# ---------------------------------------------------------------------------------


@dataclass
class Planted:
    """One text with tokens planted, and where they ended up."""

    text: str
    inserted: list[str]  # the planted tokens, in text order
    gt_tokens: list[int]  # their positions in the input ids ([CLS] = 0)
    gt_words: list[int]  # their kept-word indices
    distance: int | None = None  # token distance between first and last planted token
    extra: dict[str, Any] = field(default_factory=dict)


def _boundaries(
    text: str, tokenizer: PreTrainedTokenizerFast, max_length: int, n_insert: int
) -> tuple[list[tuple[int, int]], np.ndarray, int]:
    """Whitespace chunks, tokens before each chunk boundary, and how many boundaries
    leave room for ``n_insert`` tokens inside the truncation window."""
    chunks = [(m.start(), m.end()) for m in _CHUNK.finditer(text)]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.array([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    cuts = [s for s, _ in chunks] + [len(text) + 1]
    before = np.searchsorted(starts, np.array(cuts), side="left")
    room = max_length - tokenizer.num_special_tokens_to_add() - n_insert
    allowed = int(np.searchsorted(before, room, side="right"))
    return chunks, before, allowed


def _insert(text: str, chunks: list[tuple[int, int]], placed: list[tuple[int, str]]) -> str:
    """``text`` with each (boundary, token) inserted as its own word; boundary b < len(chunks)
    means before chunk b, b == len(chunks) the end. Equal boundaries keep list order."""
    if not chunks:
        return " ".join(t for _, t in placed)
    out = text
    for b in sorted({b for b, _ in placed}, reverse=True):
        toks = [t for bb, t in placed if bb == b]
        if b < len(chunks):
            at = chunks[b][0]
            out = out[:at] + " ".join(toks) + " " + out[at:]
        else:
            at = chunks[-1][1]
            out = out[:at] + " " + " ".join(toks) + out[at:]
    return out


def plant_tokens(
    text: str,
    tokens: Sequence[str],
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    max_length: int,
    max_distance: int,
    token_ids: Mapping[str, int] | None = None,
) -> Planted:
    """Insert ``tokens`` (kept in this order) at random word boundaries of ``text``.

    Positions are uniform over the boundaries that stay inside the truncation window;
    the last token lands at most ``max_distance`` tokens after the first. The result's
    ground truth is read back from the real tokenisation and checked.
    """
    n = len(tokens)
    chunks, before, allowed = _boundaries(text, tokenizer, max_length, n)
    if allowed == 0:
        raise ShortcutError(
            f"no room for {n} token(s) within max_length={max_length}: {text[:80]!r}"
        )
    if n > 2:
        raise ShortcutError(f"at most two planted tokens per text, got {list(tokens)}")
    first = int(rng.integers(allowed))
    bounds = [first]
    if n == 2:
        # once both are in, the two tokens sit |before[b] - before[first]| + 1 apart
        gap = np.abs(before[:allowed] - before[first]) + 1
        other = int(rng.choice(np.flatnonzero(gap <= max_distance)))
        bounds = sorted([first, other])
    placed = list(zip(bounds, tokens))
    planted = locate(_insert(text, chunks, placed), tokens, tokenizer, max_length, token_ids)
    if planted.distance is not None and planted.distance > max_distance:
        raise ShortcutError(
            f"planted tokens {planted.distance} > {max_distance} apart: {planted.text[:120]!r}"
        )
    return planted


def locate(
    text: str,
    tokens: Sequence[str],
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    token_ids: Mapping[str, int] | None = None,
) -> Planted:
    """Find planted ``tokens`` (expected in this order) in the tokenised ``text``."""
    ids = dict(token_ids or zip(tokens, _token_ids(tokenizer, list(tokens))))
    wanted = {ids[t]: t for t in tokens}
    seg = segment(text, tokenizer, max_length)
    pos = [i for i, tid in enumerate(seg.input_ids) if tid in wanted]
    found = [wanted[seg.input_ids[i]] for i in pos]
    words = [seg.token_word[i] for i in pos]
    if found != list(tokens) or any(w < 0 for w in words):
        raise ShortcutError(
            f"planted {list(tokens)} but the tokenised text holds {found} "
            f"(words {words}): {text[:120]!r}"
        )
    distance = pos[-1] - pos[0] if len(pos) > 1 else None
    return Planted(text, list(tokens), pos, words, distance)


# ---------------------------------------------------------------------------------
# Data sets
# ---------------------------------------------------------------------------------


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols = [
        "sample_id",
        "text",
        "label",
        "role",
        "source_id",
        "source_label",
        "inserted",
        "gt_tokens",
        "gt_words",
        "distance",
    ]
    df = pd.DataFrame(rows, columns=cols)
    df["label"] = df["label"].astype("int64")
    df["source_label"] = df["source_label"].astype("int64")
    df["distance"] = df["distance"].astype("Int64")
    return df


def _original_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            "sample_id": r.sample_id,
            "text": r.text,
            "label": int(r.label),
            "role": ROLE_ORIGINAL,
            "source_id": r.sample_id,
            "source_label": int(r.label),
            "inserted": [],
            "gt_tokens": [],
            "gt_words": [],
            "distance": None,
        }
        for r in df.itertuples(index=False)
    ]


def synthesize(
    source: pd.DataFrame,
    n: int,
    rule: ShortcutRule,
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    max_length: int,
) -> pd.DataFrame:
    """``n`` synthetic examples: source texts (drawn without replacement) with the
    shortcut planted and the label set by the rule, labels balanced 0/1."""
    if n > len(source):
        raise ShortcutError(f"asked for {n} synthetic examples from {len(source)} source texts")
    picks = source.iloc[rng.choice(len(source), size=n, replace=False)]
    labels = rng.permutation(np.arange(n) % 2)
    ids = dict(zip(rule.vocabulary, _token_ids(tokenizer, rule.vocabulary)))
    rows = []
    for r, y in zip(picks.itertuples(index=False), labels):
        planted = plant_tokens(
            r.text, rule.plant(int(y), rng), tokenizer, rng, max_length, rule.max_distance, ids
        )
        label = rule.label_of(planted.inserted)
        assert label == int(y), (planted.inserted, y)
        rows.append(
            {
                "sample_id": f"{r.sample_id}~{rule.kind}",
                "text": planted.text,
                "label": label,
                "role": ROLE_SYNTHETIC,
                "source_id": r.sample_id,
                "source_label": int(r.label),
                "inserted": planted.inserted,
                "gt_tokens": planted.gt_tokens,
                "gt_words": planted.gt_words,
                "distance": planted.distance,
            }
        )
    return _frame(rows)


def add_distractors(
    df: pd.DataFrame,
    rule: ShortcutRule,
    fraction: float,
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    max_length: int,
) -> pd.DataFrame:
    """Plant one single shortcut token (from ``rule.distractors``) into ``fraction`` of
    the rows of an ``original`` frame, labels unchanged: a lone ``#0`` must mean nothing
    under ``tic`` and ``op``. ``gt_words`` stays empty (it is not the shortcut); where
    the token went is in ``inserted``/``gt_tokens``."""
    out = df.copy()
    if not rule.distractors or fraction <= 0:
        return out
    n = round(fraction * len(df))
    idx = rng.choice(len(df), size=n, replace=False)
    ids = dict(zip(rule.vocabulary, _token_ids(tokenizer, rule.vocabulary)))
    for i in idx:
        tok = str(rng.choice(list(rule.distractors)))
        planted = plant_tokens(
            str(out.at[i, "text"]), [tok], tokenizer, rng, max_length, rule.max_distance, ids
        )
        out.at[i, "text"] = planted.text
        out.at[i, "role"] = ROLE_DISTRACTOR
        out.at[i, "sample_id"] = f"{out.at[i, 'sample_id']}~d"
        out.at[i, "inserted"] = planted.inserted
        out.at[i, "gt_tokens"] = planted.gt_tokens
    return out


def build_mixed(
    source: pd.DataFrame,
    rule: ShortcutRule,
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    max_length: int,
    synthetic_fraction: float = 0.2,
    distractor_fraction: float = 0.0,
) -> pd.DataFrame:
    """The mixed set: every source row (part of them with a distractor token) plus
    ``round(synthetic_fraction × len(source))`` synthetic rows, shuffled — 20 % larger
    than the source by default, as in the shortcut protocol."""
    original = add_distractors(
        _frame(_original_rows(source)), rule, distractor_fraction, tokenizer, rng, max_length
    )
    n_syn = round(synthetic_fraction * len(source))
    synthetic = synthesize(source, n_syn, rule, tokenizer, rng, max_length)
    mixed = pd.concat([original, synthetic], ignore_index=True)
    return mixed.iloc[rng.permutation(len(mixed))].reset_index(drop=True)


@dataclass
class ShortcutData:
    """Everything one shortcut experiment trains and tests on."""

    rule: ShortcutRule
    label_names: list[str]
    original: dict[str, pd.DataFrame]  # train / validation / test of the source
    mixed: dict[str, pd.DataFrame]  # train / validation (mixed), test (= original test)
    synthetic_test: pd.DataFrame
    info: dict[str, Any]


def build_shortcut_data(
    source: DatasetSplits,
    rule: ShortcutRule,
    tokenizer: PreTrainedTokenizerFast,
    seed: int,
    max_length: int,
    synthetic_fraction: float = 0.2,
    distractor_fraction: float = 0.0,
    synthetic_test_size: int = 500,
) -> ShortcutData:
    """Mixed train and validation sets and the fully synthetic test set, seeded.

    The mixed validation set is built like the mixed train set so that early stopping
    of the mixed model watches both the task and the shortcut. The synthetic test set
    comes from the source *test* split, so no test text was seen in training.
    """
    rng = np.random.default_rng(seed)
    original = {s: _frame(_original_rows(source[s])) for s in ("train", "validation", "test")}
    mixed = {
        s: build_mixed(
            source[s], rule, tokenizer, rng, max_length, synthetic_fraction, distractor_fraction
        )
        for s in ("train", "validation")
    }
    mixed["test"] = original["test"]
    n_test = min(int(synthetic_test_size), len(source["test"]))
    if n_test < synthetic_test_size:
        log.warning(
            "synthetic test set: %d examples asked, the source test split has %d",
            synthetic_test_size,
            n_test,
        )
    synthetic_test = synthesize(source["test"], n_test, rule, tokenizer, rng, max_length)
    info = {
        "n_source_train": len(source["train"]),
        "n_source_validation": len(source["validation"]),
        "n_source_test": len(source["test"]),
        "n_mixed_train": len(mixed["train"]),
        "n_mixed_validation": len(mixed["validation"]),
        "n_synthetic_train": int((mixed["train"]["role"] == ROLE_SYNTHETIC).sum()),
        "n_distractor_train": int((mixed["train"]["role"] == ROLE_DISTRACTOR).sum()),
        "n_synthetic_test": len(synthetic_test),
    }
    return ShortcutData(rule, list(source.label_names), original, mixed, synthetic_test, info)
