"""Moved to :mod:`saleval.metrics.faithfulness.formulas`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.faithfulness.formulas import *  # noqa: F403
from saleval.metrics.faithfulness.formulas import __all__ as __all__
