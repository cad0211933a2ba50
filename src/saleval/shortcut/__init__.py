"""The shortcut protocol (docs/shortcut.md): planted tokens as ground truth for saliency.

* :mod:`~saleval.shortcut.generate` — shortcut rules (``st``, ``tic``, ``op``), the new
  vocabulary, mixed training data and the fully synthetic test set, with ground truth;
* :mod:`~saleval.shortcut.verify` — the checks that the mixed model uses the shortcut
  (:class:`~saleval.shortcut.verify.VerificationError` stops the run);
* :mod:`saleval.metrics.shortcut` — precision@k and mean rank (beside every other metric);
* :mod:`~saleval.shortcut.experiment` — the steps the ``saleval-shortcut`` stage runs;
* :mod:`~saleval.shortcut.report` — the published table layout.
"""

from __future__ import annotations

from saleval.metrics.shortcut import mean_rank, precision_at_k
from saleval.shortcut.generate import (
    KINDS,
    ShortcutData,
    ShortcutError,
    ShortcutRule,
    build_mixed,
    build_shortcut_data,
    extend_vocabulary,
    prepare_source,
    rule_from_config,
    synthesize,
)
from saleval.shortcut.report import combine_runs, published_table, to_markdown
from saleval.shortcut.verify import VerificationError, VerificationReport, require, verify

__all__ = [
    "KINDS",
    "ShortcutData",
    "ShortcutError",
    "ShortcutRule",
    "VerificationError",
    "VerificationReport",
    "build_mixed",
    "build_shortcut_data",
    "combine_runs",
    "extend_vocabulary",
    "mean_rank",
    "precision_at_k",
    "prepare_source",
    "published_table",
    "require",
    "rule_from_config",
    "synthesize",
    "to_markdown",
    "verify",
]
