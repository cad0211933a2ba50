"""Moved to :mod:`saleval.metrics.config`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.config import *  # noqa: F403
from saleval.metrics.config import __all__ as __all__
