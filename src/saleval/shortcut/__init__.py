"""The shortcut protocol (docs/shortcut.md): planted tokens as ground truth for saliency.

* :mod:`~saleval.shortcut.rules` — the shortcut rules (``st``, ``tic``, ``op``) and the new
  vocabulary; :mod:`~saleval.shortcut.planting` — where tokens go and where they landed;
  :mod:`~saleval.shortcut.generate` — mixed training data and the fully synthetic test
  set, with ground truth;
* :mod:`~saleval.shortcut.verify` — the checks that the mixed model uses the shortcut
  (:class:`~saleval.shortcut.verify.VerificationError` stops the run);
* precision@k and mean rank are metrics, beside every other one (:mod:`saleval.metrics.shortcut`);
* :mod:`~saleval.shortcut.experiment` — the steps the ``saleval-shortcut`` stage runs;
* :mod:`~saleval.shortcut.report` — the published table layout.
"""

from __future__ import annotations

from saleval.shortcut.generate import ShortcutData, build_mixed, build_shortcut_data, synthesize
from saleval.shortcut.report import combine_runs, published_table, to_markdown
from saleval.shortcut.rules import (
    KINDS,
    ShortcutError,
    ShortcutRule,
    extend_vocabulary,
    prepare_source,
    rule_from_config,
)
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
    "prepare_source",
    "published_table",
    "require",
    "rule_from_config",
    "synthesize",
    "to_markdown",
    "verify",
]
