"""What a stage run leaves on disk and prints besides its tables and its record
(docs/architecture.md, section 2): where its run dir is, the ``latest`` link, the sweep it
belongs to, and the summary with the next steps. :class:`saleval.pipeline.stage.Stage` calls
these with what it knows; each is a plain function of its arguments, so a test or another
tool can call it without a run. The record itself, ``run.json``, is
:class:`saleval.pipeline.records.run_record.RunRecord`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from saleval.pipeline import stage_table, views
from saleval.pipeline.records.input_paths import LATEST, latest_link


def run_dir_of(cfg: DictConfig) -> Path:
    """``cfg.run_dir`` when given (tests, ``saleval-run``), else Hydra's run dir."""
    explicit = cfg.get("run_dir")
    if explicit:
        return Path(str(explicit))
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    raise ValueError("no run dir: set run_dir=<path> when calling a stage outside Hydra")


def remove_stub(
    where: Path, root: str | Path | None = None, own: tuple[str, ...] = (".hydra", "*.log")
) -> bool:
    """Remove ``where`` when it holds nothing but what Hydra wrote before the job started
    (``own``: its ``.hydra/`` and the job's log; a sweep dir's ``multirun.yaml``), so a run
    refused before any work leaves no stub dir behind, nor the empty dirs above it inside
    ``root`` (the output root: ``<stage>/<day>/``). A dir holding anything else (a
    ``run.json``, a table, another job) is kept. Returns whether it was removed.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp()); d = root / "explain" / "2026-12-07" / "10-00-00"
    >>> (d / ".hydra").mkdir(parents=True); (d / "explain.log").touch()
    >>> remove_stub(d, root), list(root.iterdir())
    (True, [])
    """
    import fnmatch
    import shutil

    if not where.is_dir():
        return False
    if any(not any(fnmatch.fnmatch(p.name, pat) for pat in own) for p in where.iterdir()):
        return False
    shutil.rmtree(where, ignore_errors=True)
    if root is not None:
        top = Path(root).resolve()
        for parent in where.resolve().parents:
            if parent == top or top not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()
    return not where.exists()


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


def link_latest(output_root: str | Path, stage: str, run_dir: Path) -> None:
    """Point ``<output root>/<stage>/latest`` at ``run_dir``, when it lies there (a run dir
    elsewhere, in tests or ``run_dir=...``, is not "the latest" of ``outputs/``)."""
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
    names = [n for n, s in stage_table.producers().items() if s == stage]
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
