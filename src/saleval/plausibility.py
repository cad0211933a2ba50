"""Moved to :mod:`saleval.metrics.plausibility`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.plausibility import *  # noqa: F403
from saleval.metrics.plausibility import __all__ as __all__
