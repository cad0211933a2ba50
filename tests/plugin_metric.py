"""A user's metric module, named by ``metrics.plugins=[tests.plugin_metric]`` (test_extending).

Its metric has its own settings (``metrics.settings.top_word_drop.words``), declared with
it at registration, as docs/extending.md shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saleval.metrics import faithfulness as F
from saleval.metrics.registry import register_metric

NAME = "top_word_drop"


@dataclass
class TopWordDropSettings:
    words: int = 1  # how many of the most salient words go


@register_metric(
    NAME,
    higher_is_better=True,
    citation="docs/extending.md (an example)",
    settings=TopWordDropSettings,
)
class TopWordDrop(F.PerturbationMetric):
    """p(ŷ|x) − p(ŷ|x without its ``words`` most salient words): comprehensiveness at that k."""

    def sequences(self, ctx: F.Context, e: F.Explanation) -> list[list[int]]:
        words = ctx.config.settings_of(NAME).words
        return [ctx.without(e, e.order[:words])]

    def reduce(self, ctx: F.Context, e: F.Explanation, probs: np.ndarray) -> list[F.Row]:
        return [(NAME, "", float(ctx.p_full[e.sample_id] - ctx.p_target(e, probs)[0]))]
