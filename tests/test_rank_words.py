"""The one word ranking (saleval.words.rank_words) and its tie rules, tested once."""

from __future__ import annotations

import numpy as np
import pytest

from saleval.words import rank_words


def test_highest_first_and_ties_in_text_order() -> None:
    assert rank_words([0.3, 0.9, 0.3, -1.0, 0.9]).tolist() == [1, 4, 0, 2, 3]


def test_against_puts_flagged_ties_last_but_never_above_a_lower_score() -> None:
    scores = [0.5, 0.5, 0.5, 0.7, 0.1]
    assert rank_words(scores, ties="against", against=[0, 2]).tolist() == [3, 1, 0, 2, 4]
    # a constant explanation ranks the planted words last
    assert rank_words([0.0] * 4, ties="against", against=[0]).tolist() == [1, 2, 3, 0]


def test_top_k_sets_are_nested_across_k() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=50).astype(float)  # many ties
    order = rank_words(scores)
    for k in range(1, 50):
        assert set(order[:k]) <= set(order[: k + 1])
    assert sorted(order.tolist()) == list(range(50))


@pytest.mark.parametrize("bad", [[0.1, float("nan")], [float("inf"), 0.0]])
def test_non_finite_scores_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="not finite at positions"):
        rank_words(bad)


def test_unknown_tie_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid Ties"):
        rank_words([1.0, 2.0], ties="random")
