"""Moved to :mod:`saleval.metrics.shortcut` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.shortcut import *  # noqa: F403
from saleval.metrics.shortcut import __all__ as __all__
