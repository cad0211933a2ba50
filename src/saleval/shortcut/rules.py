"""The shortcut rules and the tokens they plant (docs/shortcut.md; Bastings et al. 2022).

New tokens are added to the tokenizer's vocabulary (``#0``, ``#1`` and a context
token, ``#2`` by default; :func:`extend_vocabulary`) and a rule decides the label of a
synthetic example:

* ``st``  (single token): ``#0`` → label 0, ``#1`` → label 1;
* ``tic`` (token in context): ``#0``/``#1`` decide the label only when the context
  token is also present;
* ``op``  (ordered pair): both ``#0`` and ``#1`` present; the one that comes first decides.

:func:`prepare_source` makes the source model and tokenizer ready for the new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.config.shortcut import ShortcutConfig
from saleval.errors import UserError
from saleval.modeling.data import DatasetSplits
from saleval.schema import to_schema

KINDS = ("st", "tic", "op")


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


def vocab_ids(tokenizer: PreTrainedTokenizerFast, tokens: list[str]) -> list[int]:
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
    ids = vocab_ids(tokenizer, rule.vocabulary)
    if model is not None:
        weight = model.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)
        if weight.shape[0] != len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
    return [int(i) for i in ids]


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
