"""The schema of the ``metrics`` config group (``conf/metrics/*.yaml``): every default once.

:class:`MetricsConfig` is an OmegaConf structured config: composed through Hydra (the
schema is stored in Hydra's ConfigStore as ``metrics/schema``, which
``conf/metrics/default.yaml`` extends), a misspelt key or a bad ``removal`` fails when
the config is composed, naming the key. The YAML files state only what differs from
these defaults. Re-exported by :mod:`saleval.metrics.faithfulness`.

The built-in metrics' settings are fields of :class:`MetricsConfig` (their keys predate
the registry and recipes use them). A metric that declares its own settings dataclass at
registration (:func:`saleval.metrics.registry.register_metric`) gets the node
``metrics.settings.<name>``: :func:`schema` types that node from the registry, so its
keys fail at compose like every other (docs/extending.md, *An automated metric*).

This module imports no model code, so registering the schema costs nothing.

>>> cfg = MetricsConfig.from_config({"ks": [2, 5], "switching": {"chunk": 4}})
>>> cfg.ks, cfg.aopc_k, cfg.switching.chunk, cfg.removal
([2, 5], 10, 4, <Removal.delete: 'delete'>)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from enum import StrEnum
from typing import Any

from omegaconf import II, DictConfig
from omegaconf.errors import OmegaConfBaseException

from saleval.config.model import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS
from saleval.metrics.registry import import_plugins, registered
from saleval.modeling.devices import ACCELERATORS
from saleval.schema import to_schema
from saleval.vocab import Removal

__all__ = [
    "ERASER_GRID",
    "PLUGINS_KEY",
    "Convention",
    "InferenceConfig",
    "MetricsConfig",
    "PlausibilityConfig",
    "SwitchingConfig",
    "n_words_for_fraction",
    "plugins_named",
    "schema",
    "store_schema",
]

PLUGINS_KEY = "metrics.plugins"
"""The override that names the modules of a user's own metrics."""

