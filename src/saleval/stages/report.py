"""``saleval-report``: many score, metrics and compare runs gathered into one table.

Takes ``inputs.runs`` (run dirs, ``runs:/<id>``, ``-m`` sweep dirs, ``saleval-run`` dirs,
or a list of them) and/or an MLflow search (``search.experiments`` and a filter string,
through ``MlflowClient.search_runs``), and gathers every score, metrics and compare run
they name, across datasets, models and variants, into one table: a row per dataset ×
model × variant × method with the human score and each automated metric, each ranked
within its dataset and model (``report.rank_within``), and the Spearman/Kendall
agreement of each metric's ranking with the human one per dataset and model
(:func:`saleval.analysis.comparison.rank_agreement`). A variant is what a run's sweep overrides
say beyond the dataset and model (``docs/sweeps.md``).

Reads the runs' tables (``comparison.csv``, ``scores.csv``, ``metrics.csv``), never their
MLflow metric keys. Writes ``report.csv``, ``report_correlations.csv``,
``report_runs.csv``, ``report.md``, ``rank_heatmap.png`` and ``correlation_heatmap.png``.

Main options: ``inputs.runs``, ``search.experiments``, ``search.filter``,
``report.rank_within``.

Example::

    saleval-report inputs.runs=outputs/run/multirun/<date_time>
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from saleval.analysis import comparison, metric_columns
from saleval.cli import hydra_main
from saleval.metrics.registry import import_plugins
from saleval.pipeline import merge, run_naming, tables
from saleval.pipeline.input_paths import InputError
from saleval.pipeline.provenance import Provenance
from saleval.pipeline.run_inputs import read_run_config, read_run_info, resolve_input
from saleval.pipeline.stage import Stage

log = logging.getLogger(__name__)


#: the stages whose tables a report gathers
GATHERED = ("compare", "score", "metrics")
#: the columns a row is identified by
ROW = ["dataset", "model", "variant", "method"]
HUMAN = "human_score"


class ReportError(ValueError):
    """The gathered runs cannot make one table (nothing gathered, one cell twice, ...)."""


@dataclass(frozen=True)
class Source:
    """One gathered run: where it is, what it is about, how it was varied."""

    run_dir: Path
    stage: str
    run_id: str
    dataset: str
    model: str
    simulated: bool
    overrides: tuple[str, ...]
    parent_dirs: tuple[Path, ...]


# -- finding runs ------------------------------------------------------------------


def _stage_runs(path: Path) -> list[Path]:
    """A ``saleval-run`` dir's compare run, or its score and metrics runs without one."""
    ran = [s for s in GATHERED if _has_stage(path, s)]
    chosen = ["compare"] if "compare" in ran else ran
    if not chosen:
        raise ReportError(f"{path}: this saleval-run ran no {', '.join(GATHERED)} stage")
    return [merge.pipeline_stage_dir(path, s) for s in chosen]


def _has_stage(pipeline_dir: Path, stage: str) -> bool:
    try:
        merge.pipeline_stage_dir(pipeline_dir, stage)
    except merge.MergeError:
        return False
    return True


def dirs_of(value: Any, output_root: str | Path | None = None) -> list[Path]:
    """Every run dir named by ``inputs.runs``: runs, ``runs:/<id>``, sweep dirs (their
    jobs), ``saleval-run`` dirs (their compare run, else their score and metrics runs)."""
    out: list[Path] = []
    for spec in merge.as_specs(value):
        path = Path(spec).expanduser()
        jobs = merge.sweep_jobs(path) if path.is_dir() and merge.is_sweep_dir(path) else [path]
        for job in jobs:
            if job.is_dir() and (job / merge.PIPELINE_JSON).is_file():
                out += _stage_runs(job)
            else:
                out.append(resolve_input("runs", str(job) if job != path else spec, output_root))
    return out


