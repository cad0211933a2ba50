"""Moved to :mod:`saleval.metrics.faithfulness.builtin`.

This path re-exports it, so imports written before the move keep working
(docs/architecture.md, *Every metric in one package*).
"""

from saleval.metrics.faithfulness.builtin import *  # noqa: F403
from saleval.metrics.faithfulness.builtin import __all__ as __all__
