"""A user's metric module, named by ``metrics.plugins=[tests.plugin_metric]`` (test_extending)."""

from __future__ import annotations

import numpy as np

from saleval import faithfulness as F

NAME = "top_word_drop"


@F.register_metric(NAME, higher_is_better=True, citation="docs/extending.md (an example)")
class TopWordDrop(F.PerturbationMetric):
    """p(ŷ|x) − p(ŷ|x without its single most salient word): comprehensiveness at k = 1."""

    def sequences(self, ctx: F.Context, e: F.Explanation) -> list[list[int]]:
        return [ctx.without(e, e.order[:1])]

    def reduce(self, ctx: F.Context, e: F.Explanation, probs: np.ndarray) -> list[F.Row]:
        return [(NAME, "", float(ctx.p_full[e.sample_id] - ctx.p_target(e, probs)[0]))]
