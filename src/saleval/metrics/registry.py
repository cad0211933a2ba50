"""The registry of automated metrics: one declaration per metric, read by every consumer.

A metric declares, once, its name, its direction (higher is better or not), the paper
it comes from, every name it writes to ``metrics.csv`` (e.g. comprehensiveness also
writes ``comprehensiveness_kgrid``; the switching point writes the diagnostic
``no_switch``, which has no direction) and, optionally, a dataclass of its own settings,
which the ``metrics`` config schema then holds at ``metrics.settings.<name>``
(:mod:`saleval.metrics.config`; docs/extending.md). :func:`saleval.metrics.faithfulness.evaluate`
runs every registered ``faithfulness`` metric over one shared probability cache;
:func:`saleval.metrics.plausibility.plausibility_scores` runs the ``plausibility`` ones;
the comparison with the crowd takes each metric's direction from here and names, rather
than drops, any metric of a table that nobody registered. The manner is that of Hugging
Face ``evaluate`` (``_info`` + ``_compute``) and Inseq's step functions.

Register a metric with :func:`register_metric` on a subclass of
:class:`saleval.metrics.faithfulness.PerturbationMetric` (it declares the perturbed
sequences it needs and reduces their probabilities to rows) or of
:class:`saleval.metrics.plausibility.RationaleMetric`.

>>> import saleval.metrics.faithfulness  # importing it registers the built-in metrics
>>> direction("sufficiency"), direction("comprehensiveness_kgrid"), direction("no_switch")
(False, True, None)
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import Any, ClassVar, TypeVar

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

KINDS = ("faithfulness", "plausibility")


@dataclass(frozen=True)
class MetricInfo:
    """What a metric is: its name, direction, source and the names it writes."""

    name: str
    higher_is_better: bool
    citation: str
    description: str = ""
    #: further names the metric writes, each with its direction (None: a diagnostic, not ranked)
    extra_outputs: Mapping[str, bool | None] = field(default_factory=dict)
    #: the dataclass of the metric's own settings (``metrics.settings.<name>``), or None
    settings: type[Any] | None = None

    @property
    def outputs(self) -> dict[str, bool | None]:
        """Every name this metric writes to ``metrics.csv``, with its direction."""
        return {self.name: self.higher_is_better, **dict(self.extra_outputs)}


class Metric(abc.ABC):
    """Base of every registered metric; ``info`` is set by :func:`register_metric`."""

    #: ``faithfulness`` (computed from the model's probabilities by ``evaluate``) or
    #: ``plausibility`` (computed against human rationales)
    kind: ClassVar[str] = "faithfulness"
    info: ClassVar[MetricInfo]


_REGISTRY: dict[str, Metric] = {}

M = TypeVar("M", bound=type[Metric])


def register_metric(
    name: str,
    *,
    higher_is_better: bool,
    citation: str,
    description: str = "",
    extra_outputs: Mapping[str, bool | None] | None = None,
    settings: type[Any] | None = None,
) -> Callable[[M], M]:
    """Class decorator: register a :class:`Metric` subclass (built with no arguments).

    Registration order is run order (the built-ins first), so the probability cache
    serves later metrics from earlier ones' sequences. A name (or output name) already
    taken by another metric fails. ``settings``: a dataclass whose every field has a
    default; the metric reads its configured instance with
    :meth:`saleval.metrics.config.MetricsConfig.settings_of` (docs/extending.md).
    """
    if settings is not None and not (isinstance(settings, type) and is_dataclass(settings)):
        raise ValueError(f"metric {name}: settings must be a dataclass, got {settings!r}")
    if settings is not None and not name.isidentifier():  # it becomes a config key
        raise ValueError(f"metric {name!r}: a metric with settings needs a name like a_b")

    def deco(cls: M) -> M:
        if cls.kind not in KINDS:
            raise ValueError(f"metric {name}: kind must be one of {KINDS}, got {cls.kind!r}")
        info = MetricInfo(
            name, bool(higher_is_better), citation, description, extra_outputs or {}, settings
        )
        taken = {out: m.info.name for m in _REGISTRY.values() for out in m.info.outputs}
        clash = sorted(o for o in info.outputs if o in taken and taken[o] != name)
        if clash:
            raise ValueError(f"metric {name}: output name(s) {clash} already registered")
        cls.info = info
        _REGISTRY[name] = cls()
        return cls

    return deco


def import_plugins(modules: Sequence[str]) -> None:
    """Import modules that register their own metrics (``metrics.plugins``); one that
    cannot be imported fails naming it."""
    for module in modules:
        try:
            importlib.import_module(str(module))
        except ImportError as err:
            raise ValueError(f"metrics.plugins: cannot import {module!r} ({err})") from err


def unregister_metric(name: str) -> None:
    """Remove a registered metric (tests, experiments)."""
    _REGISTRY.pop(name, None)


def registered(kind: str | None = None) -> list[Metric]:
    """The registered metrics (of one ``kind``), in registration order. The built-in ones
    register when :mod:`saleval.metrics.faithfulness` and :mod:`saleval.metrics.plausibility`
    are imported (the modules that read the registry import them; the registry imports
    neither)."""
    return [m for m in _REGISTRY.values() if kind is None or m.kind == kind]


def outputs() -> dict[str, bool | None]:
    """Every metric name any registered metric writes, with its direction."""
    return {o: d for m in registered() for o, d in m.info.outputs.items()}


def direction(name: str) -> bool | None:
    """Whether higher ``name`` is better (None: a diagnostic); KeyError when unregistered."""
    out = outputs()
    if name not in out:
        raise KeyError(f"metric {name!r} is not registered; registered: {sorted(out)}")
    return out[name]
