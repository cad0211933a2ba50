"""The random baseline (docs/methods.md): i.i.d. uniform word scores, reproducible per sample."""

from __future__ import annotations

import numpy as np

from saleval.attribution.base import Attributor, Texts, register, sample_rng


@register("random", display="Random", published="Random", paper_order=9)
class RandomScores(Attributor):
    """Uniform(0, 1) per word, drawn from a generator seeded by (``seed``, the sample's text).

    Keying on the sample rather than on its position in a batch makes the scores
    independent of batching, order and which other samples are explained.
    """

    def __init__(self, *, seed: int = 0, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.seed = int(seed)

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        return [sample_rng(self.seed, s.text).uniform(size=s.n_words) for s in texts.segs]
