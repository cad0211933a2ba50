"""Moved to :mod:`saleval.metrics.registry` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.registry import *  # noqa: F403
from saleval.metrics.registry import __all__ as __all__
