"""Schemas of ``conf/shortcut`` (the planted rule) and of the shortcut stage's
``explain`` node (Bastings et al. 2022, "Will you find these shortcuts?")."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from saleval.vocab import Target


class ShortcutKind(StrEnum):
    """``st``: single token; ``tic``: token in context; ``op``: ordered pair (Bastings et al. 2022)."""

    st = "st"
    tic = "tic"
    op = "op"


class RankUnit(StrEnum):
    """What a shortcut ranking orders (docs/shortcut.md#units): ``word`` (saleval's words,
    as the crowd study shows them) or ``piece`` (every non-special word piece, as Bastings
    et al. 2022 rank them)."""

    word = "word"
    piece = "piece"


@dataclass
class VerifyConfig:
    """Thresholds the two models must meet before any saliency is computed."""

    mixed_synthetic_min: float = 0.99  # mixed model accuracy on the synthetic test set
    original_synthetic_band: float = 0.10  # original model within chance ± this on it
    original_test_gap: float = 0.03  # |original − mixed| accuracy on the original test set


@dataclass
class ShortcutConfig:
    """``conf/shortcut/*.yaml``: the rule, how much data carries it, and verification."""

    kind: ShortcutKind = ShortcutKind.st
    tokens: list[str] = field(default_factory=lambda: ["#0", "#1"])  # label-deciding tokens
    context: str = "#2"  # the context token of `tic` (added for every kind)
    max_distance: int = 50  # multi-token shortcuts: at most this many tokens apart
    synthetic_fraction: float = 0.2  # synthetic rows added to the train set
    distractor_fraction: float = 0.0  # share of original rows given one lone token
    distractors: list[str] = field(default_factory=list)  # which lone tokens
    synthetic_test_size: int = 500  # fully synthetic test set (verification)
    unit: RankUnit = RankUnit.word  # what precision@k and rank count: words or word pieces
    verify: VerifyConfig = field(default_factory=VerifyConfig)


@dataclass
class ShortcutExplainConfig:
    """The shortcut stage's saliency sweep on the synthetic test set.

    ``budget``: ``[glob over config names, n]`` caps (first match wins); ``skip``: globs
    of configurations left out.
    """

    n_samples: int | None = 50
    target: Target = Target.prediction
    budget: list[Any] | None = None
    skip: list[str] = field(default_factory=list)
