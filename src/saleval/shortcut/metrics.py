"""Moved to :mod:`saleval.metrics.shortcut`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.shortcut import *  # noqa: F403
from saleval.metrics.shortcut import __all__ as __all__
