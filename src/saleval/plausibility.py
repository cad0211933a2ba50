"""Moved to :mod:`saleval.metrics.plausibility` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.plausibility import *  # noqa: F403
from saleval.metrics.plausibility import __all__ as __all__