def search_dirs(experiments: Sequence[str], filter_string: str, max_results: int) -> list[Path]:
    """Finished score, metrics and compare runs of the named MLflow experiments matching
    ``filter_string``, as local run dirs (downloaded when they are not on this machine)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    ids = []
    for name in experiments:
        exp = client.get_experiment_by_name(str(name))
        if exp is None:
            known = [e.name for e in client.search_experiments()]
            raise InputError(f"search.experiments: no MLflow experiment {name!r}; known: {known}")
        ids.append(exp.experiment_id)
    where = "attributes.status = 'FINISHED'" + (f" and {filter_string}" if filter_string else "")
    runs = client.search_runs(ids, filter_string=where, max_results=int(max_results))
    out: list[Path] = []
    for r in runs:
        if r.data.tags.get("stage") not in GATHERED:
            continue
        if not r.data.tags.get("run_dir"):  # not a stage's own run
            if "method" not in r.data.tags:  # a per-method child run is expected; say others
                log.warning("search: run %s has no run_dir tag; skipped", r.info.run_id)
            continue
        out.append(resolve_input("runs", f"runs:/{r.info.run_id}"))
    return out


def sources_of(dirs: Sequence[Path]) -> list[Source]:
    """Each distinct run once; a score or metrics run that a gathered compare run already
    compares is left out (its values are in the comparison)."""
    unique = list(dict.fromkeys(d.resolve() for d in dirs))
    found: list[Source] = []
    for d in unique:
        info = read_run_info(d)
        stage = str(info.get("stage", ""))
        if stage not in GATHERED:
            raise ReportError(
                f"{d}: a {stage or 'unknown'} run; saleval-report gathers {', '.join(GATHERED)} runs"
            )
        prov = Provenance.of_run(d, info)
        found.append(
            Source(
                run_dir=d,
                stage=stage,
                run_id=str(info.get("run_id", "")),
                dataset=str(prov.dataset),
                model=str(prov.model),
                simulated=prov.simulated,
                overrides=tuple(merge.job_overrides(d) or ()),
                parent_dirs=tuple(
                    Path(p).resolve() for p in (info.get("parent_dirs") or {}).values()
                ),
            )
        )
    compared = {p for s in found if s.stage == "compare" for p in s.parent_dirs}
    kept = [s for s in found if not (s.stage != "compare" and s.run_dir in compared)]
    if not kept:
        raise ReportError("no score, metrics or compare run was gathered")
    return kept


def _named(overrides: Sequence[str]) -> list[str]:
    """A run that names its profile (``profile.name=...``) is labelled by that name, not
    by the per-stage override lists the name stands for (they run to hundreds of chars).

    >>> _named(["+experiment=preset_lu2024", "profile.name=zero", "profile.stages.explain=[...]"])
    ['+experiment=preset_lu2024', 'profile.name=zero']
    """
    if not any(o.startswith("profile.name=") for o in overrides):
        return list(overrides)
    return [o for o in overrides if not o.startswith("profile.stages.")]


def variants(sources: Sequence[Source]) -> dict[Path, str]:
    """Each run's variant: its sweep overrides beyond dataset, model, inputs and paths,
    less those every gathered run shares (``""`` when nothing sets it apart). A named
    profile stands for its stage lists unless that would give two variants one label."""
    own = {s.run_dir: merge.variant_overrides(s.overrides) for s in sources}

    def labels(of: dict[Path, list[str]]) -> dict[Path, str]:
        common = set.intersection(*(set(v) for v in of.values())) if of else set()
        return {d: " ".join(o for o in v if o not in common) for d, v in of.items()}

    full = labels(own)
    short = labels({d: _named(v) for d, v in own.items()})
    return short if len(set(short.values())) == len(set(full.values())) else full


# -- one long table of values --------------------------------------------------------


def _plugins(source: Source) -> list[str]:
    """The metrics modules a run (or the metrics runs it compares) registered."""
    dirs = [source.run_dir] if source.stage == "metrics" else list(source.parent_dirs)
    out: list[str] = []
    for d in dirs:
        if (d / "config.yaml").is_file():
            found = OmegaConf.select(read_run_config(d), "metrics.plugins", default=None)
            out += [str(m) for m in (found or [])]
    return out


def values_of(source: Source, columns: str | Sequence[str]) -> pd.DataFrame:
    """``method, column, value`` of one run: the human score and/or each metric column."""
    if source.stage == "compare":
        table = tables.COMPARISON.read(source.run_dir)
        known = metric_columns.metric_directions()
        cols = [HUMAN] + [
            c
            for c in table.columns
            if c not in tables.COMPARISON.columns
            and c not in tables.COMPARISON.optional
            and not c.endswith("_rank")
            and metric_columns.split_column(c)[0] in known
        ]
        long = table.melt(id_vars="method", value_vars=cols, var_name="column")
    elif source.stage == "score":
        scores = tables.SCORES.read(source.run_dir)
        long = pd.DataFrame({"method": scores["method"], "column": HUMAN, "value": scores["score"]})
    else:
        metrics = tables.METRICS.read(source.run_dir)
        cols = metric_columns.select_columns(metrics, columns)
        wide = metric_columns.wide_metrics(metrics, cols, ["method"])
        long = wide.reset_index().melt(id_vars="method", var_name="column")
    return long.assign(method=long["method"].astype(str), value=long["value"].astype(float))


def gather(sources: Sequence[Source], columns: str | Sequence[str] = "summary") -> pd.DataFrame:
    """Every value of every run: ``dataset, model, variant, method, column, value, run``.

    One cell given by two runs is an error naming both (give them different variants,
    or drop one)."""
    labels = variants(sources)
    frames = []
    for s in sources:
        import_plugins(_plugins(s))  # their metrics' directions are known here too
        frames.append(
            values_of(s, columns).assign(
                dataset=s.dataset,
                model=s.model,
                variant=labels[s.run_dir],
                run=str(s.run_dir),
                simulated=s.simulated,
            )
        )
    long = pd.concat(frames, ignore_index=True)
    cell = [*ROW, "column"]
    dup = long[long.duplicated(cell, keep=False)]
    if len(dup):
        first = dup.iloc[0]
        runs = dup.loc[(dup[cell] == first[cell]).all(axis=1), "run"].tolist()
        raise ReportError(
            f"{first['column']} of method {first['method']} on {first['dataset']}/"
            f"{first['model']} comes from both {runs[0]} and {runs[1]}: drop one, or run them "
            "as different variants (different sweep overrides)"
        )
    return long


# -- the table, ranks and correlations --------------------------------------------------


def report_table(long: pd.DataFrame, rank_within: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """One row per dataset × model × variant × method; ``<column>_rank`` within each group
    of ``rank_within`` (1 = best in the column's registered direction, ties share)."""
    wide = long.pivot_table(index=ROW, columns="column", values="value", aggfunc="first")
    metric_cols = [c for c in dict.fromkeys(long["column"]) if c != HUMAN]
    wide = wide.reindex(columns=[HUMAN, *metric_cols]).reset_index()
    extra = long.groupby(ROW).agg(
        simulated=("simulated", "any"), runs=("run", lambda r: ",".join(dict.fromkeys(r)))
    )
    wide = wide.merge(extra.reset_index(), on=ROW)
    out = wide[[*ROW, HUMAN]].copy()
    out["human_rank"] = pd.array([pd.NA] * len(out), dtype="Int64")
    for col in metric_cols:
        out[col] = wide[col]
        out[f"{col}_rank"] = pd.array([pd.NA] * len(out), dtype="Int64")
    for _, idx in out.groupby(list(rank_within)).groups.items():
        out.loc[idx, "human_rank"] = metric_columns.rank_methods(out.loc[idx, HUMAN], True)
        for col in metric_cols:
            higher = metric_columns.higher_is_better(col)
            out.loc[idx, f"{col}_rank"] = metric_columns.rank_methods(out.loc[idx, col], higher)
    out["simulated"], out["runs"] = wide["simulated"].to_numpy(), wide["runs"].to_numpy()
    out = out.sort_values([*rank_within, "human_rank", "method"], na_position="last")
    return out.reset_index(drop=True), metric_cols


def rank_correlations(
    table: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str]
) -> pd.DataFrame:
    """Spearman's ρ and Kendall's τ between the human and each metric's ranking, per group;
    a group without human scores (metrics-only runs) has nothing to correlate with."""
    rows = []
    for key, g in table.groupby(list(rank_within), sort=False):
        if not g[HUMAN].notna().any():
            continue
        group = dict(zip(rank_within, key if isinstance(key, tuple) else (key,)))
        for col in metric_cols:
            higher = metric_columns.higher_is_better(col)
            r = comparison.rank_agreement(g[HUMAN], g[col], higher)
            for stat in ("spearman", "kendall"):
                rows.append(
                    {**group, "metric": col, "statistic": stat, "value": r[stat],
                     "p_value": r[f"{stat}_p"], "n": r["n"], "higher_is_better": higher,
                     "simulated": bool(g["simulated"].any())}
                )  # fmt: skip
    out = pd.DataFrame(rows, columns=None if rows else list(tables.REPORT_CORRELATIONS.columns))
    for key in ("dataset", "model", "variant"):
        if key not in out.columns:
            out[key] = ""
    return out


