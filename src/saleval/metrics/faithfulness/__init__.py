"""Automated faithfulness metrics (docs/metrics.md): word deletion on token ids.

Every metric compares the model's probability of its own prediction ŷ (argmax on
the full text) before and after removing words in the order a saliency method
ranks them. Words are those of :mod:`saleval.words`; removing a word removes all
its word pieces *on the ids* (:func:`saleval.words.perturb_ids`), never by
decoding and re-tokenizing text, so a removed word cannot come back as other
pieces. Removal (:class:`saleval.vocab.Removal`) deletes the pieces (default), or
replaces each with ``[MASK]`` or ``[UNK]``.

* :mod:`~saleval.metrics.faithfulness.formulas`: the formulas, small pure functions citing
  their sources, and the two perturbations (without words, only words);
* :mod:`~saleval.metrics.faithfulness.builtin`: the built-in metrics, each registered in
  :mod:`saleval.metrics.registry` with its direction, citation and outputs;
* :mod:`~saleval.metrics.faithfulness.engine`: :func:`evaluate`, a loop over the registered
  metrics sharing one probability cache, timing each.

A new metric is a :class:`PerturbationMetric` subclass decorated with
:func:`saleval.metrics.registry.register_metric`; :func:`evaluate` and the comparison with
the crowd pick it up. Its settings are read from :class:`saleval.metrics.config.MetricsConfig`;
this package lists only its own names.

Conventions:

* ranking: :func:`saleval.words.rank_words` (words sorted by score, highest first;
  equal scores keep text order);
* k words beyond a text's length are clipped to its length;
* a fraction f of a text's n words is ``ceil(f · n)`` words (at least one), so
  1 % of a 40-word headline is one word, not zero;
* "the predicted class changes" means ``argmax p(·|x') ≠ ŷ`` (numpy's argmax,
  ties to the lower class index).
"""

from saleval.metrics.faithfulness.builtin import (
    AOPC_LEAST,
    AOPC_MOST,
    COMPREHENSIVENESS,
    LOG_ODDS_DROP,
    NO_SWITCH,
    SUFFICIENCY,
    SWITCHING_POINT,
)
from saleval.metrics.faithfulness.engine import (
    FULL_TEXT,
    KGRID_SUFFIX,
    AddRow,
    AlignmentError,
    Context,
    Explanation,
    FaithfulnessResult,
    PerturbationMetric,
    ProbabilityCache,
    Row,
    evaluate,
    explanations_from_tables,
    k_label,
    p_target_rows,
    summarize,
)
from saleval.metrics.faithfulness.formulas import (
    aopc,
    comprehensiveness,
    grid_average,
    log_odds,
    log_odds_drop,
    only_words,
    sufficiency,
    switching_point,
    without_words,
)

__all__ = [
    "AOPC_LEAST",
    "AOPC_MOST",
    "COMPREHENSIVENESS",
    "FULL_TEXT",
    "KGRID_SUFFIX",
    "LOG_ODDS_DROP",
    "NO_SWITCH",
    "SUFFICIENCY",
    "SWITCHING_POINT",
    "AddRow",
    "AlignmentError",
    "Context",
    "Explanation",
    "FaithfulnessResult",
    "PerturbationMetric",
    "ProbabilityCache",
    "Row",
    "aopc",
    "comprehensiveness",
    "evaluate",
    "explanations_from_tables",
    "grid_average",
    "k_label",
    "log_odds",
    "log_odds_drop",
    "only_words",
    "p_target_rows",
    "sufficiency",
    "summarize",
    "switching_point",
    "without_words",
]
