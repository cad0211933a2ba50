"""``saleval-plan``: how many samples, methods, k values and workers a crowd study needs,
and what it costs, before anyone is paid (docs/planning.md).

From the published crowd (real people)::

    saleval-plan crowd=lu2024 crowd.path=<data root>/published/lu2024/IMDB.csv dataset=lu2024_imdb

The simulated crowd on the same published tasks (to set beside the empirical plan)::

    saleval-plan crowd=lu2024 crowd.path=... dataset=lu2024_imdb plan.source=simulated

The simulated crowd on your own explanations::

    saleval-plan inputs.explain=<explain run dir | runs:/id | latest>

Writes ``plan.csv``, ``plan_methods.csv``, ``power.png``, ``plan.md`` and, from the
published crowd, ``half_sample_check.csv``. Main options: ``plan.n``, ``plan.repeats``,
``plan.methods``, ``plan.ks``, ``plan.target.*``, ``plan.cost.*``, ``inputs.answers``.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis import costing, plan_report, planning
from saleval.analysis.validation import calibration_differences, validated_name
from saleval.config.crowd import SimulationConfig, StudyConfig
from saleval.config.plan import PlanConfig, PlanSource
from saleval.crowd.importing.published_study import reader_training_data, study_bundles
from saleval.crowd.importing.source import (
    Capability,
    CrowdSource,
    ImportContext,
    SourceFile,
    crowd_source,
    source_run,
)
from saleval.crowd.simulation.workers import expected_seconds, simulate_crowd
from saleval.modeling.data import load_dataset
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.run_inputs import given_input
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking
from saleval.progress import bar
from saleval.schema import to_schema


def run(cfg: DictConfig) -> dict[str, Any]:
    pc = to_schema(PlanConfig, cfg.plan)
    costing.Costing(1.0, pc.cost.hourly_rate, pc.cost.fee, pc.cost.currency)  # fail early
    crowd_node = OmegaConf.select(cfg, "crowd")
    source = None if crowd_node is None else crowd_source(crowd_node)
    explain = given_input(cfg, "explain")
    if source is not None and not (
        source.provides(Capability.verdicts) or source.provides(Capability.tasks)
    ):
        raise InputError(
            f"saleval-plan takes crowd=lu2024 (a published crowd) or inputs.explain=<run>; "
            f"crowd={source.name} answers go through saleval-import and saleval-score"
        )
    if (source is None) == (explain is None):
        raise InputError(
            "saleval-plan needs exactly one source: crowd=lu2024 crowd.path=<published file> "
            "dataset=<name> (the published crowd), or inputs.explain=<explain run> (a "
            "simulated crowd on your own explanations)"
        )
    kind = (
        PlanSource(pc.source)
        if pc.source
        else (PlanSource.empirical if source is not None else PlanSource.simulated)
    )
    if explain is not None and kind == PlanSource.empirical:
        raise InputError(
            "plan.source=empirical needs real answers: crowd=lu2024 crowd.path=<published "
            "file>; an explain run has none, so its plan rests on the simulated crowd"
        )
    simulated = kind == PlanSource.simulated
    tags = {"plan_source": str(kind)}
    if source is not None:
        needs = Capability.tasks if simulated else Capability.verdicts
        if not source.provides(needs):
            raise InputError(f"plan.source={kind}: crowd={source.name} does not provide {needs}")
        with source_run(cfg, "plan", source, tags, simulated) as (st, file):
            pool = _source_pool(st, cfg, pc, source, file, kind)
            return _plan(st, cfg, pc, pool)
    with Stage(cfg, "plan", {"explain": explain}, tags, requires=["dataset"], simulated=True) as st:
        pool = _explain_pool(st, cfg, pc)
        return _plan(st, cfg, pc, pool)


def _source_pool(
    st: Stage,
    cfg: DictConfig,
    pc: PlanConfig,
    source: CrowdSource,
    file: SourceFile,
    kind: PlanSource,
) -> planning.Pool:
    """The pool of a crowd source: its verdicts (``plan.source=empirical``), or a simulated
    crowd on the tasks its crowd answered."""
    labels = [str(n) for n in cfg.dataset.label_names]
    ctx = ImportContext(file, dict(st.inputs), labels, str(cfg.dataset.name))
    origin = f"`{file.path}` (sha256 {file.sha256[:12]}…)"
    if kind == PlanSource.empirical:
        imported = source.import_(ctx)
        return planning.empirical_pool(
            imported.aggregated,
            int(cfg.published.repeats),
            f"the published crowd's majority verdicts, {origin}",
        )
    study = source.tasks(ctx)
    splits = [str(s) for s in cfg.published.reader_splits]
    train, _ = reader_training_data(load_dataset(cfg.dataset), splits, study.samples["text"])
    sim = to_schema(SimulationConfig, cfg.simulation)
    bundles = study_bundles(study, pc.pool_repeats, int(cfg.published.bundle_size), int(sim.seed))
    crowd = simulate_crowd(study.tasks, bundles, train, labels, sim)
    return planning.simulated_pool(
        study.tasks,
        crowd.answers,
        labels,
        f"the SIMULATED crowd on the published tasks of {origin}",
    )


def _explain_pool(st: Stage, cfg: DictConfig, pc: PlanConfig) -> planning.Pool:
    from saleval.crowd.design import build_study  # transformers-free, but heavy

    preds = st.inputs.read(tables.PREDICTIONS, "explain")
    attrs = st.inputs.read(tables.ATTRIBUTIONS, "explain")
    labels = [str(n) for n in cfg.dataset.label_names]
    ks = sorted({int(k) for k in cfg.kgrid.ks} | {int(k) for g in pc.ks or [] for k in g})
    longest = int(attrs.groupby("sample_id")["word_index"].max().max()) + 1
    for a, grid in enumerate(pc.ks or []):
        for k in grid:
            if int(k) > longest:
                raise planning.PlanError(
                    f"plan.ks[{a}]: k = {k} exceeds every explained text (the longest has "
                    f"{longest} words), so its tasks would show whole texts; use k <= {longest}"
                )
    # the pool's own bundles only decide which simulated worker answers what (B = N, as
    # the main study); a design's bundle size enters its cost
    study = dataclasses.replace(
        to_schema(StudyConfig, cfg.study), repeats=pc.pool_repeats, bundle_size=None
    )
    design = build_study(preds, attrs, labels, study, ks, where=str(st.inputs["explain"]))
    sim = to_schema(SimulationConfig, cfg.simulation)
    split = str(sim.reader.get("split", "train"))
    crowd = simulate_crowd(
        design.tasks, design.bundles, load_dataset(cfg.dataset)[split], labels, sim
    )
    return planning.simulated_pool(
        design.tasks,
        crowd.answers,
        labels,
        f"the SIMULATED crowd on the explain run `{st.inputs['explain']}`",
    )


def designs(pool: planning.Pool, pc: PlanConfig) -> list[planning.Design]:
    """Every combination of the grid, checked against the pool (one located line each)."""
    if not pc.n:
        raise planning.PlanError("plan.n: empty; give the sample sizes to plan, e.g. [20, 50, 100]")
    method_sets = pc.methods if pc.methods is not None else [pool.methods]
    k_sets = pc.ks if pc.ks is not None else [pool.ks]
    repeats = pc.repeats if pc.repeats is not None else [pool.repeats]
    out = []
    for (a, ms), (b, ks), (c, r), (d, n) in itertools.product(
        enumerate(method_sets), enumerate(k_sets), enumerate(repeats), enumerate(pc.n)
    ):
        design = planning.Design(
            int(n),
            tuple(str(m) for m in ms),
            tuple(sorted(int(k) for k in ks)),
            int(r),
            int(pc.bundle_size),
        )
        where = {
            "methods": f"plan.methods[{a}]" if pc.methods is not None else "plan.methods",
            "ks": f"plan.ks[{b}]" if pc.ks is not None else "plan.ks",
            "repeats": f"plan.repeats[{c}]" if pc.repeats is not None else "plan.repeats",
            "n": f"plan.n[{d}]",
            "bundle_size": "plan.bundle_size",
        }
        pool.check(design, where)
        out.append(design)
    return out


def task_seconds(cfg: DictConfig, pc: PlanConfig) -> tuple[Any, str]:
    """Seconds per answer: ``plan.cost.seconds_per_task``, else the median of
    ``inputs.answers``, else the simulated crowd's timing model at the design's mean k
    (a function of the design). Returns it and where it came from."""
    if pc.cost.seconds_per_task is not None:
        return float(pc.cost.seconds_per_task), "plan.cost.seconds_per_task"
    spec = given_input(cfg, "answers")
    if spec is not None:
        path = Path(spec)
        path = tables.ANSWERS.path(path) if path.is_dir() else path
        if not path.is_file():
            raise InputError(
                f"inputs.answers: {spec} is neither an answers file nor a run dir holding {tables.ANSWERS.filename}"
            )
        answers = pd.read_csv(path)
        if "duration_s" not in answers:
            start = pd.to_datetime(answers["started_at"], utc=True, format="ISO8601")
            end = pd.to_datetime(answers["submitted_at"], utc=True, format="ISO8601")
            answers["duration_s"] = (end - start).dt.total_seconds()
        seconds = pd.to_numeric(answers["duration_s"], errors="coerce").dropna()
        seconds = seconds[seconds > 0]
        if seconds.empty:
            raise InputError(
                f"{path}: field duration_s: no positive answer time; give plan.cost.seconds_per_task"
            )
        kind = (
            "simulated "
            if str(answers.get("simulated", pd.Series([False])).iloc[0]).lower() == "true"
            else ""
        )
        return float(seconds.median()), f"median of {len(seconds):,} {kind}answer times in `{path}`"
    sim = to_schema(SimulationConfig, cfg.simulation)

    def model(design: planning.Design) -> float:
        return expected_seconds(sim.timing, float(np.mean(design.ks)))

    return model, (
        "the simulated crowd's timing model at each design's mean k, not a measurement; "
        "pass inputs.answers=<a pilot's answers.csv> or plan.cost.seconds_per_task"
    )


def discrepancy(cfg: DictConfig, pc: PlanConfig) -> tuple[planning.Discrepancy | None, str]:
    """The simulated crowd's measured error for a simulated pool (``simulation.discrepancy``),
    and the line plan.md says of it; none where ``plan.discrepancy=false`` or no residuals
    were measured.

    A dataset whose own crowd was validated (``lu2024_imdb`` and ``imdb`` are IMDB) uses
    its own residuals; any other dataset the residuals of every validated dataset
    (docs/planning.md#discrepancy)."""
    sim = to_schema(SimulationConfig, cfg.simulation)
    node = sim.discrepancy
    if not pc.discrepancy:
        return None, (
            "none (plan.discrepancy=false): the simulated crowd is taken at its word, so "
            "P(best), Spearman and the intervals leave out its measured error"
        )
    if node is None or not any(e for fits in node.residuals.values() for e in fits.values()):
        return None, (
            "none: this simulation has no measured residuals (simulation.discrepancy), so "
            "P(best), Spearman and the intervals leave out the simulated crowd's own error"
        )
    dataset = str(cfg.dataset.name)
    measured = [k for k, fits in node.residuals.items() if any(fits.values())]
    own = validated_name(measured, dataset)
    found = planning.Discrepancy.from_config(node.residuals, node.source, own)
    differs = calibration_differences(dataclasses.asdict(sim)) if sim.validated else []
    caveat = (
        f"; they were measured for the validated settings and this run's differ "
        f"({'; '.join(differs)}), so they may understate its error"
        if differs
        else ""
    )
    which = (
        f"{dataset}'s own residuals: its crowd was validated, so the errors measured on "
        f"{own} ({', '.join(node.residuals[own])}) are the ones that apply"
        if own
        else f"the residuals of every validated dataset ({', '.join(measured)}), pooled: "
        f"{dataset} has no validated crowd of its own"
    )
    return found, (
        f"per drawn study, each method's score moved up or down at random by the size of "
        f"a measured residual (simulated minus real s_j) — half the time one of that "
        f"method's own, else any — and judged against the simulated ranking; {which} "
        f"({len(found.pooled)} in all, RMS {found.rms:.1f} points; Kennedy & O'Hagan "
        f"2001): {found.source} (docs/simulated-crowd.md#out-of-sample){caveat}"
    )


def _plan(st: Stage, cfg: DictConfig, pc: PlanConfig, pool: planning.Pool) -> dict[str, Any]:
    note = ""
    if pool.source == "simulated":
        pool.discrepancy, note = discrepancy(cfg, pc)
        tracking.log_params(
            {
                "plan.discrepancy_rms": pool.discrepancy.rms if pool.discrepancy else 0.0,
                "plan.discrepancy_residuals": (
                    ("own: " + pool.discrepancy.own) if pool.discrepancy.own else "pooled"
                )
                if pool.discrepancy
                else "none",
            }
        )
    grid = designs(pool, pc)
    seconds, seconds_source = task_seconds(cfg, pc)
    settings = planning.Settings(
        replicates=pc.replicates,
        power_replicates=pc.power_replicates,
        test_resamples=pc.test_resamples,
        alpha=pc.alpha,
        level=pc.level,
        baseline=pc.baseline,
    )
    rng = np.random.default_rng(pc.seed)
    table, methods = _predict_designs(pool, pc, grid, seconds, settings, rng)
    st.write(tables.PLAN, table)
    st.write(tables.PLAN_METHODS, methods)
    recommended = costing.cheapest(table, pc.target.p_best, pc.target.spearman)
    check = None
    if pool.source == "empirical" and pc.half_sample_check:
        check = planning.half_sample_check(pool, grid[0], settings, rng)
        st.write(tables.PLAN_CHECK, check)
    simulated = pool.source == "simulated"
    caption = f"{cfg.dataset.name}: what a study of n samples would show"
    st.log_file(
        plan_report.plot_power_curves(table, methods, st.path("power.png"), caption, simulated)
    )
    shown_seconds = seconds(grid[0]) if callable(seconds) else seconds
    info = _assumptions(pool, pc, shown_seconds, seconds_source) | {"discrepancy": note}
    md = st.path("plan.md")
    md.write_text(plan_report.plan_markdown(table, methods, recommended, info, check))
    st.log_file(md)
    out: dict[str, Any] = {
        "run_dir": str(st.run_dir),
        "run_id": st.tracking.run_id,
        "source": pool.source,
        "designs": len(table),
    }
    out.update(_log_plan(st, table, recommended))
    print(f"[saleval-plan] {'SIMULATED crowd: ' if simulated else ''}{md}")
    return out


def _predict_designs(
    pool: planning.Pool,
    pc: PlanConfig,
    grid: list[planning.Design],
    seconds: Any,
    settings: planning.Settings,
    rng: np.random.Generator,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each design's predictions and cost (plan.csv, with ``meets_target``) and its
    per-method figures (plan_methods.csv)."""
    rows, per_method = [], []
    for i, d in enumerate(bar(grid, desc="designs", leave=False, disable=None)):
        row, pm = planning.predict(pool, d, settings, rng)
        secs = seconds(d) if callable(seconds) else seconds
        rule = costing.Costing(secs, pc.cost.hourly_rate, pc.cost.fee, pc.cost.currency)
        rows.append(
            {
                "design": i + 1,
                "source": pool.source,
                "n": d.n,
                "repeats": d.repeats,
                "n_methods": len(d.methods),
                "n_ks": len(d.ks),
                "methods": ",".join(d.methods),
                "ks": ",".join(map(str, d.ks)),
                **rule.of(d),
                **row,
            }
        )
        per_method.append(pm.assign(design=i + 1))
    table = pd.DataFrame(rows)
    table["meets_target"] = (table["p_best"] >= pc.target.p_best) & (
        table["spearman_mean"] >= pc.target.spearman
    )
    return table, pd.concat(per_method, ignore_index=True)


def _assumptions(
    pool: planning.Pool, pc: PlanConfig, seconds: float, seconds_source: str
) -> dict[str, object]:
    """What the predictions rest on, as plan.md states it."""
    return {
        "source": pool.source,
        "origin": pool.origin,
        "n_pool": pool.n_samples,
        "methods": pool.methods,
        "ks": pool.ks,
        "pool_repeats": pool.repeats,
        "target_p_best": pc.target.p_best,
        "target_spearman": pc.target.spearman,
        "seconds": seconds,
        "seconds_source": seconds_source,
        "hourly_rate": pc.cost.hourly_rate,
        "fee": pc.cost.fee,
        "currency": pc.cost.currency,
        "baseline": pc.baseline,
        "alpha": pc.alpha,
        "power_replicates": pc.power_replicates,
        "test_resamples": pc.test_resamples,
        "replicates": pc.replicates,
    }


def _log_plan(st: Stage, table: pd.DataFrame, recommended: pd.Series | None) -> dict[str, float]:
    """MLflow: the first design family's figures stepped by n, the recommendation, and one
    child run per design (so the printed link opens the designs side by side); returns
    the recommendation's figures."""
    first = table[
        (table["methods"] == table["methods"].iloc[0])
        & (table["ks"] == table["ks"].iloc[0])
        & (table["repeats"] == table["repeats"].iloc[0])
    ]
    for r in first.itertuples():
        st.log_metrics(
            {"p_best": r.p_best, "spearman": r.spearman_mean, "ci_width": r.ci_width_mean},
            step=int(r.n),
        )
    best: dict[str, float] = {}
    if recommended is not None:
        best = {
            f"recommended_{k}": float(recommended[k])
            for k in ("n", "repeats", "cost", "p_best", "spearman_mean")
        }
        st.log_metrics(best)
    rows = table.assign(
        design=[
            f"{r.design}: n={r.n} R={r.repeats} J={r.n_methods} K={r.n_ks}"
            for r in table.itertuples()
        ]
    )
    keep = [
        "design",
        "cost",
        "p_best",
        "spearman_mean",
        "ci_width_mean",
        "power_min",
        "n",
        "repeats",
        "worker_minutes",
    ]
    st.tracking.log_method_rows(rows[keep], key="design", order_by="cost", ascending=True)
    st.tracking.set_tags(
        {"plan_recommended": "none" if recommended is None else str(int(recommended["design"]))}
    )
    return best