# -- presentation ------------------------------------------------------------------------


def _cell(v: Any, r: Any) -> str:
    if pd.isna(v):
        return "–"
    shown = f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return shown + ("" if pd.isna(r) else f" ({int(r)})")


def markdown(
    table: pd.DataFrame, corr: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str]
) -> str:
    """Per group, the values with their ranks; then ρ per group and metric."""
    simulated = bool(table["simulated"].any())
    parts = ["# Human vs automated evaluation across runs", ""]
    if simulated:
        parts += ["Rows marked * come from a SIMULATED crowd, not from people.", ""]
    for key, g in table.groupby(list(rank_within), sort=False):
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        shown = pd.DataFrame({"method": g["method"] + np.where(g["simulated"], " *", "")})
        if g["variant"].astype(str).str.len().any():
            shown["variant"] = g["variant"].to_numpy()
        shown["human"] = [_cell(v, r) for v, r in zip(g[HUMAN], g["human_rank"])]
        for col in metric_cols:
            arrow = "↑" if metric_columns.higher_is_better(col) else "↓"
            shown[f"{col} {arrow}"] = [_cell(v, r) for v, r in zip(g[col], g[f"{col}_rank"])]
        parts += [f"## {name}", "", shown.to_markdown(index=False), ""]
    parts += ["Ranks in brackets, within each section (1 = best).", ""]
    rho = corr[corr["statistic"] == "spearman"]
    if len(rho):
        pivot = rho.pivot_table(
            index=list(rank_within), columns="metric", values="value", aggfunc="first"
        ).reindex(columns=list(metric_cols))
        parts += [
            "## Spearman ρ: each metric's ranking vs the human ranking",
            "",
            pivot.round(3).reset_index().to_markdown(index=False),
            "",
        ]
    else:
        parts += ["No human score in these runs (metrics only): no rank correlation.", ""]
    return "\n".join(parts).rstrip() + "\n"


