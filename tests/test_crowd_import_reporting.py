"""What an import tells about the rows it could not take (issue #28 items 3 and 4): fields
of any size, a reject summary on the console under every policy, and worker IDs that
differ only in case or surrounding spaces."""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import DictConfig

from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing import rows
from saleval.crowd.importing.long_format import read_answers
from saleval.pipeline import tables
from saleval.stages import import_
from tests.crowd_support import LABELS, hand_made_answers, hand_made_task_run

HUGE = 200_000


@pytest.fixture
def task_run(tmp_path: Path) -> Path:
    return hand_made_task_run(tmp_path)


def test_a_200000_character_field_is_read_never_a_traceback(task_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text(
        "worker_id,task_id,answer,duration_s,comment\n"
        f"w1,s0-random-k2,negative,3,{'c' * HUGE}\n"  # a long free-text column: imported
        f"w1,s1-random-k2,{'x' * HUGE},3,fine\n"  # a long answer: a located reject
    )
    tasks = tables.TASKS.read(task_run)
    accepted, rejects, info = read_answers(path, tasks, None, LABELS)
    assert info["n_rows"] == 2 and accepted["row"].tolist() == [1]
    assert [(r.row, r.field) for r in rejects.itertuples()] == [(2, "answer")]
    problem = rejects["problem"].iloc[0]
    assert problem.startswith("unknown label 'xxx") and "characters left out" in problem
    assert len(problem) < 2 * rows.MAX_PROBLEM_CHARS and "I don't know" in problem


def test_what_csv_still_refuses_is_a_located_error(
    task_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.csv"
    path.write_text("worker_id,task_id,answer,duration_s\nw1,s0-random-k2,negative,3\nw1,x,yy,4\n")
    # a csv module with a tiny field limit stands for whatever it may still refuse
    monkeypatch.setattr(rows, "allow_any_field_size", lambda: csv.field_size_limit(2))
    try:
        with pytest.raises(CrowdImportError, match=r"a\.csv, row header \(line 1\)"):
            read_answers(path, tables.TASKS.read(task_run), None, LABELS)
        path.write_text("w,t\nw1,x\nw1,long\n")
        csv.field_size_limit(3)
        monkeypatch.setattr(rows, "allow_any_field_size", lambda: None)
        with pytest.raises(CrowdImportError, match=r"a\.csv, row 2 \(line 3\): .*field larger"):
            rows.read_rows(path)
    finally:
        monkeypatch.undo()
        rows.allow_any_field_size()
    assert csv.field_size_limit() > HUGE


def _bad_answers(task_run: Path, tmp_path: Path) -> Path:
    """The hand-made crowd's answers with three bad rows: a latin-1 byte in a worker ID
    (row 4), an empty task id (row 6) and a 200,000-character answer (row 9)."""
    answers = hand_made_answers(tables.BUNDLES.read(task_run), spam=False)
    answers.loc[3, "worker_id"] = "Jos\xe9"
    answers.loc[5, "task_id"] = ""
    answers.loc[8, "answer"] = "y" * HUGE
    path = tmp_path / "platform.csv"
    path.write_bytes(answers.to_csv(index=False).encode("latin-1"))
    return path


def test_default_policy_prints_one_located_line_per_reason(
    task_run: Path,
    tmp_path: Path,
    make_cfg: Callable[..., DictConfig],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _bad_answers(task_run, tmp_path)
    base = [f"inputs.tasks={task_run}", f"inputs.answers={path}"]
    out = import_.run(make_cfg("import", [*base, "crowd.filters.min_bundle_seconds=null"]))
    err = capsys.readouterr().err
    rejects_csv = Path(out["run_dir"]) / "rejects.csv"
    assert tables.REJECTS.read(Path(out["run_dir"]))["row"].tolist() == [4, 6, 9]
    assert (
        f"3 rows rejected (crowd.policy=report: the other rows were imported); every reject "
        f"is in {rejects_csv}"
    ) in err
    lines = err.splitlines()
    assert f"  {path}, row 4, field worker_id: byte 0xE9 at character 4 is not valid utf-8" in err
    assert f"  {path}, row 6, field task_id: empty task id" in lines
    long_line = next(line for line in lines if ", row 9, field answer: unknown label" in line)
    assert "characters left out" in long_line and len(long_line) < 1000
    assert "Traceback" not in err
    assert out["n_accepted"] == len(pd.read_csv(path, encoding="latin-1")) - 3


def test_strict_policy_exits_with_the_same_summary_and_writes_rejects(
    task_run: Path,
    tmp_path: Path,
    make_cfg: Callable[..., DictConfig],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _bad_answers(task_run, tmp_path)
    overrides = [f"inputs.tasks={task_run}", f"inputs.answers={path}", "crowd.policy=strict"]
    cfg = make_cfg("import", overrides)
    with pytest.raises(CrowdImportError, match="nothing was imported"):
        import_.run(cfg)
    err = capsys.readouterr().err
    run_dir = Path(cfg.run_dir)
    assert "3 rows rejected (crowd.policy=strict: nothing was imported)" in err
    assert str(run_dir / "rejects.csv") in err
    assert tables.REJECTS.read(run_dir)["row"].tolist() == [4, 6, 9]
    assert not (run_dir / "annotations.parquet").exists()
    assert not (run_dir / "aggregated.csv").exists()


def test_worker_ids_are_stripped_and_compared_without_case(
    task_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ids.csv"
    path.write_text(
        "worker_id,bundle_id,position,answer,duration_s\n"
        "A1b2,b00,0,negative,3\n"
        " a1B2 ,b00,1,negative,3\n"  # the same worker: case and spaces
        "a1b2,b00,0,positive,3\n"  # so this is their second answer to one task
        "W9,b01,0,negative,3\n"
        "w9 ,b01,1,negative,3\n"
    )
    tasks, bundles = tables.TASKS.read(task_run), tables.BUNDLES.read(task_run)
    with caplog.at_level(logging.WARNING, logger="saleval.crowd.importing.long_format"):
        accepted, rejects, info = read_answers(path, tasks, bundles, LABELS)
    assert accepted["worker_id"].tolist() == ["A1b2", "A1b2", "W9", "W9"]  # first spelling
    assert [(r.row, r.field) for r in rejects.itertuples()] == [(3, "task_id")]
    assert "duplicate answer of worker 'A1b2'" in rejects["problem"].iloc[0]
    assert info["worker_ids_merged"] == {"A1b2": ["A1b2", " a1B2 ", "a1b2"], "W9": ["W9", "w9 "]}
    merged = [r.getMessage() for r in caplog.records if "field worker_id" in r.getMessage()]
    assert len(merged) == 1  # one line lists every merged group
    assert "'A1b2' = ' a1B2 ' = 'a1b2'" in merged[0] and "'W9' = 'w9 '" in merged[0]
    assert "crowd.worker_id_case=insensitive" in merged[0]
    assert info["bundles_with_several_workers"] == {}  # one worker per bundle after merging

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="saleval.crowd.importing.long_format"):
        accepted, rejects, info = read_answers(
            path, tasks, bundles, LABELS, worker_id_case="sensitive"
        )
    # case now tells workers apart; spaces still never count
    assert accepted["worker_id"].tolist() == ["A1b2", "a1B2", "a1b2", "W9", "w9"]
    assert rejects.empty
    assert info["worker_ids_merged"] == {}
    assert info["bundles_with_several_workers"] == {
        "b00": ["A1b2", "a1B2", "a1b2"],
        "b01": ["W9", "w9"],
    }
    shared = [r.getMessage() for r in caplog.records if "field bundle_id" in r.getMessage()]
    assert shared[0].startswith(f"{path}, row 2, field bundle_id: bundle 'b00' is answered by ")
    assert "(first 'A1b2', row 1)" in shared[0]
    assert len(shared) == 3  # a1B2, a1b2 on b00; w9 on b01


def test_worker_id_case_is_a_crowd_option(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    answers = hand_made_answers(tables.BUNDLES.read(task_run), spam=False)
    answers["worker_id"] = [
        w.upper() if i % 2 else f" {w} " for i, w in enumerate(answers["worker_id"])
    ]
    path = tmp_path / "mixed.csv"
    answers.to_csv(path, index=False)
    base = [
        f"inputs.tasks={task_run}",
        f"inputs.answers={path}",
        # half a worker's answers under each spelling: no filter may judge the halves
        "crowd.filters.min_bundle_seconds=null",
        "crowd.filters.all_idk=false",
        "crowd.filters.gold_min_accuracy=null",
    ]
    default = import_.run(make_cfg("import", base, name="insensitive"))
    sensitive = import_.run(make_cfg("import", [*base, "crowd.worker_id_case=sensitive"], name="s"))
    n = answers["worker_id"].str.strip().str.lower().nunique()
    assert default["n_workers"] == n and sensitive["n_workers"] == 2 * n
    with pytest.raises(Exception, match="worker_id_case"):
        make_cfg("import", [*base, "crowd.worker_id_case=upper"], name="bad")
