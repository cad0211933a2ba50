"""An import that keeps no answer fails, with the counts by reason, and keeps its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saleval.crowd.errors import CrowdImportError
from saleval.pipeline import tables
from saleval.testing import make_task_run


def test_an_import_that_keeps_no_answer_fails_naming_the_reasons(
    tmp_path: Path, make_cfg, mlflow_uri: str
) -> None:
    from saleval.stages import import_, simulate

    tasks = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=5)
    sim = simulate.run(make_cfg("simulate", [f"inputs.tasks={tasks}"], name="sim"))
    # every simulated bundle takes minutes, not a day: the speed filter drops every worker
    cfg = make_cfg(
        "import",
        [
            f"inputs.tasks={tasks}",
            f"inputs.answers={sim['run_dir']}",
            "crowd.filters.min_bundle_seconds=86400",
        ],
        name="imp",
    )
    with pytest.raises(CrowdImportError, match=r"no answer is left to score.*rows read") as err:
        import_.run(cfg)
    assert "min_bundle_seconds:" in str(err.value) and "loosen crowd.filters" in str(err.value)
    run_dir = tmp_path / "imp"
    filtered = (run_dir / "filtered.csv").read_text().splitlines()
    assert len(filtered) - 1 == len(tables.ANSWERS.read(sim["run_dir"]))  # every answer, kept
    assert json.loads((run_dir / "run.json").read_text())["status"] == "FAILED"


def test_a_stage_prints_where_it_went_and_what_follows_and_latest_chains(
    tmp_path: Path, make_cfg, mlflow_uri: str, capsys
) -> None:
    from saleval.stages import import_, simulate

    out = tmp_path / "out"
    tasks = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=5)
    sim = simulate.run(
        make_cfg(
            "simulate",
            [f"inputs.tasks={tasks}", f"paths.output_root={out}"],
            name="out/simulate/r1",
        )
    )
    printed = capsys.readouterr().out
    assert f"[saleval-simulate] finished: {sim['run_dir']}" in printed
    assert f"MLflow run {sim['run_id']}" in printed
    assert (
        f"next: saleval-import inputs.tasks={tasks.resolve()} inputs.answers={sim['run_dir']}"
        in printed
    )
    assert (out / "simulate" / "latest").resolve() == Path(sim["run_dir"]).resolve()
    imp = import_.run(
        make_cfg(
            "import",
            [
                f"inputs.tasks={tasks}",
                "inputs.answers=latest",
                f"paths.output_root={out}",
                "crowd.filters.min_bundle_seconds=null",
            ],
            name="imp",
        )
    )
    info = json.loads((Path(imp["run_dir"]) / "run.json").read_text())
    assert Path(info["parent_dirs"]["answers"]).resolve() == Path(sim["run_dir"]).resolve()
    # a run dir outside <output root>/<stage> leaves "latest" alone
    assert not (out / "import").exists()
    with pytest.raises(Exception, match="inputs.crowd=latest:.*does not exist"):
        from saleval.pipeline.records.run_inputs import resolve_input

        resolve_input("crowd", "latest", out)


def test_a_k_longer_than_every_text_warns(caplog) -> None:
    from saleval.config.crowd import StudyConfig
    from saleval.crowd.design import build_study
    from saleval.testing import explain_frames

    preds, attrs = explain_frames(20, ["neg", "pos"], methods=["random", "lime"])
    study = StudyConfig(n_samples=8, bundle_size=8, repeats=1, population="correct")
    with caplog.at_level("WARNING"):
        build_study(preds, attrs, ["neg", "pos"], study, [2, 1000])
    assert "kgrid [1000]: every study text has at most" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        build_study(preds, attrs, ["neg", "pos"], study, [2, 3])
    assert "kgrid" not in caplog.text