ERASER_GRID: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""ERASER's rationale bins, fractions of a text's words (DeYoung et al. 2020, §4)."""


def n_words_for_fraction(fraction: float, n_words: int) -> int:
    r"""Number of words that make up ``fraction`` of a text: :math:`\max(1, \lceil f n \rceil)`.

    ERASER (DeYoung et al. 2020, §4) bins rationales at 1, 5, 10, 20, 50 % of the
    tokens; rounding up keeps the 1 % bin non-empty on short texts.

    >>> n_words_for_fraction(0.01, 40), n_words_for_fraction(0.5, 5)
    (1, 3)
    """
    if not 0 < fraction < 1:
        raise ValueError(f"a fraction of words must lie in (0, 1), got {fraction}")
    if n_words <= 0:
        return 0
    return max(1, math.ceil(fraction * n_words - 1e-9))


@dataclass
class SwitchingConfig:
    """The switching-point walk (Nguyen 2018, §3.2)."""

    chunk: int = 10  # deletions evaluated per round (one batched call per round)
    max_fraction: float = 1.0  # stop after deleting this fraction; unchanged class -> 1.0


@dataclass
class InferenceConfig:
    """Batched forward passes (:func:`saleval.modeling.inference.predict_proba`)."""

    max_tokens: int = DEFAULT_MAX_TOKENS  # padded tokens per batch (fastest measured)
    max_batch: int = DEFAULT_MAX_BATCH  # sequences per batch, binding only for the shortest
    # true | false | auto: bf16 autocast only where the hardware has it (GPU, AMX/AVX512-BF16
    # CPU; emulated bf16 is ~8x slower, saleval.modeling.inference.use_bf16). A str: OmegaConf has no
    # bool | str type; "true"/"false" parse as the booleans.
    bf16: str = "false"
    # auto | cpu | gpu | cuda: where the forward passes run, by the rule training and the
    # explain stage follow (saleval.modeling.devices.device_for): auto the GPU when there
    # is one; gpu fails without one
    accelerator: str = "auto"


class Convention(StrEnum):
    """Whose rules the plausibility metrics follow (docs/metrics.md#plausibility).

    ``saleval``: words inside the model's window, every metric averaged over texts
    (``auprc``, ``token_f1``, ``iou_f1``); ``eraser``: ERASER's scorer's rules on its own
    tokens over whole documents (``eraser_auprc``, ``eraser_token_f1``, ``eraser_iou_f1``);
    ``both``.
    """

    saleval = "saleval"
    eraser = "eraser"
    both = "both"


@dataclass
class PlausibilityConfig:
    """Agreement with human rationales (ERASER), on datasets that have them."""

    enabled: str = "auto"  # auto: when the dataset has human rationales; true | false
    # saleval | eraser | both: whose rules (docs/metrics.md#eraser names the differences)
    convention: Convention = Convention.saleval
    top_k: int | None = None  # discrete rationale = top-k words; None: as many as the human one
    iou_threshold: float = 0.5  # IOU F1 match threshold (ERASER)


@dataclass
class MetricsConfig:
    """What :func:`saleval.metrics.faithfulness.evaluate` and ``saleval-metrics`` compute."""

    name: str = "default"
    # delete | mask | unk: how a removed word's tokens go, always on ids (as LIME/occlusion)
    removal: Removal = Removal.delete
    # comprehensiveness/sufficiency per k words: the crowd k-grid by default
    ks: list[int] = II("kgrid.ks")  # noqa: RUF009
    # ERASER bins (fractions of words): per bin, then averaged (k "")
    eraser_grid: list[float] = field(default_factory=lambda: list(ERASER_GRID))
    aopc_k: int = 10  # AOPC over the first K deletions
    log_odds_fraction: float = 0.2  # log-odds drop after removing this fraction of the words
    # sufficiency keeps only the top-k words (+ [CLS]/[SEP]) and no punctuation: what a
    # crowd worker sees
    sufficiency_keep_other: bool = False
    switching: SwitchingConfig = field(default_factory=SwitchingConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    plausibility: PlausibilityConfig = field(default_factory=PlausibilityConfig)
    methods: list[str] | None = None  # None: every method of the explain run
    max_samples: int | None = None  # None: every explained sample; else the first N by id
    # modules imported before the metrics run (and by the comparison), each registering its
    # own metrics with saleval.metrics.registry.register_metric (docs/extending.md)
    plugins: list[str] = field(default_factory=list)
    # metrics.settings.<name>: the settings of each registered metric that declares them;
    # typed per metric by schema(), held here as {name: settings dataclass instance}
    settings: Any = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.removal = Removal(self.removal)
        if isinstance(self.ks, str):
            raise ValueError(
                f"metrics.ks is {self.ks!r}, unresolved: compose it with a kgrid group or pass ks"
            )
        self.ks = [int(k) for k in self.ks]
        self.eraser_grid = [float(f) for f in self.eraser_grid]
        if any(k < 1 for k in self.ks):
            raise ValueError(f"metrics.ks must be positive word counts, got {self.ks}")
        for f in (*self.eraser_grid, self.log_odds_fraction):
            n_words_for_fraction(f, 1)  # validates 0 < f < 1
        if self.aopc_k < 1 or self.switching.chunk < 1:
            raise ValueError("metrics.aopc_k and metrics.switching.chunk must be ≥ 1")
        if not 0 < self.switching.max_fraction <= 1:
            raise ValueError("metrics.switching.max_fraction must lie in (0, 1]")
        for key, value in (
            ("inference.bf16", self.inference.bf16),
            ("plausibility.enabled", self.plausibility.enabled),
        ):
            if str(value).lower() not in ("auto", "true", "false"):
                raise ValueError(f"metrics.{key} must be true, false or auto, got {value!r}")
        if str(self.inference.accelerator).lower() not in ACCELERATORS:
            raise ValueError(
                f"metrics.inference.accelerator must be one of {ACCELERATORS}, "
                f"got {self.inference.accelerator!r}"
            )
        self.settings = _settings_by_metric(self.settings)

    def settings_of(self, name: str) -> Any:
        """The settings of metric ``name``: its configured instance of the dataclass it
        declared (its defaults when the config predates the metric's registration)."""
        if name in self.settings:
            return self.settings[name]
        declared = {m.info.name: m.info.settings for m in registered()}.get(name)
        if declared is None:
            raise KeyError(f"metric {name!r} declares no settings")
        return declared()

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | DictConfig) -> MetricsConfig:
        """Validate a ``metrics`` node against the schema; an unknown key fails naming it.

        A node of a composed config is resolved first (``ks: ${kgrid.ks}`` points into it).
        The modules of ``plugins`` are imported first, so their metrics' settings are known.
        """
        if isinstance(node, cls):
            return node
        import_plugins([str(m) for m in (node.get("plugins") or [])])
        try:
            obj = to_schema(schema(), node)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or ""
            raise ValueError(
                f"metrics config{f', key {key!r}' if key else ''}: {str(err).splitlines()[0]} "
                "(see saleval.metrics.config.MetricsConfig for the keys and their types)"
            ) from None
        assert isinstance(obj, cls)
        return obj


def _settings_by_metric(given: Any) -> dict[str, Any]:
    """``{name: settings}`` from a :func:`schema` settings node or a plain mapping; a name
    that declares no settings fails, naming it."""
    if is_dataclass(given) and not isinstance(given, type):
        given = {f.name: getattr(given, f.name) for f in fields(given)}
    declared = {m.info.name: m.info.settings for m in registered() if m.info.settings}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(
            f"metrics.settings: {unknown} name no registered metric with settings; "
            f"known: {sorted(declared)} (is the metric's module in metrics.plugins?)"
        )
    return {name: to_schema(declared[name], value) for name, value in given.items()}


def schema() -> type[MetricsConfig]:
    """:class:`MetricsConfig` whose ``settings`` node has one typed node per metric
    registered now with a settings dataclass, so each of their keys is checked like any
    other (an unknown metric or field fails, naming it)."""
    node = make_dataclass(
        "MetricSettings",
        [
            (m.info.name, m.info.settings, field(default_factory=m.info.settings))
            for m in registered()
            if m.info.settings is not None
        ],
    )
    cls = make_dataclass(
        "MetricsConfig", [("settings", node, field(default_factory=node))], bases=(MetricsConfig,)
    )
    cls.__doc__ = MetricsConfig.__doc__
    return cls


def plugins_named(overrides: Sequence[str]) -> list[str]:
    """The modules a command line's ``metrics.plugins=[...]`` names (every value of a
    sweep); other arguments are ignored.

    >>> plugins_named(["kgrid=smoke", "metrics.plugins=[mylab.metrics,b]", "-m"])
    ['mylab.metrics', 'b']
    """
    named = [a for a in overrides if a.lstrip("+~").startswith(PLUGINS_KEY + "=")]
    if not named:  # the common case: no parser to build
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: list[str] = []
    for arg in named:
        try:
            override = parser.parse_override(arg)
        except HydraException:  # composing reports it, as for any malformed override
            continue
        values = override.sweep_iterator() if override.is_sweep_override() else [override.value()]
        for value in values:
            out.extend(str(m) for m in (value if isinstance(value, list) else [value]))
    return list(dict.fromkeys(out))


def store_schema(plugins: Sequence[str] = (), open_settings: bool = False) -> None:
    """Store :func:`schema` as ``metrics/schema`` in Hydra's ConfigStore, after importing
    the ``plugins`` modules: their metrics' settings are then keys a config can set. Call
    it again whenever a metric was registered since. ``open_settings``: store
    :class:`MetricsConfig` itself, whose ``settings`` take any keys (composing once to
    find the plugins a YAML file names: :mod:`saleval.pipeline.compose`)."""
    from hydra.core.config_store import ConfigStore

    import_plugins(plugins)
    node = MetricsConfig if open_settings else schema()
    ConfigStore.instance().store(group="metrics", name="schema", node=node)
