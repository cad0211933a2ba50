"""What a run is called and keyed by, the same in every stage (docs/tracking.md).

* Run names say what ran (:func:`run_name`): ``explain · ag_news · minilm · 9 methods``.
* Params: ``dataset``, ``model``, ``methods`` and what runs are compared by in the config
  groups the stage uses (:func:`stage_params`), as dotted override paths; a method's
  settings are params of its child run (:func:`method_settings`); a ``-m`` job's
  overrides too (:func:`override_params`). Keys MLflow refuses are made safe
  (:func:`param_key`).
* Metric keys are snake_case words joined by ``_`` (no ``/``, no ``.``;
  :func:`metric_key`), a metric at k words ``<metric>_k<k>`` (:func:`metric_at_k`).
  Per-method numbers never go into a key: they go to one child run per method, tagged
  and param'ed :data:`METHOD`, so the runs table puts methods in rows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

#: the tag (and param) that marks a per-method child run
METHOD = "method"


#: separator of the parts of a run name
SEP = " · "


def run_name(
    stage: str,
    dataset: str | None = None,
    model: str | None = None,
    methods: Sequence[str] | None = None,
    simulated: bool = False,
) -> str:
    """What ran, for the runs table: stage, dataset, model, methods, SIMULATED.

    >>> run_name("explain", "ag_news", "minilm", ["lime"] * 9)
    'explain · ag_news · minilm · 9 methods'
    >>> run_name("score", "ag_news", None, None, simulated=True)
    'score · ag_news · SIMULATED'
    >>> run_name("explain", "imdb", "bert", ["lime"])
    'explain · imdb · bert · lime'
    """
    parts = [stage, dataset, model]
    if methods:
        parts.append(methods[0] if len(methods) == 1 else f"{len(methods)} methods")
    if simulated:
        parts.append("SIMULATED")
    return SEP.join(str(p) for p in parts if p)


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


#: top-level config keys that say where things go or how the console looks, not what is
#: computed (the run dir and the inputs are tags; ``hydra`` is Hydra's own;
#: ``original_cache``: where ``saleval-shortcut`` keeps the original model between runs)
_NOT_PARAMS = ("hydra", "paths", "run_dir", "task_name", "progress", "original_cache")


#: the params that say what a run is about (:func:`run_name`'s parts)
IDENTITY = ("dataset", "model", "methods", "method")


#: config groups that name a thing whose name is a param of its own (:data:`IDENTITY`):
#: of such a group only the keys that make two runs of one name differ are params (how
#: the data is read and described stays in the run's ``config.yaml``). The ``method``
#: group is the ``methods`` param; each method's settings are params of its child run
#: (:func:`method_settings`), where methods are compared
_COMPARED: dict[str, tuple[str, ...]] = {
    "dataset": ("files", "split_fractions", "seed", "max_train", "max_validation", "max_test"),
    "method": (),
}


#: per stage, the config groups it composes but reads only in part: the keys it reads
#: (``saleval-explain`` reads only where it runs, on how many devices: not how to train)
_PARAMS_USED: dict[str, dict[str, tuple[str, ...]]] = {
    "explain": {"trainer": ("accelerator", "devices", "num_nodes", "strategy")},
}


#: the key naming the code that builds a config node: the group's name already says it
_TARGET = "_target_"


def stage_params(stage: str, resolved: Mapping[str, Any], uri: str) -> dict[str, Any]:
    """The params of a stage run: what a researcher compares across runs of the stage,
    as dotted override paths, with the tracking URI actually used.

    That is the config groups the stage uses, less where things go (:data:`_NOT_PARAMS`),
    the keys of a group the stage does not read (:data:`_PARAMS_USED`), ``_target_``, the
    ``name`` of a dataset or model (the ``dataset`` and ``model`` params) and, of a group
    with a name (dataset, method), whatever does not tell two runs of one name apart
    (:data:`_COMPARED`). The full config is the run's ``config.yaml``.

    >>> stage_params("explain", {"seed": 1, "paths": {"root_dir": "/x"},
    ...     "trainer": {"accelerator": "cpu", "optimizer": {"lr": 0.1}},
    ...     "dataset": {"_target_": "read", "name": "sst2", "max_test": 64},
    ...     "model": {"_target_": "x.Source", "name": "tiny", "max_length": 64},
    ...     "method": {"lime": {"num_samples": 20}},
    ...     "tracking": {"uri": "sqlite:///a.db"}}, "file:/b")
    {'seed': 1, 'trainer.accelerator': 'cpu', 'dataset.max_test': 64, 'model.max_length': 64, \
'tracking.uri': 'file:/b'}
    """
    used = {**_COMPARED, **_PARAMS_USED.get(stage, {})}
    out: dict[str, Any] = {}
    for key, value in resolved.items():
        if key in _NOT_PARAMS or (key in IDENTITY and not isinstance(value, Mapping)):
            continue  # an unset dataset/model group: the param of that name says it
        if isinstance(value, Mapping) and key in used:
            value = {k: v for k, v in value.items() if k in used[key]}
        elif isinstance(value, Mapping) and key in IDENTITY:  # `model.name` is `model`
            value = {k: v for k, v in value.items() if k != "name"}
        if isinstance(value, Mapping) and not value:
            continue
        if key == "tracking" and isinstance(value, Mapping):
            value = {**value, "uri": uri}
        out[key] = value
    return {k: v for k, v in flatten(out).items() if k.rpartition(".")[2] != _TARGET}


def method_settings(group: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each method's settings as the params of its child run: ``method.<key>`` (the
    override ``method.<name>.<key>`` less the name, so every child has the same keys for
    the same kind of setting), found under the config key and under an explicit ``name``
    (the name the attributions table uses).

    >>> method_settings({"lime_20": {"_target_": "x.Lime", "num_samples": 20},
    ...                  "occ": {"name": "occlusion", "window": {"size": 1}}, "random": "random"})
    {'lime_20': {'method.num_samples': 20}, 'occ': {'method.window.size': 1}, \
'occlusion': {'method.window.size': 1}}
    """
    out: dict[str, dict[str, Any]] = {}
    for key, node in (group or {}).items():
        if not isinstance(node, Mapping):
            continue  # a registry name: no settings
        flat = flatten({k: v for k, v in node.items() if k not in (_TARGET, "name")}, METHOD + ".")
        out[str(key)] = flat
        if node.get("name"):
            out[str(node["name"])] = flat
    return out


