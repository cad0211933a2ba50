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
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from transformers import PreTrainedTokenizerFast

from saleval.modeling.data import DatasetSplits
from saleval.shortcut.planting import plant_tokens
from saleval.shortcut.rules import ShortcutError, ShortcutRule, vocab_ids

log = logging.getLogger(__name__)


# Columns of every generated frame (besides sample_id, text, label).
ROLE_ORIGINAL, ROLE_DISTRACTOR, ROLE_SYNTHETIC = "original", "distractor", "synthetic"


# ---------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# Source data
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# Insertion
# ---------------------------------------------------------------------------------


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
    ids = dict(zip(rule.vocabulary, vocab_ids(tokenizer, rule.vocabulary)))
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
    ids = dict(zip(rule.vocabulary, vocab_ids(tokenizer, rule.vocabulary)))
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
