"""Sweeps that compose (docs/sweeps.md): several runs as one input, and saleval-report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import DictConfig

from saleval.analysis import comparison, gathering
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.merge import MergeError
from saleval.pipeline.records.provenance import ProvenanceError
from saleval.pipeline.records.run_inputs import resolve_inputs
from saleval.stages import report
from saleval.stages import tasks as tasks_stage
from saleval.testing import make_result_run
from tests.sweeps_support import explain_job, fake_sweep, tasks_cfg


def test_tasks_take_a_sweep_dir_or_a_list_of_explain_runs(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    sweep = fake_sweep(tmp_path / "sweep", [explain_job(["random"]), explain_job(["lime"])])
    tasks_stage.run(tasks_cfg(make_cfg, str(sweep), "from_sweep"))
    listed = f"[{sweep / '0'},{sweep / '1'}]"
    tasks_stage.run(tasks_cfg(make_cfg, listed, "from_list"))
    a = tables.TASKS.read(tmp_path / "from_sweep")
    b = tables.TASKS.read(tmp_path / "from_list")
    assert set(a["method"]) - {"gold"} == {"random", "lime"}
    pd.testing.assert_frame_equal(a, b)
    # every parent run is recorded, by input name and number
    info = pd.read_json(tmp_path / "from_sweep" / "run.json", typ="series")
    assert info["parent_dirs"] == {
        "explain.0": str((sweep / "0").resolve()),
        "explain.1": str((sweep / "1").resolve()),
    }


def test_a_method_in_two_runs_is_an_error_naming_both(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    sweep = fake_sweep(tmp_path / "sweep", [explain_job(["random", "lime"]), explain_job(["lime"])])
    with pytest.raises(MergeError, match="method 'lime'") as err:
        tasks_stage.run(tasks_cfg(make_cfg, str(sweep), "tasks"))
    assert str(sweep / "0") in str(err.value) and str(sweep / "1") in str(err.value)


def test_runs_on_other_samples_or_datasets_fail_naming_the_difference(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    fewer = fake_sweep(tmp_path / "fewer", [explain_job(["random"]), explain_job(["lime"], n=5)])
    with pytest.raises(MergeError, match=r"different samples \(1 only in .*s005"):
        tasks_stage.run(tasks_cfg(make_cfg, str(fewer), "tasks1"))
    mixed = fake_sweep(
        tmp_path / "mixed", [explain_job(["random"]), explain_job(["lime"], dataset="imdb")]
    )
    with pytest.raises(ProvenanceError, match="disagree on dataset.*explain.1.*imdb"):
        tasks_stage.run(tasks_cfg(make_cfg, str(mixed), "tasks2"))


# -- saleval-report -----------------------------------------------------------------------

HUMAN = {"a": 50.0, "b": 40.0, "c": 30.0, "random": 20.0}


def metrics_frame(order: Sequence[str]) -> pd.DataFrame:
    """Comprehensiveness (↑) and sufficiency (↓) that rank methods in ``order``, best first."""
    rows = []
    for i, m in enumerate(order):
        rows.append({"method": m, "metric": "comprehensiveness", "k": "", "value": 0.5 - 0.1 * i})
        rows.append({"method": m, "metric": "sufficiency", "k": "", "value": 0.1 + 0.1 * i})
    return pd.DataFrame(rows)


def scores_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"method": list(HUMAN), "score": list(HUMAN.values()), "rank": [1, 2, 3, 4]}
    )


def test_report_gathers_datasets_ranks_and_correlates(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    # ag_news: both metrics agree with the crowd; sst2: both rank the methods backwards
    runs = [
        make_result_run(tmp_path / "s_ag", "score", scores_frame(), "ag_news"),
        make_result_run(tmp_path / "m_ag", "metrics", metrics_frame(list(HUMAN)), "ag_news"),
        make_result_run(tmp_path / "s_sst", "score", scores_frame(), "sst2"),
        make_result_run(tmp_path / "m_sst", "metrics", metrics_frame(list(HUMAN)[::-1]), "sst2"),
    ]
    cfg = make_cfg("report", [f"inputs.runs=[{','.join(str(r) for r in runs)}]"], name="report")
    out = report.run(cfg)
    table = tables.REPORT.read(out["run_dir"])
    assert len(table) == 8 and set(table["dataset"]) == {"ag_news", "sst2"}
    ag = table[table["dataset"] == "ag_news"].set_index("method")
    sst = table[table["dataset"] == "sst2"].set_index("method")
    assert ag["human_rank"].to_dict() == {"a": 1, "b": 2, "c": 3, "random": 4}
    assert ag["sufficiency_rank"].to_dict() == {"a": 1, "b": 2, "c": 3, "random": 4}
    assert sst["comprehensiveness_rank"].to_dict() == {"a": 4, "b": 3, "c": 2, "random": 1}
    assert sst.loc["b", "sufficiency"] == pytest.approx(0.3)
    corr = tables.REPORT_CORRELATIONS.read(out["run_dir"])
    rho = corr[corr["statistic"] == "spearman"].set_index(["dataset", "metric"])["value"]
    assert rho[("ag_news", "comprehensiveness")] == pytest.approx(1.0)
    assert rho[("sst2", "sufficiency")] == pytest.approx(-1.0)
    # the same numbers as the comparison's own function on that dataset's rows
    direct = comparison.rank_agreement(sst["human_score"], sst["comprehensiveness"], True)
    assert direct["kendall"] == pytest.approx(
        corr.set_index(["dataset", "metric", "statistic"])["value"][
            ("sst2", "comprehensiveness", "kendall")
        ]
    )
    for name in ("report.md", "rank_heatmap.png", "correlation_heatmap.png"):
        assert (Path(out["run_dir"]) / name).stat().st_size > 0
    assert "## sst2 / tiny" in (Path(out["run_dir"]) / "report.md").read_text()
    assert len(tables.REPORT_RUNS.read(out["run_dir"])) == 4


def test_report_refuses_one_cell_from_two_runs(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    a = make_result_run(tmp_path / "s1", "score", scores_frame())
    b = make_result_run(tmp_path / "s2", "score", scores_frame())
    cfg = make_cfg("report", [f"inputs.runs=[{a},{b}]"], name="report")
    with pytest.raises(gathering.ReportError, match=f"human_score of method .* both {a}.* and {b}"):
        report.run(cfg)


def test_report_needs_runs(make_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(ValueError, match="needs runs: inputs.runs="):
        report.run(make_cfg("report", []))


def test_variant_is_what_sets_a_sweep_job_apart() -> None:
    def src(overrides: list[str], name: str) -> gathering.Source:
        return gathering.Source(
            Path(name), "compare", "", "ag_news", "tiny", False, tuple(overrides), ()
        )

    labels = gathering.variants(
        [
            src(["profile=smoke", "profile.dataset=ag_news", "method.lime.num_samples=64"], "a"),
            src(["profile=smoke", "profile.dataset=sst2", "method.lime.num_samples=300"], "b"),
        ]
    )
    assert labels == {
        Path("a"): "method.lime.num_samples=64",
        Path("b"): "method.lime.num_samples=300",
    }


def test_a_named_profile_labels_its_variant_unless_two_would_share_it() -> None:
    def src(overrides: list[str], name: str) -> gathering.Source:
        return gathering.Source(
            Path(name), "compare", "", "ag_news", "tiny", False, tuple(overrides), ()
        )

    zero = "profile.stages.explain=['method=preset/lu2024','method.deeplift.baseline=zero']"
    runs = [
        src([], "plain"),
        src(["+experiment=preset_lu2024"], "preset"),
        src(["+experiment=preset_lu2024", "profile.name=preset_zero", zero], "zero"),
    ]
    assert gathering.variants(runs) == {
        Path("plain"): "",
        Path("preset"): "+experiment=preset_lu2024",
        Path("zero"): "+experiment=preset_lu2024 profile.name=preset_zero",
    }
    # the same name over two different stage lists: the lists stay, or two variants merge
    other = src(
        ["+experiment=preset_lu2024", "profile.name=preset_zero", "profile.stages.explain=[]"], "x"
    )
    labels = gathering.variants([*runs, other])
    assert labels[Path("zero")] != labels[Path("x")]
    assert zero in labels[Path("zero")]


def test_report_finds_runs_through_an_mlflow_search(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], mlflow_uri: str
) -> None:
    make_result_run(tmp_path / "s_ag", "score", scores_frame(), "ag_news")
    make_result_run(tmp_path / "m_ag", "metrics", metrics_frame(list(HUMAN)), "ag_news")
    make_result_run(tmp_path / "m_sst", "metrics", metrics_frame(list(HUMAN)), "sst2")
    here = f"tags.run_dir LIKE '{tmp_path}/%'"  # this test's runs, not the session's others
    cfg = make_cfg(
        "report",
        ["search.experiments=[saleval/ag_news,saleval/sst2]", f'search.filter="{here}"'],
        name="report",
    )
    out = report.run(cfg)
    found = tables.REPORT_RUNS.read(out["run_dir"])
    assert sorted(Path(d).name for d in found["run_dir"]) == ["m_ag", "m_sst", "s_ag"]
    table = tables.REPORT.read(out["run_dir"])
    # sst2 has metrics only: no human score, no human rank, metrics still ranked
    sst = table[table["dataset"] == "sst2"]
    assert sst["human_score"].isna().all() and sst["human_rank"].isna().all()
    assert sorted(sst["comprehensiveness_rank"]) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="no MLflow experiment 'saleval/nope'"):
        report.run(make_cfg("report", ["search.experiments=[saleval/nope]"], name="r2"))


@pytest.mark.slow
def test_explain_sweep_feeds_one_metrics_run_and_the_report(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], tiny_train_run: Path
) -> None:
    """Real tiny runs: two explain jobs of one sweep (one method each), one metrics run on
    the sweep dir, and the report of it next to a crowd's scores."""
    from saleval.stages import explain, metrics

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    model = f"inputs.model={tiny_train_run}"
    for i, method in enumerate(["vanilla_gradient", "occlusion"]):
        overrides = [model, f"method=[{method}]", "data.n_samples=6", "progress=false"]
        explain.run(make_cfg("explain", overrides, name=f"sweep/{i}"))
    overrides = [model, f"inputs.explain={sweep}", "kgrid=smoke", "progress=false"]
    out = metrics.run(make_cfg("metrics", overrides, name="metrics"))
    table = tables.METRICS.read(out["run_dir"])
    assert set(table["method"]) == {"vanilla_gradient", "occlusion"}
    assert set(table["n"]) == {6}
    human = pd.DataFrame(
        {"method": ["occlusion", "vanilla_gradient"], "score": [60.0, 40.0], "rank": [1, 2]}
    )
    scores = make_result_run(tmp_path / "score", "score", human, "ag_news", "tiny")
    rep = report.run(make_cfg("report", [f"inputs.runs=[{scores},{out['run_dir']}]"], name="rep"))
    rows = tables.REPORT.read(rep["run_dir"]).set_index("method")
    assert rows.loc["occlusion", "human_rank"] == 1
    assert rows["comprehensiveness"].notna().all()
    # the metrics run alone: no human score, so no correlation rows and no empty ρ table
    alone = report.run(make_cfg("report", [f"inputs.runs=[{out['run_dir']}]"], name="alone"))
    assert len(tables.REPORT_CORRELATIONS.read(alone["run_dir"])) == 0
    md = (Path(alone["run_dir"]) / "report.md").read_text()
    assert "Spearman ρ" not in md and "no rank correlation" in md
    assert not (Path(alone["run_dir"]) / "correlation_heatmap.png").exists()