def override_params(overrides: Sequence[str]) -> dict[str, str]:
    """A ``-m`` job's overrides as params: what a sweep varies sits in the runs table and
    the parallel-coordinates plot even where the stage logs that setting elsewhere (a
    method's settings go to its child run). Where-things-go keys (:data:`_NOT_PARAMS`,
    ``inputs``, ``tracking``) and deletions (``~key``) are left out.

    >>> override_params(["method.lime.num_samples=300", "+experiment=variants_ig",
    ...                  "~trainer.logger", "paths.output_root=/tmp/x", "seed=1"])
    {'method.lime.num_samples': '300', 'experiment': 'variants_ig', 'seed': '1'}
    """
    out: dict[str, str] = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.lstrip("+")
        top = key.split(".", 1)[0]
        if sep and not key.startswith("~") and top not in (*_NOT_PARAMS, "inputs", "tracking"):
            out[key] = value
    return out


def metric_key(name: str) -> str:
    """The one key style: letters, digits and ``_`` (anything else becomes ``_``).

    >>> metric_key("seconds.lime"), metric_key("aopc_most/k10"), metric_key("n_forward")
    ('seconds_lime', 'aopc_most_k10', 'n_forward')
    """
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def metric_at_k(metric: str, k: Any = None) -> str:
    """The key of a metric at k words (or a fraction of them), the same in every stage:
    ``<metric>_k<k>``; no k: the metric's own name (grid average or single-valued).
    ``comparison``'s column labels ``<metric>@<k>`` map to the same keys.

    >>> metric_at_k("comprehensiveness", "10"), metric_at_k("aopc_most", pd.NA)
    ('comprehensiveness_k10', 'aopc_most')
    >>> metric_at_k("sufficiency@0.2")
    'sufficiency_k0_2'
    """
    if (k is None or pd.isna(k) or str(k) == "") and "@" in metric:
        metric, k = metric.split("@", 1)
    if k is None or pd.isna(k) or str(k) == "":
        return metric_key(metric)
    return metric_key(f"{metric}_k{k}")


def param_key(name: str) -> str:
    """A param key MLflow accepts, whatever a config key holds (label names become keys
    under ``dataset.label_descriptions``: ``&``, ``(``, ``'``, ``?``, HTML...).

    MLflow keys allow ASCII letters, digits, ``_-./`` and spaces; a key with anything
    else has it replaced by ``_`` and gets a short hash of the original, so two labels
    that differ only there stay two params.

    >>> param_key("dataset.label_descriptions.Sci/Tech")
    'dataset.label_descriptions.Sci/Tech'
    >>> param_key("dataset.label_descriptions.R&D (new)?")
    'dataset.label_descriptions.R_D _new__-c931b83f'
    """
    clean = "".join(c if (c.isascii() and c.isalnum()) or c in "_-./ " else "_" for c in name)
    if clean == name and len(name) <= _MAX_KEY_LEN:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "backslashreplace")).hexdigest()[:8]
    return f"{clean[: _MAX_KEY_LEN - 9]}-{digest}"


_MAX_KEY_LEN = 250