def plot_rank_heatmap(
    table: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str], path: Path
) -> Path:
    """One panel per group: methods (rows) × human and metrics (columns), coloured by rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(table.groupby(list(rank_within), sort=False))
    cols = ["human_rank"] + [f"{c}_rank" for c in metric_cols]
    ncols = min(3, len(groups))
    nrows = int(np.ceil(len(groups) / ncols))
    width = 1.2 + 0.55 * len(cols)
    height = 1.4 + 0.3 * max(len(g) for _, g in groups)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax, (key, g) in zip(axes.flat, groups):
        ranks = g[cols].astype("float64").to_numpy()
        ax.imshow(np.ma.masked_invalid(ranks), cmap="viridis_r", aspect="auto")
        light = (np.nanmax(ranks) + 1) / 2 if np.isfinite(ranks).any() else 0.0
        for (i, j), v in np.ndenumerate(ranks):  # dark text on the light (good) ranks
            if not np.isnan(v):
                color = "k" if v <= light else "w"
                ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6, color=color)
        labels = [m + (f" [{v}]" if v else "") for m, v in zip(g["method"], g["variant"])]
        ax.set_yticks(range(len(g)), labels, fontsize=6)
        ax.set_xticks(
            range(len(cols)), ["human", *metric_cols], rotation=60, ha="right", fontsize=6
        )
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        ax.set_title(name + (" (SIMULATED crowd)" if g["simulated"].any() else ""), fontsize=8)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    fig.suptitle("Ranks within each group (1 = best)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_correlation_heatmap(
    corr: pd.DataFrame, metric_cols: Sequence[str], rank_within: Sequence[str], path: Path
) -> Path:
    """Groups (rows) × metrics (columns): Spearman ρ with the human ranking."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = corr[corr["statistic"] == "spearman"]
    pivot = rho.pivot_table(
        index=list(rank_within), columns="metric", values="value", aggfunc="first", dropna=False
    ).reindex(columns=list(metric_cols))
    values = pivot.to_numpy(float)
    fig, ax = plt.subplots(figsize=(1.5 + 0.6 * len(metric_cols), 1.2 + 0.4 * len(pivot)))
    im = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    rows = [" / ".join(map(str, k if isinstance(k, tuple) else (k,))) for k in pivot.index]
    ax.set_yticks(range(len(rows)), rows, fontsize=6)
    ax.set_xticks(range(len(metric_cols)), list(metric_cols), rotation=60, ha="right", fontsize=6)
    fig.colorbar(im, ax=ax).set_label("Spearman ρ", fontsize=7)
    simulated = " (SIMULATED crowd)" if bool(rho["simulated"].any()) else ""
    ax.set_title(f"Metric ranking vs human ranking{simulated}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# -- the stage ------------------------------------------------------------------------


def run(cfg: DictConfig) -> dict[str, Any]:
    rcfg, scfg = cfg.report, cfg.search
    runs = OmegaConf.select(cfg, "inputs.runs", default=None)
    experiments = [str(e) for e in (scfg.experiments or [])]
    if runs is None and not experiments:
        raise InputError(
            "saleval-report needs runs: inputs.runs=<run, sweep or saleval-run dir, or a list> "
            "and/or search.experiments=[<MLflow experiment>] (with search.filter)"
        )
    rank_within = [str(k) for k in rcfg.rank_within]
    bad = sorted(set(rank_within) - {"dataset", "model", "variant"})
    if bad or "dataset" not in rank_within:
        raise ValueError(
            f"report.rank_within={rank_within}: must hold dataset, and only dataset, model, variant"
        )
    columns: str | list[str] = (
        rcfg.columns if isinstance(rcfg.columns, str) else [str(c) for c in rcfg.columns]
    )
    root = OmegaConf.select(cfg, "paths.output_root", default=None)
    with Stage(cfg, "report") as st:
        dirs = [] if runs is None else dirs_of(runs, root)
        if experiments:
            dirs += search_dirs(experiments, str(scfg.filter or ""), int(scfg.max_results))
        sources = sources_of(dirs)
        long = gather(sources, columns)
        table, metric_cols = report_table(long, rank_within)
        corr = rank_correlations(table, metric_cols, rank_within)
        labels = variants(sources)
        listing = pd.DataFrame(
            {
                "run_dir": [str(s.run_dir) for s in sources],
                "stage": [s.stage for s in sources],
                "run_id": [s.run_id for s in sources],
                "dataset": [s.dataset for s in sources],
                "model": [s.model for s in sources],
                "variant": [labels[s.run_dir] for s in sources],
                "simulated": [s.simulated for s in sources],
            }
        )
        st.write(tables.REPORT_RUNS, listing)
        st.write(tables.REPORT, table)
        st.write(tables.REPORT_CORRELATIONS, corr)
        st.path("report.md").write_text(markdown(table, corr, metric_cols, rank_within))
        plot_rank_heatmap(table, metric_cols, rank_within, st.path("rank_heatmap.png"))
        figures = ["report.md", "rank_heatmap.png"]
        if len(corr):
            plot_correlation_heatmap(
                corr, metric_cols, rank_within, st.path("correlation_heatmap.png")
            )
            figures.append("correlation_heatmap.png")
        for name in figures:
            st.log_file(st.path(name))
        st.set_tags(
            {
                "datasets": ",".join(sorted(set(table["dataset"]))),
                "models": ",".join(sorted(set(table["model"]))),
                "n_runs": str(len(sources)),
            }
        )
        logged = {
            run_naming.metric_key(f"{r.statistic}_{r.dataset}_{r.model}_{r.metric}"): float(r.value)
            for r in corr.itertuples()
            if pd.notna(r.value) and not r.variant
        }
        st.log_metrics({"n_runs": len(sources), "n_rows": len(table), **logged})
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.run_id,
            "n_runs": len(sources),
            "columns": metric_cols,
        }


main = hydra_main("report", run)

if __name__ == "__main__":
    main()
