"""How the runs look in the MLflow UI: links to an experiment's runs and saved views (docs/tracking.md#views).

A saved view ("Views" menu of the runs page) is an experiment tag
``mlflow.sharedViewState.<key>`` holding ``{name, createdAt, updatedAt, state}``, opened
by the page parameter ``viewStateShareKey=<key>``; ``state`` is the page's JSON (filter,
sort, columns). The score, metrics, compare and explain stages save one per stage run
over its per-method child runs (:func:`save_view`), so the link a finished run prints
opens on one row per method.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
from mlflow.tracking import MlflowClient

from saleval.pipeline.records.run_naming import METHOD, metric_key
from saleval.pipeline.tracker.tracking import is_local
from saleval.pipeline.tracker.tracking_journal import Target, applies, send
from saleval.pipeline.tracker.tracking_reads import children_filter


def ui_url(uri: str, experiment_id: str, view: str | None = None) -> str:
    """Where the experiment's runs table opens in the MLflow UI; with ``view`` (a key of
    :func:`save_view`), opened on that saved view: its filter, sort and columns.

    MLflow 3's UI opens an experiment on its GenAI pages unless the page's
    ``workflowType`` says machine learning (the sidebar switch; remembered by the
    browser once chosen), so the link sets it. A local store is served by
    ``mlflow ui`` on the address it takes from ``MLFLOW_HOST`` and ``MLFLOW_PORT`` (MLflow's
    own variables; 127.0.0.1:5000 without them), :func:`local_ui`.

    >>> ui_url("http://mlflow.lab:5000/", "3")
    'http://mlflow.lab:5000/#/experiments/3/runs?workflowType=machine_learning'
    >>> ui_url("sqlite:///x.db", "3", view="saleval-abc")
    'http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=saleval-abc'
    """
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else local_ui()
    url = f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    return url + (f"&{VIEW_PARAM}={view}" if view else "")


def local_ui() -> str:
    """Where ``mlflow ui`` serves a local store: the host and port it reads from
    ``MLFLOW_HOST`` and ``MLFLOW_PORT`` (a host of all interfaces is opened on the loopback).

    >>> import os; os.environ["MLFLOW_PORT"] = "5050"; local_ui()
    'http://127.0.0.1:5050'
    >>> del os.environ["MLFLOW_PORT"]
    """
    host = os.environ.get("MLFLOW_HOST") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    return f"http://{host}:{os.environ.get('MLFLOW_PORT') or 5000}"


def ui_hint(uri: str, experiment_id: str | None, view: str | None = None) -> str:
    """How to open the runs: the ``mlflow ui`` command for a local store (on the port the
    link names), then the link; a server's runs open on the server itself."""
    lines = []
    if is_local(uri):
        port = local_ui().rsplit(":", 1)[1]
        lines.append(f"mlflow ui --backend-store-uri {uri} --port {port}")
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
        "searchFilter": children_filter(parent_run_id),
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


def save_run_view(
    run_name: str, columns: Sequence[str], order_by: str | None = None, ascending: bool = False
) -> str | None:
    """:func:`save_view` of the active run's child runs, through its journal
    (:mod:`saleval.pipeline.tracker.tracking_journal`): a run caught up later, or moved to another
    store, gets its view there. None when the store did not take it."""
    op = {
        "op": "view",
        "run_name": run_name,
        "columns": list(columns),
        "order_by": order_by,
        "ascending": ascending,
    }
    key = send(op)
    return None if key is None else str(key)


@applies("view")
def _send_view(op: dict[str, Any], target: Target) -> str:
    import mlflow

    run = mlflow.active_run()
    assert run is not None
    return save_view(
        run.info.experiment_id, run.info.run_id, str(op["run_name"]), op["columns"],
        order_by=op.get("order_by"), ascending=bool(op.get("ascending")),
    )  # fmt: skip
