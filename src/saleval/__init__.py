"""saleval: which word-saliency method helps people, and do automated metrics agree?

The package is a pipeline of Hydra stages (``saleval.stages``) that exchange the
typed tables declared in :mod:`saleval.pipeline.tables` and log every run to MLflow
(:mod:`saleval.pipeline.tracker.tracking`). In a notebook, :mod:`saleval.api` runs the same code on
texts and models you hold: ``saleval.explain``, ``saleval.evaluate``,
``saleval.highlight`` (``docs/api.md``). They load on first use, so ``import saleval``
stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saleval.api import (
        Classifier,
        HTMLPage,
        evaluate,
        explain,
        highlight,
        load_model,
        read_explanations,
    )

__version__ = "0.1.0"

__all__ = [
    "Classifier",
    "HTMLPage",
    "__version__",
    "evaluate",
    "explain",
    "highlight",
    "load_model",
    "read_explanations",
]

#: the names of :mod:`saleval.api` that ``saleval.<name>`` reaches
_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    """``saleval.explain`` etc.: import :mod:`saleval.api` (torch, transformers) on first use."""
    if name in _API:
        from saleval import api

        return getattr(api, name)
    raise AttributeError(f"module 'saleval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
