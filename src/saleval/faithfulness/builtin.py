"""Moved to :mod:`saleval.metrics.faithfulness.builtin` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.faithfulness.builtin import *  # noqa: F403
from saleval.metrics.faithfulness.builtin import __all__ as __all__
