"""Moved to :mod:`saleval.metrics.faithfulness` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.faithfulness import *  # noqa: F403
from saleval.metrics.faithfulness import __all__ as __all__
