"""What a stage run leaves on disk and prints, apart from its tables (docs/architecture.md,
section 2): ``run.json``, the ``latest`` link, the sweep it belongs to, and the summary with
the next steps. :class:`saleval.pipeline.stage.Stage` calls these with what it knows; each is a
plain function of its arguments, so a test or another tool can call it without a run.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from saleval.pipeline import run_checks, stage_table, views
from saleval.pipeline.input_paths import LATEST, latest_link
from saleval.pipeline.provenance import Provenance
from saleval.pipeline.run_checks import RUN_JSON
from saleval.pipeline.run_inputs import PRODUCERS, RunInputs


def run_dir_of(cfg: DictConfig) -> Path:
    """``cfg.run_dir`` when given (tests, ``saleval-run``), else Hydra's run dir."""
    explicit = cfg.get("run_dir")
    if explicit:
        return Path(str(explicit))
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    raise ValueError("no run dir: set run_dir=<path> when calling a stage outside Hydra")


def write_run_json(
    run_dir: Path,
    stage: str,
    run_id: str | None,
    fingerprint: str,
    parents: RunInputs,
    provenance: Provenance,
    view: str | None = None,
    **extra: Any,
) -> None:
    """``run.json``: what the run is (its parents, provenance, fingerprint), where it is
    tracked, which machine and process ran it (the jobs of a parallel multirun or a
    cluster differ) and ``extra`` (status, seconds, error, the checksums of its tables:
    :mod:`saleval.pipeline.run_checks`; what its tracking store took:
    :mod:`saleval.pipeline.tracking_journal`). Written whole or not at all
    (:func:`~saleval.pipeline.run_checks.write_atomically`)."""
    import mlflow

    info = {
        "stage": stage,
        "run_id": run_id,
        "tracking_uri": mlflow.get_tracking_uri(),
        "fingerprint": fingerprint,
        "parents": {k: v.get("run_id") for k, v in parents.infos.items()},
        "parent_dirs": {k: str(p) for k, p in parents.runs.items()},
        "simulated": "true" if provenance.simulated else "false",
        "provenance": provenance.to_json(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **({"mlflow_view": view} if view else {}),
        **{k: v for k, v in extra.items() if v is not None},
    }
    run_checks.write_atomically(run_dir / RUN_JSON, json.dumps(info, indent=2))


def not_logged_line(stage: str, run_dir: Path, record: Mapping[str, Any]) -> str:
    """The line a finished run prints when its tracking store missed part of it.

    >>> print(not_logged_line("explain", Path("/o/e"), {"lost": "connection refused",
    ...                       "not_logged": ["file attributions.parquet", "end (FINISHED)"]}))
    [saleval-explain] not all logged: the tracking store failed (connection refused); the run dir is complete and its run.json lists what MLflow lacks (file attributions.parquet, end (FINISHED)): once the store answers, saleval-catch-up /o/e
    """
    missed = ", ".join(record.get("not_logged") or [])
    return (
        f"[saleval-{stage}] not all logged: the tracking store failed ({record.get('lost')}); "
        f"the run dir is complete and its run.json lists what MLflow lacks ({missed}): "
        f"once the store answers, saleval-catch-up {run_dir}"
    )


def link_latest(output_root: str | None, stage: str, run_dir: Path) -> None:
    """Point ``<output root>/<stage>/latest`` at ``run_dir``, when it lies there (a run dir
    elsewhere, in tests or ``run_dir=...``, is not "the latest" of ``outputs/``)."""
    if output_root is None:
        return
    link = latest_link(output_root, stage)
    if link.parent.resolve() not in run_dir.parents:
        return
    tmp = link.with_name(f".{LATEST}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir, target_is_directory=True)
    os.replace(tmp, link)  # atomic: a reader never sees no link


def summary(
    stage: str,
    run_dir: Path,
    run_id: str | None,
    known: Mapping[str, str],
    experiment_id: str | None = None,
    view: str | None = None,
    sweep: str | None = None,
) -> str:
    """Where the run went and the command(s) that take it further, paths filled in
    (``known``: ``run``, and the run's inputs by name; an unknown one becomes ``latest``)."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    lines = [f"[saleval-{stage}] finished: {run_dir}", f"  MLflow run {run_id} in {uri}"]
    if experiment_id is not None:
        lines.append(f"  open: {views.ui_hint(uri, experiment_id, view)}")
    for template in stage_table.next_steps(stage):
        command = template
        for key in ("run", "model", "tasks"):
            command = command.replace("{" + key + "}", known.get(key, LATEST))
        lines.append(f"  next: {command}")
    names = [n for n, s in PRODUCERS.items() if s == stage]
    if sweep and names:  # a -m job: the whole sweep can be the next stage's input
        lines.append(f"  sweep: all its jobs as one input: inputs.{names[0]}={sweep}")
    return "\n".join(lines)


def _multirun() -> Any:
    """Hydra's config of this ``-m`` job (None outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get()


def sweep_overrides() -> list[str]:
    """The overrides of this ``-m`` job ([] outside a multirun)."""
    hc = _multirun()
    return [] if hc is None else list(hc.overrides.task)


def sweep_tags() -> dict[str, str]:
    """Group the jobs of one ``-m`` multirun: same sweep dir, job number, overrides."""
    hc = _multirun()
    if hc is None:
        return {}
    return {
        "sweep": str(hc.sweep.dir),
        "sweep.job": str(hc.job.num),
        "sweep.overrides": ",".join(hc.overrides.task)[:5000],
    }
