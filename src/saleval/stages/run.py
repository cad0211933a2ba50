"""``saleval-run``: the whole study with one command (what ``make run`` calls).

train → explain → tasks → simulate → import → score, and metrics → compare, each
stage its own MLflow run nested under one parent run. A profile
(``conf/profile/*.yaml``) gives every stage its overrides; every stage's config is
composed with them before the first stage runs (:func:`check_profile`), so a typo in a
profile fails at once, naming the stage and the key. Stages chain through
``inputs.<name>=<run dir>`` exactly as a user would chain them by hand.

Resumable: before running a stage its fingerprint (config + parents'
fingerprints, see :func:`saleval.pipeline.records.fingerprints.stage_fingerprint`) is looked up among
finished runs in the MLflow store; a match whose run dir still exists is reused.

Reads no run unless given one per stage (``+inputs.<stage>=<run dir>``); writes one run dir
per stage under its own run dir, and ``pipeline.json`` (the stages' runs and wall times).

Main options: ``profile`` (default, paper, smoke), ``profile.stages_to_run``, ``reuse``.

Example::

    saleval-run profile=smoke
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import paths
from saleval.analysis.validation import published_ranking_agreement
from saleval.config.keys import check_keys
from saleval.errors import UserError
from saleval.pipeline import stage_table, views
from saleval.pipeline.compose import compose_root, register_configs, stage_overrides
from saleval.pipeline.records import dead_runs, run_naming, run_outputs
from saleval.pipeline.records.fingerprints import stage_fingerprint
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.records.run_inputs import resolve_input
from saleval.pipeline.records.run_record import RunRecord
from saleval.pipeline.tracker import tracking, tracking_health, tracking_journal

log = logging.getLogger(__name__)

#: (stage, module, config name, {input name: producing stage}), in the order they run:
#: the stage table's rows marked ``in_pipeline``
PIPELINE: list[tuple[str, str, str, dict[str, str]]] = [
    (row.name, row.module, row.name, dict(row.inputs)) for row in stage_table.pipeline()
]


def compose_stage(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose a stage's root config as its console script would."""
    register_configs(overrides, config_name)  # a metrics plugin's settings compose
    cfg = compose_root(config_name, overrides)
    check_keys(cfg)  # a profile's `+key=` is refused as on the command line
    return cfg


class ProfileError(UserError, ValueError):
    """A profile's overrides do not compose for some stage (named in the message)."""


def _error_chain(err: BaseException) -> str:
    """Hydra's error and its causes in one line: the cause names the bad key."""
    parts: list[str] = []
    e: BaseException | None = err
    while e is not None and len(parts) < 4:
        text = " ".join(str(e).split())
        if text and text not in parts:
            parts.append(text)
        e = e.__cause__ or e.__context__
    return ": ".join(parts)


def check_profile(profile: DictConfig, selected: list[str]) -> None:
    """Compose every selected stage's config with the profile's overrides (inputs as
    placeholders) before any stage runs, so a typo fails in seconds, naming the stage
    and the key, instead of after the stages before it ran."""
    known = [s for s, *_ in PIPELINE]
    for where, names in (("stages", list(profile.stages)), ("stages_to_run", selected)):
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ProfileError(
                f"profile {profile.name}: {where} names unknown stages {unknown}; "
                f"the stages are {known}"
            )
    for stage, _, config_name, needs in PIPELINE:
        if stage not in selected:
            continue
        placeholders = [f"inputs.{name}=pending-{producer}-run" for name, producer in needs.items()]
        try:
            compose_stage(config_name, stage_overrides(profile, stage) + placeholders)
        except Exception as err:
            raise ProfileError(
                f"profile {profile.name}, stage {stage}: its config does not compose: "
                f"{_error_chain(err)}"
            ) from err


