"""Moved to :mod:`saleval.metrics.config` (docs/architecture.md §7).

This path re-exports it, so imports written before the move keep working.
"""

from saleval.metrics.config import *  # noqa: F403
from saleval.metrics.config import __all__ as __all__
