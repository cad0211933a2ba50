"""Running a real study: admin token from a file, online backup, read-only export,
datasets without label descriptions, and the load/kill invariant kept by the benchmark."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from omegaconf import DictConfig, OmegaConf

from saleval.annotate.app import create_app
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.store_db import SCHEMA_VERSION, StoreError
from saleval.annotate.study import load_study
from saleval.pipeline import tables
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from tests.annotate_support import settings

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building a task run logs to MLflow

POSITION = re.compile(r'name="position" value="(\d+)"')


def _answer_all(app: object, worker: str) -> None:
    c = TestClient(app, follow_redirects=False)  # type: ignore[arg-type]
    assert c.post("/start", data={"worker_id": worker}).status_code == 303
    c.post("/instructions")
    while (page := c.get("/task")).status_code == 200:
        pos = POSITION.search(page.text).group(1)  # type: ignore[union-attr]
        assert c.post("/answer", data={"position": pos, "answer": "World"}).status_code == 303


def test_admin_token_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("1_2_3_4_5_6_7_8\n")  # Hydra would read this as the integer 12345678
    node = OmegaConf.create({"admin_token": None, "admin_token_file": str(f)})
    assert annotate_stage.admin_token(node) == "1_2_3_4_5_6_7_8"
    node.admin_token = "from-the-env-var"
    assert annotate_stage.admin_token(node) == "from-the-env-var"
    node.admin_token = None
    f.write_text("short\n")
    with pytest.raises(ValueError, match=rf"admin_token_file={f}: .* at least 8"):
        annotate_stage.admin_token(node)
    node.admin_token_file = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="missing: cannot be read"):
        annotate_stage.admin_token(node)


def test_online_backup_while_serving_holds_every_answer(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)
    db = tmp_path / "live.sqlite"
    app = create_app(tasks_dir, settings(db))
    _answer_all(app, "w1")
    live = app.state.store  # still open: the answers sit in the WAL
    assert Path(f"{db}-wal").stat().st_size > 0
    out = annotate_stage.run(
        make_cfg(
            "annotate",
            [
                "action=backup",
                f"annotate.db={db}",
                f"annotate.backup_to={tmp_path / 'b' / 'copy.sqlite'}",
            ],
        )
    )
    copy = AnnotationStore(out["backup"], readonly=True)
    study = load_study(tasks_dir)
    assert copy.answers(study.run_key).equals(live.answers(study.run_key))
    assert len(copy.answers(study.run_key)) == 3
    assert not Path(f"{out['backup']}-wal").exists()  # one self-contained file
    copy.close()
    with pytest.raises(StoreError, match="overwrite the live database"):
        live.backup(db)
    with pytest.raises(ValueError, match="annotate.backup_to"):
        annotate_stage.run(make_cfg("annotate", ["action=backup", f"annotate.db={db}"], name="x"))
    live.close()


def test_export_reads_without_writing_and_names_the_path(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)
    db = tmp_path / "archive.sqlite"
    app = create_app(tasks_dir, settings(db))
    _answer_all(app, "w1")
    app.state.store.close()  # the last close checkpoints: one file, as archived
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    base = [f"inputs.tasks={tasks_dir}", "action=export"]
    out = annotate_stage.run(make_cfg("annotate", [*base, f"annotate.db={db}"]))
    assert len(tables.ANSWERS.read(out["run_dir"])) == 3
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest  # not written to
    # The immutable fallback (for media where SQLite cannot even create the WAL index)
    ro = AnnotationStore(db, readonly=True)
    with pytest.raises(StoreError, match="opened read-only"):
        ro.expire_leases("x")
    ro.close()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match=re.escape(str(junk))):
        annotate_stage.run(make_cfg("annotate", [*base, f"annotate.db={junk}"], name="j"))


def test_read_only_export_of_a_copy_with_its_wal_but_no_shm(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)
    db = tmp_path / "live" / "annotations.sqlite"
    app = create_app(tasks_dir, settings(db))
    live = app.state.store
    live._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the schema in the main file
    _answer_all(app, "w1")  # the answers only in the WAL: the server is still running
    run_key = load_study(tasks_dir).run_key
    assert live.n_answers(run_key) == 3 and Path(f"{db}-wal").stat().st_size > 0
    # A live store read-only, in place: every answer
    in_place = AnnotationStore(db, readonly=True)
    assert in_place.n_answers(run_key) == 3 and in_place._copy is None
    in_place.close()

    archive = tmp_path / "archive"  # copied with its -wal, without -shm, read-only
    archive.mkdir()
    for name in (db.name, f"{db.name}-wal"):
        (archive / name).write_bytes((db.parent / name).read_bytes())
    copied = archive / db.name
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in archive.iterdir()}
    # the risk: SQLite's immutable mode reads the main file only, without the answers
    main_only = sqlite3.connect(f"{copied.as_uri()}?mode=ro&immutable=1", uri=True)
    assert main_only.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0
    main_only.close()
    archive.chmod(0o555)
    try:
        base = [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={copied}"]
        out = annotate_stage.run(make_cfg("annotate", base))
        exported = tables.ANSWERS.read(out["run_dir"])
        assert len(exported) == 3 == out["n_answers"]
        assert sorted(exported["task_id"]) == sorted(live.answers(run_key)["task_id"])
        # nothing written beside the archive: no -shm, the two files unchanged
        after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in archive.iterdir()}
        assert after == digests
        ro = AnnotationStore(copied, readonly=True)
        private = Path(ro._copy.name)  # type: ignore[union-attr]
        assert ro.n_answers(run_key) == 3 and private.is_dir()
        ro.close()
        assert not private.exists()  # the private copy goes with the store

        # A WAL that cannot be read is refused with both files named, never skipped.
        def no_space(*args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("saleval.annotate.store_db.shutil.copyfile", no_space)
        where = rf"{re.escape(str(copied))}: its write-ahead log .*-wal holds answers"
        with pytest.raises(StoreError, match=where) as refused:
            annotate_stage.run(make_cfg("annotate", base, name="refused"))
        message = str(refused.value)
        assert "No space left on device" in message and "export from there" in message
    finally:
        archive.chmod(0o755)
        live.close()


@pytest.mark.parametrize("descriptions", ["{}", None])
def test_task_run_without_label_descriptions_serves_and_exports(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], descriptions: str | None
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=1, bundle_size=3)
    cfg_path = tasks_dir / "config.yaml"
    cfg = OmegaConf.load(cfg_path)
    if descriptions is None:
        del cfg.dataset["label_descriptions"]
    else:
        cfg.dataset.label_descriptions = {}
    OmegaConf.save(cfg, cfg_path)
    study = load_study(tasks_dir)
    assert study.label_descriptions == {}
    db = tmp_path / "db.sqlite"
    app = create_app(study, settings(db))
    _answer_all(app, "w1")
    app.state.store.close()
    out = annotate_stage.run(
        make_cfg("annotate", [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}"])
    )
    assert len(tables.ANSWERS.read(out["run_dir"])) == 3


def test_an_empty_database_file_gets_the_current_schema(tmp_path: Path) -> None:
    db = tmp_path / "fresh.sqlite"
    sqlite3.connect(db).close()
    AnnotationStore(db).close()
    version = sqlite3.connect(db).execute("SELECT value FROM meta").fetchone()[0]
    assert version == str(SCHEMA_VERSION) == "3"