def find_reusable(stage: str, fp: str) -> Path | None:
    """A finished run of ``stage`` with fingerprint ``fp`` whose run dir still exists."""
    client = MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    if not exps:
        return None
    runs = client.search_runs(
        exps,
        filter_string=f"tags.stage = '{stage}' and tags.fingerprint = '{fp}' "
        "and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=10,
    )
    for r in runs:
        d = r.data.tags.get("run_dir")
        if d and RunRecord.exists(d) and RunRecord.read(d).finished:
            return Path(d)
    return None


def run(cfg: DictConfig) -> dict[str, Any]:
    profile = cfg.profile
    selected = list(profile.stages_to_run or [s for s, *_ in PIPELINE])
    check_profile(profile, selected)
    out_root = Path(str(cfg.run_dir)) if cfg.run_dir else _hydra_dir()
    uri = tracking.tracking_uri(cfg.tracking.uri)
    experiment = f"saleval/{profile.dataset}"
    tracking_health.check_store(uri, cfg.tracking.wait_s, experiment)  # before any work
    out_root.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, Path] = {}
    timings: dict[str, dict[str, Any]] = {}

    simulated = "simulate" in selected
    what = ["run", str(profile.name), str(profile.dataset), str(profile.model)]
    tags = {
        "stage": "run",
        "profile": str(profile.name),
        "dataset": str(profile.dataset),
        "model": str(profile.model),
        "run_dir": str(out_root),
        "simulated": "true" if simulated else "false",
        **dead_runs.process_tags(),
    }
    name = run_naming.SEP.join(what + (["SIMULATED"] if simulated else []))
    experiment_id, journal = _start_parent(cfg, uri, experiment, name, tags, out_root)
    status = "FAILED"
    try:
        tracking.log_params(
            {
                "dataset": str(profile.dataset),
                "model": str(profile.model),
                "profile": OmegaConf.to_container(profile, resolve=True),
            }
        )
        _run_stages(cfg, selected, dirs, timings, out_root)
        summary: dict[str, Any] = {
            "parent_run_id": journal.target.run_id,
            "stages": timings,
            "tracking_uri": uri,
            "profile": str(profile.name),
        }
        if "score" in dirs:
            agreement = published_ranking_agreement(dirs["score"])
            if agreement is not None:
                summary["published_ranking"] = agreement
                if agreement["spearman"] is not None:
                    tracking.log_metrics({"published_spearman": agreement["spearman"]})
        if journal.lost is not None:  # the store back after an outage: send what it missed
            tracking.recover(journal, cfg.tracking.wait_s)
        summary["tracking"] = journal.record()
        write_json(out_root / "pipeline.json", summary)
        tracking.log_files([out_root / "pipeline.json"])
        status = "FINISHED"
    except BaseException as err:
        # stopped from outside (Ctrl-C, scancel's SIGTERM) is KILLED, as a stage's run is
        status = "FAILED" if isinstance(err, Exception) else "KILLED"
        cause = tracking_health.store_failure(err)
        if isinstance(err, tracking_health.TrackingError):
            cause = "a stage could not start its run"
        if journal.lost is None and cause is not None:
            journal.lost = cause  # the store is down: do not wait minutes to end this run
        raise
    finally:
        tracking.end_run(journal, status)
        if status == "FINISHED" and summary["tracking"] != journal.record():
            summary["tracking"] = journal.record()
            write_json(out_root / "pipeline.json", summary)
    _final_report(dirs, timings, uri, experiment_id, summary.get("published_ranking"))
    if not journal.record()["logged"]:
        print(run_outputs.not_logged_line("run", out_root, journal.record()), flush=True)
    return summary


