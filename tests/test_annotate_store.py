"""Annotation store and export: WAL, one commit per answer, the study's rules in the schema."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from saleval.annotate.export import ExportError, answers_frame
from saleval.annotate.store_answers import AnnotationStore, AnswerRejected
from saleval.annotate.store_db import StoreError
from saleval.annotate.store_leases import Assignment, BundleRefused, ResumeRequired
from saleval.annotate.study import IDK, Study, StudyError, load_study
from saleval.config.annotate import AnnotateConfig
from saleval.pipeline import tables
from saleval.pipeline.records import run_record
from saleval.testing import make_task_run

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building a task run logs to MLflow

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00")


@pytest.fixture
def study(tmp_path: Path) -> Study:
    return load_study(make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3))


@pytest.fixture
def store(tmp_path: Path, study: Study) -> AnnotationStore:
    s = AnnotationStore(tmp_path / "db.sqlite")
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    yield s
    s.close()


def answer_all(store: AnnotationStore, a: Assignment, answers: list[str]) -> None:
    for ans in answers:
        nxt = store.next_task(a)
        assert nxt is not None
        store.record_answer(a.assignment_id, nxt.position, ans)


def test_wal_mode_full_sync_and_schema(store: AnnotationStore) -> None:
    assert store.journal_mode() == "wal"
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    ddl = con.execute(
        "SELECT sql FROM sqlite_master WHERE name='one_bundle_per_worker_per_dataset'"
    ).fetchone()[0]
    assert "(worker_id, dataset) WHERE released_at IS NULL" in ddl
    assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_one_bundle_per_worker_per_dataset_is_a_db_constraint(
    tmp_path: Path, store: AnnotationStore, study: Study
) -> None:
    other = load_study(make_task_run(tmp_path / "tasks2", n_bundles=2, bundle_size=3, seed=1))
    news2 = load_study(
        make_task_run(tmp_path / "tasks3", n_bundles=1, bundle_size=3, dataset="imdb", seed=2)
    )
    for s in (other, news2):
        store.register_run(s.run_key, s.dataset, str(s.tasks_dir), s.bundles)
    a = store.assign(study.run_key, "w1")
    # Bypassing the Python checks: the database itself refuses a second bundle.
    with pytest.raises(sqlite3.IntegrityError, match="worker_id, assignments.dataset"):
        store._conn().execute(
            "INSERT INTO assignments (run_key, dataset, bundle_id, worker_id, session_token, "
            "n_tasks, assigned_at) VALUES (?, 'ag_news', ?, 'w1', 'tok', 3, 'now')",
            (other.run_key, other.bundle_ids[0]),
        )
    # Another task set of the same dataset: refused; another dataset: fine.
    with pytest.raises(BundleRefused, match="another task set"):
        store.assign(other.run_key, "w1")
    assert store.assign(news2.run_key, "w1").dataset == "imdb"
    # The same worker ID alone never gets the bundle in progress; its resume code does.
    with pytest.raises(ResumeRequired, match="resume code"):
        store.assign(study.run_key, "w1")
    again = store.assign(study.run_key, "w1", resume_code=a.resume_code.lower())
    assert again.assignment_id == a.assignment_id


def test_bundles_go_out_in_file_order_one_worker_each(store: AnnotationStore, study: Study) -> None:
    assert store.assign(study.run_key, "w1").bundle_id == study.bundle_ids[0]
    assert store.assign(study.run_key, "w2").bundle_id == study.bundle_ids[1]
    with pytest.raises(BundleRefused) as info:
        store.assign(study.run_key, "w3")
    assert info.value.status == 410
    with pytest.raises(sqlite3.IntegrityError, match="run_key, assignments.bundle_id"):
        store._conn().execute(
            "INSERT INTO assignments (run_key, dataset, bundle_id, worker_id, session_token, "
            "n_tasks, assigned_at) VALUES (?, 'x', ?, 'w9', 'tok9', 3, 'now')",
            (study.run_key, study.bundle_ids[0]),
        )


def test_answers_follow_the_shown_task_and_first_answer_wins(
    store: AnnotationStore, study: Study
) -> None:
    a = store.assign(study.run_key, "w1")
    positions = study.bundles[study.bundles.bundle_id == a.bundle_id]["position"].tolist()
    with pytest.raises(AnswerRejected, match="not been shown"):
        store.record_answer(a.assignment_id, positions[0], "World")
    with pytest.raises(AnswerRejected, match="not part of your bundle"):
        store.record_answer(a.assignment_id, 99, "World")
    first = store.next_task(a)
    assert first is not None and first.position == positions[0] and first.n_answered == 0
    assert store.next_task(a).started_at == first.started_at  # shown once, time kept
    assert store.record_answer(a.assignment_id, first.position, "Sports").stored
    again = store.record_answer(a.assignment_id, first.position, "World")
    assert not again.stored and not again.completed
    nxt = store.next_task(a)
    assert nxt.position == positions[1] and nxt.index == 1 and nxt.n_answered == 1
    with pytest.raises(AnswerRejected, match="not been shown"):
        store.record_answer(a.assignment_id, positions[2], "World")  # skipping ahead
    got = store.answers(study.run_key)
    assert got[["position", "answer"]].values.tolist() == [[positions[0], "Sports"]]
    assert ISO_UTC.fullmatch(got.started_at[0]) and ISO_UTC.fullmatch(got.submitted_at[0])
    assert got.submitted_at[0] >= got.started_at[0]


def test_completion_sets_a_code_and_refuses_a_second_bundle(
    store: AnnotationStore, study: Study
) -> None:
    a = store.assign(study.run_key, "w1")
    answer_all(store, a, ["World", IDK, "Business"])
    assert store.next_task(a) is None
    done = store.by_session(a.session_token)
    assert done.done and re.fullmatch(r"[A-HJ-NP-Z2-9]{4}-[A-HJ-NP-Z2-9]{4}", done.completion_code)
    with pytest.raises(BundleRefused, match="already completed"):
        store.assign(study.run_key, "w1")
    prog = store.progress(study.run_key)
    assert prog.n_answered.tolist() == [3, 0] and prog.worker_id.iloc[0] == "w1"
    assert store.completions(study.run_key).completion_code.tolist() == [done.completion_code]


def test_fixed_completion_code(tmp_path: Path, study: Study) -> None:
    s = AnnotationStore(tmp_path / "fixed.sqlite", AnnotateConfig(completion_code="C1A2B3"))
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    a = s.assign(study.run_key, "w1")
    answer_all(s, a, ["World"] * 3)
    assert s.by_session(a.session_token).completion_code == "C1A2B3"
    s.close()


def test_committed_answers_survive_reopening(tmp_path: Path, study: Study) -> None:
    s = AnnotationStore(tmp_path / "db.sqlite")
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    a = s.assign(study.run_key, "w1")
    answer_all(s, a, ["World", "Sports"])
    before = s.answers(study.run_key)
    # No close(): the process "dies" with its connections open.
    t = AnnotationStore(tmp_path / "db.sqlite")
    t.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    pd.testing.assert_frame_equal(t.answers(study.run_key), before)
    assert t.next_task(t.assign(study.run_key, "w1", session_token=a.session_token)).index == 2
    t.close()
    s.close()


def test_register_run_refuses_changed_bundles(store: AnnotationStore, study: Study) -> None:
    changed = study.bundles.copy()
    changed.loc[0, "position"] = 42
    with pytest.raises(StoreError, match="other bundles"):
        store.register_run(study.run_key, study.dataset, str(study.tasks_dir), changed)
    store.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)


def test_export_frame_is_the_import_format(store: AnnotationStore, study: Study) -> None:
    a = store.assign(study.run_key, "w1")
    answer_all(store, a, ["World", IDK, "Sci/Tech"])
    b = store.assign(study.run_key, "w2")
    answer_all(store, b, ["Sports"])
    df = answers_frame(store, study)
    assert list(df.columns) == [
        "worker_id",
        "task_id",
        "answer",
        "started_at",
        "submitted_at",
        "bundle_id",
        "position",
        "duration_s",
    ]
    tables.ANSWERS.validate(df)
    assert df.worker_id.tolist() == ["w1"] * 3 + ["w2"]
    assert df.answer.tolist() == ["World", IDK, "Sci/Tech", "Sports"]
    assert set(df.task_id) <= set(study.tasks.task_id)
    assert (df.duration_s >= 0).all()
    by_pos = study.bundles.set_index(["bundle_id", "position"]).task_id
    assert [by_pos[(r.bundle_id, r.position)] for r in df.itertuples()] == df.task_id.tolist()
    assert answers_frame(store, study, complete_only=True).worker_id.unique().tolist() == ["w1"]


def test_export_refuses_answers_outside_the_options(store: AnnotationStore, study: Study) -> None:
    a = store.assign(study.run_key, "w1")
    answer_all(store, a, ["World"])
    store._conn().execute("UPDATE answers SET answer='Weather'")
    with pytest.raises(ExportError, match="row 1, field 'answer': 'Weather'"):
        answers_frame(store, study)


def _record_as_written(run: Path) -> None:
    """Make ``run``'s record list its tables' current bytes, as if the stage had written
    them: what is under test is the reader's row check, not the changed-table refusal
    (tests/test_run_records.py tests that)."""
    record = json.loads((run / run_record.RUN_JSON).read_text())
    record[run_record.CHECKSUMS] = run_record.table_checksums(run, record[run_record.CHECKSUMS])
    run_record.write_atomically(run / run_record.RUN_JSON, json.dumps(record, indent=2))


def test_load_study_names_file_row_and_field(tmp_path: Path) -> None:
    run = make_task_run(tmp_path / "t", n_bundles=2, bundle_size=3)
    bundles = tables.BUNDLES.read(run)
    bundles.loc[4, "task_id"] = "nope"
    tables.BUNDLES.write(bundles, run)
    _record_as_written(run)  # a tasks run that wrote the bad row itself, not an edit
    with pytest.raises(StudyError, match=r"bundles.csv: row 5, field 'task_id': 'nope'"):
        load_study(run)
    run2 = make_task_run(tmp_path / "t2")  # a config edited by hand: a label named IDK
    cfg = OmegaConf.load(run2 / "config.yaml")
    cfg.dataset.label_names[1] = IDK
    OmegaConf.save(cfg, run2 / "config.yaml")
    with pytest.raises(StudyError, match="may not be named"):
        load_study(run2)
    run3 = make_task_run(tmp_path / "t3")
    (run3 / "instructions.md").unlink()
    with pytest.raises(StudyError, match="instructions.md: missing"):
        load_study(run3)
