"""Every automated metric in one package (docs/metrics.md; docs/architecture.md, *Every
metric in one package*).

* :mod:`~saleval.metrics.registry`: one declaration per metric (name, direction,
  citation, outputs, its own settings dataclass), read by every consumer;
* :mod:`~saleval.metrics.config`: the ``metrics`` config schema, with a node
  ``metrics.settings.<name>`` per registered metric that declares settings;
* :mod:`~saleval.metrics.faithfulness`: word deletion on token ids: the formulas, the
  built-in metrics and :func:`~saleval.metrics.faithfulness.evaluate`;
* :mod:`~saleval.metrics.plausibility`: agreement with human rationales (ERASER);
* :mod:`~saleval.metrics.shortcut`: precision@k and mean rank of planted shortcut tokens
  (docs/shortcut.md), pure functions over rankings, outside the registry because they
  need the ground truth only the shortcut protocol has.

Only the registry is imported here, so ``import saleval.metrics.config`` (the CLI does
it before composing) loads no numpy, pandas or model code.
"""

from saleval.metrics.registry import (
    KINDS,
    Metric,
    MetricInfo,
    direction,
    import_plugins,
    outputs,
    register_metric,
    registered,
    unregister_metric,
)

__all__ = [
    "KINDS",
    "Metric",
    "MetricInfo",
    "direction",
    "import_plugins",
    "outputs",
    "register_metric",
    "registered",
    "unregister_metric",
]