def _start_parent(
    cfg: DictConfig, uri: str, experiment: str, name: str, tags: dict[str, str], out_root: Path
) -> tuple[str, tracking_journal.Journal]:
    """The pipeline's parent run, after what every stage does when it starts (runs left
    by dead processes ended, orphans marked); a store that refuses is one line."""
    try:
        experiment_id = tracking.setup(uri, experiment, cfg.tracking.artifact_root)
        mark_orphans_killed(out_root)
        dead_runs.end_dead_runs()  # what every stage does when it starts (saleval.pipeline.stage)
        return experiment_id, tracking.start_run(out_root, uri, experiment, name, tags)
    except Exception as err:
        line = tracking_health.start_message(err, uri, experiment)
        if line is None:
            raise
        raise tracking_health.TrackingError(line) from err


def _run_stages(
    cfg: DictConfig,
    selected: list[str],
    dirs: dict[str, Path],
    timings: dict[str, dict[str, Any]],
    out_root: Path,
) -> None:
    """Each selected stage in pipeline order: a given run (``inputs.<stage>``) is used
    as it is, else the stage runs or a finished run of it is reused."""
    for stage, module, config_name, needs in PIPELINE:
        if stage not in selected:
            continue
        given = dict(cfg.inputs)
        if given.get(stage):  # this stage's run is given: use it instead of running it
            dirs[stage] = resolve_input(stage, given[stage], paths.output_root(cfg))
            timings[stage] = {"seconds": 0.0, "reused": True, "run_dir": str(dirs[stage])}
            tracking.set_tags({f"given.{stage}": RunRecord.read(dirs[stage]).run_id or ""})
            print(f"[saleval-run] {stage:<9} given  {dirs[stage]}", flush=True)
            continue
        t0 = time.perf_counter()
        dirs[stage], reused = _run_or_reuse(cfg, stage, module, config_name, needs, dirs, out_root)
        seconds = time.perf_counter() - t0
        timings[stage] = {
            "seconds": round(seconds, 1),
            "reused": reused is not None,
            "run_dir": str(dirs[stage]),
        }
        tracking.log_metrics({f"seconds_{stage}": seconds})
        print(
            f"[saleval-run] {stage:<9} {'reused' if reused else 'ran':<6} "
            f"{seconds:8.1f} s  {dirs[stage]}",
            flush=True,
        )


def _input_overrides(
    stage: str,
    needs: dict[str, str],
    given: dict[str, Any],
    dirs: dict[str, Path],
    output_root: Path,
) -> list[str]:
    """``inputs.<name>=`` for each input of ``stage``: a run given for it
    (``inputs.<stage>.<name>`` or ``inputs.<producer>``; a plain file such as a platform's
    answers.csv as it is), else the producer's run in this pipeline."""
    out = []
    for name, producer in needs.items():
        src = given.get(f"{stage}.{name}") or given.get(producer)
        if src and Path(str(src)).is_file():
            out.append(f"inputs.{name}={Path(str(src)).resolve()}")
        elif src:
            out.append(f"inputs.{name}={resolve_input(name, src, output_root)}")
        elif producer in dirs:
            out.append(f"inputs.{name}={dirs[producer]}")
        else:
            raise ValueError(
                f"stage {stage} needs inputs.{name} from {producer}, which did "
                f"not run; pass inputs.{producer}=<run dir>"
            )
    return out