def test_saleval_run_dirs_are_inputs_too(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    """A saleval-run dir stands for its run of the stage an input needs; a sweep of them
    (as `saleval-run -m` writes) for each job's."""
    import json

    def pipeline(job: Path, dataset: str, stages: Sequence[str]) -> Path:
        made = {}
        for stage in stages:
            if stage == "explain":
                made[stage] = explain_job(["random", "lime"])(job / stage)
            elif stage == "score":
                made[stage] = make_result_run(job / stage, "score", scores_frame(), dataset)
            else:
                frame = metrics_frame(list(HUMAN))
                made[stage] = make_result_run(job / stage, "metrics", frame, dataset)
        runs = {s: {"run_dir": str(d), "seconds": 0.0, "reused": False} for s, d in made.items()}
        (job / "pipeline.json").write_text(json.dumps({"stages": runs}))
        return job

    sweep = fake_sweep(
        tmp_path / "run_sweep",
        [
            lambda j: pipeline(j, "ag_news", ["explain", "score", "metrics"]),
            lambda j: pipeline(j, "sst2", ["score", "metrics"]),
        ],
    )
    tasks_stage.run(tasks_cfg(make_cfg, str(sweep / "0"), "tasks"))
    info = pd.read_json(tmp_path / "tasks" / "run.json", typ="series")
    assert info["parent_dirs"] == {"explain": str((sweep / "0" / "explain").resolve())}
    out = report.run(make_cfg("report", [f"inputs.runs={sweep}"], name="report"))
    table = tables.REPORT.read(out["run_dir"])
    assert sorted(set(table["dataset"])) == ["ag_news", "sst2"]
    assert table["human_score"].notna().all() and table["sufficiency"].notna().all()
    with pytest.raises(
        InputError, match=r"no explain run in this pipeline \(it ran score, metrics\)"
    ):
        resolve_inputs("explain", str(sweep / "1"))


def test_a_failed_sweep_job_and_an_empty_list_are_named(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep", [lambda j: j.mkdir() or j])  # a job without run.json
    with pytest.raises(InputError, match=r"sweep job .*/0 has no run.json: did it fail\?"):
        resolve_inputs("explain", str(sweep))
    with pytest.raises(InputError, match="an empty list names no run"):
        resolve_inputs("explain", [])


def test_a_real_sweep_logs_what_it_varies_as_a_param(
    tmp_path: Path, tiny_train_run: Path, mlflow_uri: str
) -> None:
    """``saleval-explain -m method.lime.num_samples=8,16``: each job's stage run carries the
    swept value as a param (method settings otherwise go to the method's child run), so
    the runs table and the parallel-coordinates plot can tell the jobs apart."""
    from mlflow.tracking import MlflowClient

    from tests.cli_support import script

    done = script(
        "explain", "-m", f"inputs.model={tiny_train_run}", "method=[lime]",
        "method.lime.num_samples=8,16", "data.n_samples=4", "progress=false",
        f"paths.output_root={tmp_path / 'out'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.stage = 'explain'"
    )
    jobs = [r for r in runs if r.data.tags.get("sweep", "").startswith(str(tmp_path))]
    assert sorted(r.data.params.get("method.lime.num_samples", "-") for r in jobs) == ["16", "8"]
