"""Moved to :mod:`saleval.metrics.faithfulness.formulas` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.faithfulness.formulas import *  # noqa: F403
from saleval.metrics.faithfulness.formulas import __all__ as __all__