def _run_or_reuse(
    cfg: DictConfig,
    stage: str,
    module: str,
    config_name: str,
    needs: dict[str, str],
    dirs: dict[str, Path],
    out_root: Path,
) -> tuple[Path, Path | None]:
    """Run ``stage`` under the pipeline's run, or reuse a finished run with the same
    fingerprint (``reuse``); returns its run dir and the reused run (None when it ran)."""
    overrides = stage_overrides(cfg.profile, stage)
    overrides += _input_overrides(stage, needs, dict(cfg.inputs), dirs, paths.output_root(cfg))
    stage_dir = out_root / stage
    overrides.append(f"run_dir={stage_dir}")
    stage_cfg = compose_stage(config_name, overrides)
    input_dirs = {
        k: Path(str(v))
        for k, v in (stage_cfg.get("inputs") or {}).items()
        if isinstance(v, str) and Path(v).is_dir()
    }
    fp = stage_fingerprint(stage_cfg, stage, input_dirs)
    try:
        reused = find_reusable(stage, fp) if cfg.reuse else None
    except Exception as err:  # the store went away between two stages: one line
        line = tracking_health.failure_message(err, mlflow.get_tracking_uri())
        if line is None:
            raise
        raise tracking_health.TrackingError(f"before stage {stage}: {line}") from err
    if reused is not None:
        log.info("[run] %s: reusing %s (fingerprint %s)", stage, reused, fp)
        tracking.set_tags({f"reused.{stage}": RunRecord.read(reused).run_id or ""})
        return reused, reused
    log.info("[run] %s: running (fingerprint %s) -> %s", stage, fp, stage_dir)
    fn: Callable[[DictConfig], Any] = importlib.import_module(module).run
    with open_dict(stage_cfg):
        stage_cfg.tracking = cfg.tracking
    fn(stage_cfg)
    return stage_dir, None


def mark_orphans_killed(out_root: Path) -> list[str]:
    """End as KILLED the MLflow runs a killed pipeline left RUNNING in ``out_root``.

    A ``kill -9`` leaves no chance to end a run, so its pipeline run and the stage run
    it was in stay RUNNING for ever. A resume in the same run dir is the first moment
    that knows they are dead (two pipelines never share a run dir), whichever host ran
    them; they are ended by :func:`saleval.pipeline.records.dead_runs.mark_killed` (the same as runs
    whose process is gone, :func:`saleval.pipeline.records.dead_runs.end_dead_runs`) and their ids
    returned.
    """
    root = out_root.resolve()
    client = MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    if not exps:
        return []
    orphans = [
        r
        for r in client.search_runs(exps, filter_string="attributes.status = 'RUNNING'")
        if (d := r.data.tags.get("run_dir"))
        and (Path(d).resolve() == root or root in Path(d).resolve().parents)
    ]
    return dead_runs.mark_killed(client, orphans, "of an earlier, killed pipeline in this run dir")


def _hydra_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def _final_report(
    dirs: Mapping[str, Path],
    timings: Mapping[str, Mapping[str, Any]],
    uri: str,
    experiment_id: str | None = None,
    published: Mapping[str, Any] | None = None,
) -> None:
    total = sum(float(t["seconds"]) for t in timings.values())
    print("\n== saleval-run: wall time per stage ==")
    for stage, t in timings.items():
        print(f"  {stage:<9} {t['seconds']:>8.1f} s{'  (reused)' if t['reused'] else ''}")
    print(f"  {'total':<9} {total:>8.1f} s")
    if "compare" in dirs and (dirs["compare"] / "comparison.md").is_file():
        print("\n== human (crowd) vs automated metrics ==")
        print((dirs["compare"] / "comparison.md").read_text())
    elif "score" in dirs and (dirs["score"] / "scores.md").is_file():
        print((dirs["score"] / "scores.md").read_text())
    if "simulate" in dirs:
        print(
            "NOTE: the human scores above come from the SIMULATED crowd (saleval-simulate), "
            "not from people. See README, 'Real crowd answers', to swap in people's answers."
        )
    if published is not None:
        rho = published["spearman"]
        print(
            "Method ranking vs the original study's real crowd on the same samples: Spearman "
            f"{'n/a' if rho is None else f'{rho:.2f}'} over {len(published['methods'])} methods"
            + (" (our side SIMULATED)" if "simulate" in dirs else "")
        )
    # each stage's methods are rows of its child runs (docs/tracking.md)
    # the compare stage's saved view: its methods as rows, human score and metrics as columns
    view = None
    if "compare" in dirs:
        view = RunRecord.read(dirs["compare"]).mlflow_view
    print(f"\nOpen the comparison:\n  {views.ui_hint(uri, experiment_id, view)}\n")
