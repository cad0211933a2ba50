"""Moved to :mod:`saleval.metrics.faithfulness.engine`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.faithfulness.engine import *  # noqa: F403
from saleval.metrics.faithfulness.engine import __all__ as __all__
