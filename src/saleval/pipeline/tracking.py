"""MLflow conventions shared by every stage (the user's view: ``docs/tracking.md``).

* Store: ``tracking.uri`` from config (default ``sqlite:///<root>/outputs/mlflow.db``);
  ``MLFLOW_TRACKING_URI`` in the environment wins so a lab can point every stage
  at its tracking server without touching configs. The URI actually used is what
  the run's ``tracking.uri`` param and ``run.json`` record.
* One experiment per dataset (``saleval/<dataset>``), tagged as a machine-learning
  experiment (:data:`EXPERIMENT_KIND`) so the UI lists its runs side by side.
* Run names say what ran (:func:`run_name`): ``explain · ag_news · minilm · 9 methods``.
* Tags on every stage run: ``stage``, ``dataset``, ``model``, ``parent.<input>`` = the
  run id of each input run, ``run_dir``, ``fingerprint``, ``host``, ``pid`` and
  ``pid_start`` (:func:`process_tags`) and ``simulated`` where it applies; jobs of a ``-m`` multirun add ``sweep``, ``sweep.job`` and
  ``sweep.overrides``. Inside ``saleval-run`` each stage is a nested child of the
  pipeline's parent run. Params: ``dataset``, ``model``, ``methods`` and what runs are
  compared by in the config groups the stage uses (:func:`stage_params`), as dotted
  override paths; a method's settings are params of its child run (:func:`method_settings`).
* Metric keys are snake_case words joined by ``_`` (no ``/``, no ``.``;
  :func:`metric_key` enforces it). Per-method numbers never go into a key: the score,
  metrics, compare and explain stages log one nested child run per method
  (:func:`log_method_rows`, tag and param ``method``) whose keys are the same for
  every method, so the runs table and the compare view put methods in rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from saleval.scaleout import slurm_state

try:
    import fcntl
except ImportError:  # Windows: no multirun store lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_MAX_PARAM_LEN = 6000
_BATCH = 100

#: The experiment tag MLflow 3's UI reads to tell a machine-learning experiment from a
#: GenAI one (``mlflow.experimentKind``); newer UIs decide by the ``workflowType`` of
#: the page instead, which :func:`ui_url` sets.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
#: the tag (and param) that marks a per-method child run
METHOD = "method"
#: separator of the parts of a run name
SEP = " · "


def tracking_uri(configured: str | None) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if not configured:
        raise ValueError("tracking.uri is empty and MLFLOW_TRACKING_URI is not set")
    return configured


def _is_local(uri: str) -> bool:
    return uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock next to a SQLite store while MLflow opens it and the experiment.

    MLflow creates the tables of a new SQLite file when a process first opens it, without
    a lock across processes (``SqlAlchemyStore.__init__``): two jobs of a joblib multirun
    starting on a fresh store race, and one fails ("duplicate column name"). Later writes
    are safe: MLflow sets SQLite's ``busy_timeout`` (20 s) on every session. Other stores
    need no lock.
    """
    if fcntl is None or not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    with open(db.with_name(db.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def setup(uri: str | None, experiment: str, artifact_root: str | None = None) -> str:
    """Point MLflow at the store, make the experiment exist and active; returns its id.

    The experiment is tagged :data:`EXPERIMENT_KIND` (once), so the UI treats it as a
    machine-learning experiment whose page is its runs, not the GenAI traces.
    """
    uri = tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    with _store_lock(uri):
        client = MlflowClient()
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            experiment_id = exp.experiment_id
        else:
            location = None
            if artifact_root and _is_local(uri):
                location = Path(artifact_root, experiment.replace("/", "_")).resolve().as_uri()
            try:
                experiment_id = client.create_experiment(experiment, artifact_location=location)
            except mlflow.exceptions.MlflowException:  # created concurrently by a sibling job
                exp = client.get_experiment_by_name(experiment)
                assert exp is not None
                experiment_id = exp.experiment_id
        key, kind = EXPERIMENT_KIND
        if exp is None or exp.tags.get(key) != kind:
            client.set_experiment_tag(experiment_id, key, kind)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def ui_url(uri: str, experiment_id: str, view: str | None = None) -> str:
    """Where the experiment's runs table opens in the MLflow UI; with ``view`` (a key of
    :func:`save_view`), opened on that saved view: its filter, sort and columns.

    MLflow 3's UI opens an experiment on its GenAI pages unless the page's
    ``workflowType`` says machine learning (the sidebar switch; remembered by the
    browser once chosen), so the link sets it. A local store is served by
    ``mlflow ui`` on its default address.

    >>> ui_url("http://mlflow.lab:5000/", "3")
    'http://mlflow.lab:5000/#/experiments/3/runs?workflowType=machine_learning'
    >>> ui_url("sqlite:///x.db", "3", view="saleval-abc")
    'http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=saleval-abc'
    """
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    url = f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    return url + (f"&{VIEW_PARAM}={view}" if view else "")


def ui_hint(uri: str, experiment_id: str | None, view: str | None = None) -> str:
    """How to open the runs: the ``mlflow ui`` command for a local store, then the link."""
    lines = []
    if _is_local(uri):
        lines.append(f"mlflow ui --backend-store-uri {uri}")
    if experiment_id is not None:
        lines.append(ui_url(uri, experiment_id, view))
    return "\n  ".join(lines)


#: MLflow's saved views ("Views" menu of the runs page; docs/tracking.md#views): an
#: experiment tag ``mlflow.sharedViewState.<key>`` holding ``{name, createdAt, updatedAt,
#: state}``, opened by the page parameter ``viewStateShareKey=<key>``. ``state`` is the
#: page's JSON (filter, sort, columns); MLflow also reads it uncompressed.
VIEW_TAG = "mlflow.sharedViewState."
VIEW_PARAM = "viewStateShareKey"
VIEW_KEY = "saleval-"  # the views saleval writes; others are the user's and are never touched
MAX_VIEWS = 30  # saleval's own views kept per experiment (MLflow's UI saves at most 40)


def rows_view_columns(rows: pd.DataFrame, key: str = METHOD) -> list[str]:
    """The numeric columns of per-method (or per-``key``) rows, as a saved view shows
    them: ``human_score`` first where there is one (it is what a study ranks methods by).

    >>> rows_view_columns(pd.DataFrame({"method": ["a"], "aopc": [0.1], "human_score": [3.0]}))
    ['human_score', 'aopc']
    """
    columns = [c for c in rows.columns if c != key and pd.api.types.is_numeric_dtype(rows[c])]
    return sorted(columns, key=lambda c: c != "human_score")


def save_view(
    experiment_id: str,
    parent_run_id: str,
    name: str,
    columns: Sequence[str],
    order_by: str | None = None,
    ascending: bool = False,
) -> str:
    """A saved view of ``parent_run_id``'s child runs (e.g. one row per method) with the
    metric ``columns`` shown, sorted by the metric ``order_by``; returns the
    key for :func:`ui_url`. saleval's oldest views beyond :data:`MAX_VIEWS` are deleted."""
    client = MlflowClient()
    key = f"{VIEW_KEY}{parent_run_id}"
    shown = [f"metrics.`{metric_key(c)}`" for c in columns]
    state = {
        "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
        "orderByKey": f"metrics.`{metric_key(order_by)}`" if order_by else "attributes.start_time",
        "orderByAsc": ascending,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": shown,
        # the given columns first, right after the run's name (MLflow lists metrics A-Z)
        "columnOrder": ["attributes.`Run Name`", *shown],
        "columnWidths": {},
        "runsHiddenMode": "FIRST_10_RUNS",
        "viewMaximized": False,
        "runListHidden": False,
        "isAccordionReordered": False,
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "groupBy": None,
        "groupsExpanded": {},
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
    }
    now = int(time.time() * 1000)
    envelope = {"name": name[:200], "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    client.set_experiment_tag(experiment_id, VIEW_TAG + key, json.dumps(envelope))
    ours = []
    for tag, value in client.get_experiment(experiment_id).tags.items():
        if tag.startswith(VIEW_TAG + VIEW_KEY):
            try:
                ours.append((int(json.loads(value)["createdAt"]), tag))
            except (ValueError, KeyError, TypeError):
                continue
    for _, tag in sorted(ours)[:-MAX_VIEWS]:
        client.delete_experiment_tag(experiment_id, tag)
    return key


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
#: (``saleval-explain`` runs a predict-only Trainer: only where it runs, not how to train)
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


def log_params(params: Mapping[str, Any]) -> None:
    """Log (flattened) params in batches, truncating values MLflow would refuse."""
    items = [(param_key(k), str(v)[:_MAX_PARAM_LEN]) for k, v in flatten(params).items()]
    for i in range(0, len(items), _BATCH):
        mlflow.log_params(dict(items[i : i + _BATCH]))


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


def _finite(v: Any) -> bool:
    try:
        return v is not None and not isinstance(v, bool | str) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def log_metrics(metrics: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
    """Log values under :func:`metric_key` names (None is skipped; ``kwargs``: MLflow's
    ``model_id``/``dataset``, which link them to a logged model and a dataset)."""
    clean = {metric_key(k): float(v) for k, v in metrics.items() if v is not None}
    items = list(clean.items())
    for i in range(0, len(items), _BATCH):
        mlflow.log_metrics(dict(items[i : i + _BATCH]), step=step, **kwargs)


def log_files(paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir():
            mlflow.log_artifacts(str(p), artifact_path=(artifact_path or "") + p.name)
        elif p.is_file():
            mlflow.log_artifact(str(p), artifact_path=artifact_path)


def log_method_rows(
    rows: pd.DataFrame,
    stage: str,
    table: str | None = None,
    tags: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    key: str = METHOD,
) -> dict[str, str]:
    """One nested child run per method under the active (stage) run; returns their ids.

    ``rows``: one row per method, a ``method`` column and numeric columns, whose names
    become the metric keys (:func:`metric_key`), the same in every child so the UI puts
    methods in rows (an empty cell, e.g. the baseline's test against itself, is NaN).
    Each child is named ``<method> · <stage>`` and carries the tag and param ``method``,
    the tag ``stage``, ``tags`` (dataset, model, simulated...), ``params`` and its own
    ``settings[method]`` as params (:func:`method_settings`). ``table``: the rows also go
    to the stage run as an MLflow table (``tables/<table>.json``), shown in the UI's
    artifact view. ``key``: the column naming the rows when they are not methods (e.g.
    ``design`` for saleval-plan); it takes the place of ``method`` in names and tags.
    """
    parent = mlflow.active_run()
    if parent is None:
        return {}
    if rows[key].duplicated().any():
        dup = sorted(rows.loc[rows[key].duplicated(), key].astype(str))
        raise ValueError(f"log_method_rows({stage}): {key}s {dup} have more than one row")
    client = MlflowClient()
    experiment_id = parent.info.experiment_id
    values = rows.drop(columns=[key]).select_dtypes(include="number")
    now = int(time.time() * 1000)
    ids: dict[str, str] = {}
    for i, method in enumerate(rows[key].astype(str)):
        run_tags = {
            **(tags or {}),
            "stage": stage,
            key: method,
            "mlflow.parentRunId": parent.info.run_id,
        }
        child = client.create_run(experiment_id, tags=run_tags, run_name=f"{method}{SEP}{stage}")
        row = values.iloc[i]
        metrics = [
            Metric(metric_key(str(k)), float(v) if _finite(v) else math.nan, now, 0)
            for k, v in row.items()
        ]
        own = (settings or {}).get(method, {})
        run_params = [
            Param(param_key(k), str(v)[:_MAX_PARAM_LEN])
            for k, v in {**own, **(params or {}), key: method}.items()
        ]
        for j in range(0, max(len(metrics), 1), _BATCH):
            client.log_batch(
                child.info.run_id,
                metrics=metrics[j : j + _BATCH],
                params=run_params if j == 0 else (),
            )
        client.set_terminated(child.info.run_id)
        ids[method] = child.info.run_id
    if table:
        mlflow.log_table(rows.reset_index(drop=True), artifact_file=f"tables/{table}.json")
    return ids


def method_rows(run_id: str, client: MlflowClient | None = None) -> pd.DataFrame:
    """The per-method child runs of a stage run as a table: ``method``, ``run_id`` and a
    column per metric key (what :func:`log_method_rows` logged), one row per method."""
    client = client or MlflowClient()
    run = client.get_run(run_id)
    children = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
        max_results=10_000,
    )
    records = [
        {"method": c.data.tags[METHOD], "run_id": c.info.run_id, **c.data.metrics}
        for c in children
        if METHOD in c.data.tags
    ]
    if not records:
        return pd.DataFrame(columns=["method", "run_id"])
    return pd.DataFrame(records).sort_values("method").reset_index(drop=True)


def log_dataset(df: pd.DataFrame, name: str, context: str, targets: str | None = None) -> None:
    """The rows a run read (a dataset split, the explained samples) as a run input:
    name, digest, schema and size, not the rows themselves."""
    columns = [c for c in ("sample_id", "text", "label") if c in df.columns]
    from mlflow.data.pandas_dataset import from_pandas

    with warnings.catch_warnings():  # its hint that int columns cannot hold NaN: not ours
        warnings.filterwarnings("ignore", message=".*integer column", category=UserWarning)
        dataset = from_pandas(
            df[columns].reset_index(drop=True),
            name=name,
            targets=targets if targets in columns else None,
        )
        mlflow.log_input(dataset, context=context)  # the schema is inferred here


def _pinned(packages: Sequence[str]) -> list[str]:
    out = []
    for name in packages:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def log_hf_model(model: Any, tokenizer: Any, name: str = "model") -> str:
    """The classifier as an MLflow model (the ``transformers`` flavor: loads as a
    text-classification pipeline, or through ``mlflow.pyfunc``); returns its model id.

    The requirements are pinned from the installed packages, which spares MLflow
    inferring them by loading the model again in a subprocess.
    """
    flavor_log = logging.getLogger("mlflow.transformers")
    level = flavor_log.level
    flavor_log.setLevel(logging.ERROR)  # offline it warns that no hub model card was found
    try:
        with warnings.catch_warnings():  # MLflow's own note on its internal type hints
            warnings.filterwarnings("ignore", message=".*Any type hint", category=UserWarning)
            info = mlflow.transformers.log_model(
                transformers_model={"model": model, "tokenizer": tokenizer},
                name=name,
                task="text-classification",
                pip_requirements=_pinned(["torch", "transformers", "tokenizers"]),
            )
    finally:
        flavor_log.setLevel(level)
    mlflow.set_tag("model_uri", info.model_uri)
    return str(info.model_id)


def download_run(run_id: str, target: Path) -> None:
    """A run's artifacts into ``target``; a train run's logged MLflow model (tag
    ``model_uri``) becomes ``target/model`` as ``save_pretrained`` lays it out."""
    mlflow.artifacts.download_artifacts(run_id=run_id, dst_path=str(target))
    uri = MlflowClient().get_run(run_id).data.tags.get("model_uri")
    if not uri or Path(target, "model", "config.json").is_file():
        return
    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=str(target / "_mlflow_model")
        )
    )
    out = target / "model"
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("model", "components/tokenizer"):
        if (local / sub).is_dir():
            shutil.copytree(local / sub, out, dirs_exist_ok=True)
    shutil.rmtree(target / "_mlflow_model", ignore_errors=True)


def find_runs(experiment: str, filter_string: str) -> list[Any]:
    """Runs of ``experiment`` matching an MLflow search filter, newest first."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    if exp is None:
        return []
    return MlflowClient().search_runs(
        [exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"]
    )


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


# -- runs whose process died -----------------------------------------------------------
def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of
    ``/proc/<pid>/stat``); None where there is no such process or no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rpartition(")")[2].split()  # the name in (...) may hold spaces
    return fields[19] if len(fields) > 19 else None


def process_tags() -> dict[str, str]:
    """``host``, ``pid`` and ``pid_start`` of this process, tagged on every run it starts
    so that a later run on the same host can tell whether it is still alive
    (:func:`end_dead_runs`); ``pid_start`` tells a reused pid from the original."""
    return {
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
        "pid_start": _process_start(os.getpid()) or "",
        **slurm_state.job_tags(),  # in a SLURM job: its id, so any node can tell it ended
    }


def process_alive(pid: int, started: str | None = None) -> bool:
    """Is the process that tagged a run ``pid`` / ``started`` still running here?

    With ``/proc`` (Linux): the pid must exist and, when ``started`` is known, have
    started at that time (a new process that got the same pid is not the run's).
    Without it: whether a signal could be sent to ``pid``.
    """
    if pid <= 0:
        return False
    if Path("/proc/self/stat").is_file():
        now = _process_start(pid)
        return now is not None and (not started or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def killed_when_stopped() -> Iterator[None]:
    """End the active run as KILLED when the block is stopped from outside (Ctrl-C, a
    SIGTERM turned into :class:`saleval.errors.Stopped`), as a stage run is; MLflow's own
    ``with start_run()`` would say FAILED."""
    try:
        yield
    except BaseException as err:
        if not isinstance(err, Exception) and mlflow.active_run() is not None:
            mlflow.end_run(status="KILLED")
        raise


def mark_killed(client: MlflowClient, runs: Sequence[Any], why: str) -> list[str]:
    """End ``runs`` (RUNNING MLflow runs whose process is known dead) as KILLED, now,
    and say so in one warning line naming each; their ``run.json`` says KILLED too.
    Returns their ids. The one way saleval ends a dead run (:func:`end_dead_runs`,
    ``saleval-run``'s resume)."""
    ids = []
    for r in runs:
        client.set_terminated(r.info.run_id, status="KILLED")
        ids.append(r.info.run_id)
        run_json = Path(r.data.tags.get("run_dir") or "/nonexistent", "run.json")
        try:
            info = json.loads(run_json.read_text())
        except (OSError, ValueError):
            continue
        if info.get("run_id") == r.info.run_id and info.get("status") == "RUNNING":
            run_json.write_text(json.dumps({**info, "status": "KILLED"}, indent=2))
    if ids:
        named = ", ".join(
            f"{r.info.run_name or r.data.tags.get('stage', '?')} ({r.info.run_id}"
            + (f", pid {r.data.tags['pid']}" if r.data.tags.get("pid") else "")
            + ")"
            for r in runs
        )
        log.warning("%d run(s) %s marked KILLED: %s", len(ids), why, named)
    return ids


def end_dead_runs(client: MlflowClient | None = None) -> list[str]:
    """Mark KILLED every RUNNING run of the store that this host started and whose
    process is gone (``kill -9``, a crash, a reboot): found by the tags of
    :func:`process_tags`. Runs of other hosts are left alone (their processes cannot
    be seen from here), and so are runs without a ``pid`` tag. Every stage calls this
    when it starts (docs/tracking.md#runs-that-die)."""
    client = client or MlflowClient()
    host = socket.gethostname().replace("'", "")
    try:
        exps = [e.experiment_id for e in client.search_experiments()]
        if not exps:
            return []
        running = client.search_runs(
            exps,
            filter_string=f"attributes.status = 'RUNNING' and tags.host = '{host}'",
            max_results=10_000,
        )
    except mlflow.exceptions.MlflowException as err:  # a store that refuses the search
        log.warning("could not look for runs whose process died: %s", err)
        return []
    dead = [
        r
        for r in running
        if (r.data.tags.get("pid") or "").isdigit()
        and not process_alive(int(r.data.tags["pid"]), r.data.tags.get("pid_start"))
    ]
    return _end_ended_slurm_jobs(client, exps) + mark_killed(
        client, dead, "whose process on this host is gone"
    )


def _end_ended_slurm_jobs(client: MlflowClient, exps: list[str]) -> list[str]:
    """Mark KILLED the RUNNING runs whose SLURM job is over (cancelled, preempted, timed
    out, killed with its node), from whichever node ran them: ``squeue`` sees every job of
    its cluster. Only runs of the cluster this machine's client talks to count (a store
    shared by two clusters); where there is no SLURM client, nothing is done."""
    if not slurm_state.available():
        return []
    try:
        running = client.search_runs(
            exps,
            filter_string="attributes.status = 'RUNNING' and tags.slurm_job_id LIKE '%'",
            max_results=10_000,
        )
    except mlflow.exceptions.MlflowException as err:
        log.warning("could not look for runs whose SLURM job ended: %s", err)
        return []
    if not running:
        return []
    here = slurm_state.cluster_name()
    mine = [r for r in running if here is None or r.data.tags.get("slurm_cluster") in ("", here)]
    states = slurm_state.job_states(r.data.tags["slurm_job_id"] for r in mine)
    ended = [
        r
        for r in mine
        if states.get(r.data.tags["slurm_job_id"], "RUNNING") not in slurm_state.ACTIVE
    ]
    why = (
        "whose SLURM job is over ("
        + ", ".join(
            sorted(
                {
                    f"{r.data.tags['slurm_job_id']} {states[r.data.tags['slurm_job_id']]}"
                    for r in ended
                }
            )
        )
        + ")"
    )
    return mark_killed(client, ended, why)
