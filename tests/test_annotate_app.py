"""The annotation app over HTTP (no browser): flow, validation, escaping, admin, the stage."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval.annotate.app import create_app
from saleval.annotate.security import valid_worker_id
from saleval.annotate.study import IDK, load_study
from saleval.config.annotate import AnnotateConfig
from saleval.config.crowd import WorkerIdCase
from saleval.pipeline import tables
from saleval.schema import to_schema
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from tests.annotate_support import TOKEN, settings

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building a task run logs to MLflow

POSITION = re.compile(r'name="position" value="(\d+)"')


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    return make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)


@pytest.fixture
def app(tmp_path: Path, tasks_dir: Path) -> Iterator[object]:
    app = create_app(tasks_dir, settings(tmp_path / "db.sqlite"))
    yield app
    app.state.store.close()


def client(app: object) -> TestClient:
    return TestClient(app, follow_redirects=False)  # type: ignore[arg-type]


def begin(c: TestClient, worker: str) -> None:
    r = c.post("/start", data={"worker_id": worker})
    assert (r.status_code, r.headers["location"]) == (303, "/instructions")
    assert c.post("/instructions").headers["location"] == "/task"


def answer_current(c: TestClient, answer: str) -> tuple[int, str]:
    page = c.get("/task")
    assert page.status_code == 200, page.text
    pos = int(POSITION.search(page.text).group(1))
    r = c.post("/answer", data={"position": str(pos), "answer": answer})
    assert r.status_code == 303
    return pos, r.headers["location"]


def test_flow_instructions_first_tasks_in_order_then_code(app: object) -> None:
    c = client(app)
    assert c.get("/task").headers["location"] == "/"  # no session yet
    r = c.post("/start", data={"worker_id": "  prolific_5f3a.b@x  "})  # stripped
    assert r.headers["location"] == "/instructions"
    assert c.get("/task").headers["location"] == "/instructions"  # instructions come first
    assert c.get("/done").headers["location"] == "/task"
    page = c.get("/instructions").text
    assert "<h2>Instructions (ag_news)</h2>" in page and "prolific_5f3a.b@x" in page
    c.post("/instructions")
    heads = []
    for ans in ("World", IDK, "Sci/Tech"):
        heads.append(re.search(r"<h1>(.*?)</h1>", c.get("/task").text).group(1))
        _, loc = answer_current(c, ans)
    assert heads == ["Task 1 of 3", "Task 2 of 3", "Task 3 of 3"]
    assert loc == "/done"
    done = c.get("/done")
    code = re.search(r'id="completion-code">([^<]+)<', done.text).group(1)
    assert re.fullmatch(r"[A-Z2-9]{4}-[A-Z2-9]{4}", code)
    assert c.get("/task").headers["location"] == "/done"
    # Coming back with the same id: refused, never a second bundle.
    r = client(app).post("/start", data={"worker_id": "prolific_5f3a.b@x"})
    assert r.status_code == 409 and "already completed" in r.text
    assert len(app.state.store.answers(app.state.study.run_key)) == 3  # type: ignore[attr-defined]


def test_progress_bar_counts_answers(app: object) -> None:
    c = client(app)
    begin(c, "w1")
    answer_current(c, "World")
    page = c.get("/task").text
    assert '<progress id="progress" max="3" value="1">' in page
    assert '<label for="progress">1 of 3 tasks answered</label>' in page


@pytest.mark.parametrize(
    "raw",
    [
        "<script>alert(1)</script>",
        '"><img src=x onerror=alert(1)>',
        "w1' onmouseover='alert(1)",
        "",
        " ",
        "x" * 101,
        "two words",
        "-leading-dash",
    ],
)
def test_worker_id_validated_and_echo_escaped(app: object, raw: str) -> None:
    assert valid_worker_id(raw) is None
    r = client(app).post("/start", data={"worker_id": raw})
    assert r.status_code == 400
    assert "not a valid worker ID" in r.text
    if raw.strip():
        assert str(escape(raw)) in r.text  # echoed, escaped
    assert "<script>alert" not in r.text and "<img src=x" not in r.text
    assert "onmouseover='alert" not in r.text
    prefill = client(app).get("/", params={"worker_id": raw}).text
    assert "<script>alert" not in prefill and "<img src=x" not in prefill


def test_answers_are_validated(app: object) -> None:
    c = client(app)
    begin(c, "w1")
    pos = int(POSITION.search(c.get("/task").text).group(1))
    bad = c.post("/answer", data={"position": str(pos), "answer": "<b>Weather</b>"})
    assert bad.status_code == 400 and "&lt;b&gt;Weather&lt;/b&gt;" in bad.text
    assert c.post("/answer", data={"position": "x", "answer": "World"}).status_code == 400
    assert c.post("/answer", data={"position": str(pos + 1), "answer": "World"}).status_code == 409
    assert c.post("/answer", data={"answer": "World"}).status_code == 400
    # A double submission is answered like the first and stored once.
    for _ in range(2):
        r = c.post("/answer", data={"position": str(pos), "answer": "World"})
        assert (r.status_code, r.headers["location"]) == (303, "/task")
    assert len(app.state.store.answers(app.state.study.run_key)) == 1  # type: ignore[attr-defined]
    # No session: refused.
    assert client(app).post("/answer", data={"position": "0", "answer": "World"}).status_code == 403


def test_task_text_is_escaped(app: object) -> None:
    c = client(app)
    begin(c, "w1")
    seen = []
    for _ in range(3):
        seen.append(c.get("/task").text)
        answer_current(c, "World")
    tricky = [p for p in seen if "AT&amp;T" in p]
    assert len(tricky) == 1  # sample s000 sits in every bundle once
    assert "&lt;a href=&#34;x&#34;&gt;AT&amp;T&lt;/a&gt;" in tricky[0]  # testing.TRICKY
    assert 'href="x"' not in tricky[0] and "AT&T" not in tricky[0]


def test_security_headers_and_no_inline_script(app: object) -> None:
    c = client(app)
    r = c.get("/")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    begin(c, "w1")
    for page in (c.get("/"), c.get("/instructions"), c.get("/task")):
        assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)
        assert not re.search(r"<[^>]+\son\w+=", page.text)  # no inline handlers
    assert "keydown" in c.get("/static/app.js").text


def test_admin_needs_the_token_never_a_worker_session(app: object) -> None:
    worker = client(app)
    begin(worker, "w1")
    answer_current(worker, "World")
    assert worker.get("/admin").status_code == 401
    assert worker.get("/admin/export.csv").status_code == 401
    assert worker.post("/admin/login", data={"token": "w1"}).status_code == 401
    assert (
        client(app).get("/admin", headers={"Authorization": "Bearer wrong-token"}).status_code
        == 401
    )
    admin = client(app)
    r = admin.post("/admin/login", data={"token": TOKEN})
    assert (r.status_code, r.headers["location"]) == (303, "/admin")
    page = admin.get("/admin")
    assert page.status_code == 200
    first = app.state.study.bundle_ids[0]  # type: ignore[attr-defined]  # handed out first
    assert re.search(
        rf"<th scope=\"row\">{first}</th>\s*<td class=\"status\">active</td>\s*<td>w1</td>",
        page.text,
    )
    assert '<span class="count">1/3</span>' in page.text
    assert '<span class="count">0/3</span>' in page.text
    assert "1 of 2 bundles assigned" in page.text
    csv = admin.get("/admin/export.csv")
    assert csv.status_code == 200 and "attachment" in csv.headers["content-disposition"]
    assert csv.text.splitlines()[0].startswith("worker_id,task_id,answer,started_at,submitted_at")
    bearer = client(app).get("/admin/export.csv", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.text == csv.text
    admin.post("/admin/logout")
    assert admin.get("/admin").status_code == 401


def test_admin_token_must_be_set(tmp_path: Path, tasks_dir: Path) -> None:
    with pytest.raises(ValueError, match="admin_token"):
        create_app(tasks_dir, AnnotateConfig(db=str(tmp_path / "x.sqlite"), admin_token=""))
    # the schema's own defaults are interpolations, for Hydra: refused, never used as such
    with pytest.raises(ValueError, match="not resolved"):
        create_app(tasks_dir, AnnotateConfig(db=str(tmp_path / "x.sqlite")))
    with pytest.raises(ValueError, match="not resolved"):
        create_app(tasks_dir, AnnotateConfig(admin_token=TOKEN))
    assert not (tmp_path / "x.sqlite").exists()


def test_the_app_is_built_from_the_annotate_config_as_composed(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    """One declaration of the settings (``saleval.config.annotate``): every
    ``annotate.*`` and ``crowd.*`` key reaches the app and its store as composed, under its
    own name, and only the admin token is put back from where it was read."""
    given = {
        "lease_minutes": 7.5,
        "max_claims_per_client": 2,
        "claim_window_minutes": 3.0,
        "completion_url": "https://platform.example/done?cc={code}",
        "allowed_origins": ["https://study.example.org"],
        "admin_max_failures": 4,
        "resume_max_failures": 3,
        "title": "Which topic?",
        "completion_code": "C0DE1234",
        "synchronous": "NORMAL",
        "secure_cookies": True,
    }
    overrides = [
        f"inputs.tasks={tasks_dir}",
        f"annotate.db={tmp_path / 'db.sqlite'}",
        "crowd.worker_id_case=sensitive",
        *(f"annotate.{k}={v!r}" for k, v in given.items() if isinstance(v, str)),
        *(f"annotate.{k}={v}" for k, v in given.items() if not isinstance(v, str | list)),
        "annotate.allowed_origins=['https://study.example.org']",
    ]
    cfg = make_cfg("annotate", overrides, name="serve")
    app = annotate_stage.build_app(load_study(tasks_dir), cfg, TOKEN)
    try:
        state, store = app.state.annotate, app.state.store
        assert state.settings == replace(to_schema(AnnotateConfig, cfg.annotate), admin_token=TOKEN)
        assert {k: getattr(state.settings, k) for k in given} == given
        assert store.settings is state.settings and store.path == tmp_path / "db.sqlite"
        assert store.crowd.worker_id_case == WorkerIdCase.sensitive
        assert store.synchronous == "NORMAL" and state.title == "Which topic?"
        assert (state.admin_throttle.limit, state.resume_throttle.limit) == (4, 3)
        assert state.allowed_origins == {"https://study.example.org"}
        codes = [
            client(app).post("/start", data={"worker_id": f"x{i}"}).status_code for i in (1, 2)
        ]
        assert codes == [303, 303]
        refused = client(app).post("/start", data={"worker_id": "x3"})
        assert refused.status_code == 429  # max_claims_per_client=2 from one address
        admin = client(app)
        admin.headers["Authorization"] = f"Bearer {TOKEN}"
        assert "Leases last 7.5 minutes" in admin.get("/admin").text
    finally:
        app.state.store.close()


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def test_annotation_settings_are_declared_once() -> None:
    """No dataclass of the app or its store restates a setting of the ``annotate`` schema
    with a default of its own (or renamed, as ``max_claims`` once was): they read
    :class:`AnnotateConfig` itself. (An assignment's ``completion_code``, a value with no
    default, is data, not a setting.)"""
    import importlib
    import pkgutil

    import saleval.annotate

    fields = {f.name for f in dataclasses.fields(AnnotateConfig)} | {"max_claims"}
    classes = [
        obj
        for info in pkgutil.iter_modules(saleval.annotate.__path__, "saleval.annotate.")
        for obj in vars(importlib.import_module(info.name)).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == info.name
    ]
    assert len(classes) >= 3, classes  # the modules were read (AppState, Assignment, ...)
    restated = {
        f"{c.__module__}.{c.__qualname__}": sorted(same)
        for c in classes
        if (same := fields & {f.name for f in dataclasses.fields(c) if _has_default(f)})
    }
    assert not restated, restated


def test_worker_id_is_escaped_in_admin_view(tmp_path: Path, tasks_dir: Path) -> None:
    # Ids are validated, but the admin page escapes anyway ('+' and '@' are allowed).
    app = create_app(tasks_dir, settings(tmp_path / "db.sqlite"))
    begin(client(app), "a+b@c.d")
    page = client(app).get("/admin", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert "<td>a+b@c.d</td>" in page
    app.state.store.close()


# -- the stage ---------------------------------------------------------------------------
def _fill(db: Path, tasks_dir: Path, answers: dict[str, list[str]]) -> None:
    app = create_app(tasks_dir, settings(db))
    for worker, given in answers.items():
        c = client(app)
        begin(c, worker)
        for ans in given:
            answer_current(c, ans)
    app.state.store.close()


def test_stage_export_writes_answers_and_logs(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    db = tmp_path / "db.sqlite"
    _fill(db, tasks_dir, {"w1": ["World", IDK, "Business"], "w2": ["Sports"]})
    cfg = make_cfg(
        "annotate",
        [
            f"inputs.tasks={tasks_dir}",
            "action=export",
            f"annotate.db={db}",
            "annotate.admin_token=very-secret-token",
        ],
    )
    out = annotate_stage.run(cfg)
    run_dir = Path(out["run_dir"])
    df = tables.ANSWERS.read(run_dir)
    assert len(df) == 4 and out["n_answers"] == 4 and out["n_bundles_completed"] == 1
    assert df.answer.tolist() == ["World", IDK, "Business", "Sports"]
    completions = pd.read_csv(run_dir / "completions.csv")
    assert completions.worker_id.tolist() == ["w1"]
    assert "very-secret-token" not in (run_dir / "config.yaml").read_text()
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["stage"] == "annotate"
    assert run.data.tags["dataset"] == "ag_news"
    assert run.data.tags["parent.tasks"] == load_study(tasks_dir).run_key
    assert "very-secret-token" not in str(run.data.params)
    assert run.data.metrics["n_exported"] == 4
    arts = {a.path for a in MlflowClient().list_artifacts(out["run_id"])}
    assert {"answers.csv", "completions.csv"} <= arts


def test_stage_export_fails_clearly(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    base = [f"inputs.tasks={tasks_dir}", "action=export"]
    with pytest.raises(FileNotFoundError, match="no such database"):
        annotate_stage.run(make_cfg("annotate", [*base, f"annotate.db={tmp_path / 'none.sqlite'}"]))
    other = make_task_run(tmp_path / "other", n_bundles=1, bundle_size=3)
    _fill(tmp_path / "o.sqlite", other, {})
    with pytest.raises(ValueError, match="holds no bundles of task set"):
        annotate_stage.run(
            make_cfg("annotate", [*base, f"annotate.db={tmp_path / 'o.sqlite'}"], name="b")
        )
    with pytest.raises(Exception, match="override action=print"):  # fails when composed
        make_cfg("annotate", [*base, "action=print"], name="c")


def test_export_imports_with_zero_rejected_rows(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    """The export is the import format: saleval-import in strict mode accepts every row."""
    from saleval.stages import import_

    tasks_dir = make_task_run(tmp_path / "tasks4", n_bundles=4, bundle_size=3)
    db = tmp_path / "db.sqlite"
    _fill(
        db,
        tasks_dir,
        {
            "w1": ["World", IDK, "Business"],
            "w2": ["Sports", "Sci/Tech", "World"],
            "w3": [IDK, IDK, "Sports"],
            "w4": ["Business"],  # unfinished bundle: its answer is exported too
        },
    )
    exported = annotate_stage.run(
        make_cfg(
            "annotate",
            [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}"],
            name="export",
        )
    )
    out = import_.run(
        make_cfg(
            "import",
            [
                f"inputs.tasks={tasks_dir}",
                f"inputs.answers={exported['run_dir']}",
                "crowd.policy=strict",
                "crowd.filters.min_bundle_seconds=null",
            ],
            name="import",
        )
    )
    rejects = tables.REJECTS.read(out["run_dir"])
    assert rejects.empty, rejects.to_string()
    annotations = tables.ANNOTATIONS.read(out["run_dir"])
    assert len(annotations) == 10
    assert out["n_rejected_rows"] == 0
    w1 = annotations[annotations.worker_id == "w1"].sort_values("task_id")
    assert sorted(w1.answer_code.tolist()) == sorted([1, 0, 3])  # World=1, IDK=0, Business=3


RESUME_CODE = re.compile(r'id="resume-code">([^<]+)<')


@pytest.mark.parametrize("case", ["insensitive", "sensitive"])
def test_one_worker_id_rule_from_login_to_the_scores(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], case: str
) -> None:
    """docs/annotate.md, *Worker identity*: "Ann " and later "ann" are one worker under the
    default ``crowd.worker_id_case`` — one bundle in the app (the second login must prove
    it is that worker, then continues the same bundle), one worker in the import and the
    scores; under ``sensitive`` they are two workers with two bundles."""
    from saleval.stages import import_, score

    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=3)
    db = tmp_path / "db.sqlite"
    base = [f"inputs.tasks={tasks_dir}", f"annotate.db={db}", f"crowd.worker_id_case={case}"]
    app = annotate_stage.build_app(
        load_study(tasks_dir), make_cfg("annotate", base, name="serve"), TOKEN
    )
    first = client(app)
    begin(first, "Ann ")
    code = RESUME_CODE.search(first.get("/task").text).group(1)
    answer_current(first, "World")
    later = client(app)
    again = later.post("/start", data={"worker_id": "ann"})
    if case == "insensitive":
        assert again.status_code == 409 and "Worker Ann already has a bundle" in again.text
        resumed = later.post("/start", data={"worker_id": "ann", "resume_code": code})
        assert resumed.status_code == 303
    else:
        assert again.status_code == 303  # another worker: the next free bundle
        assert later.post("/instructions").headers["location"] == "/task"
    for answer in ("Sports", "Business"):
        answer_current(later, answer)
    progress = app.state.store.progress(load_study(tasks_dir).run_key)
    app.state.store.close()
    held = progress.dropna(subset=["worker_id"])
    assert sorted(held.worker_id) == (["Ann"] if case == "insensitive" else ["Ann", "ann"])
    exported = annotate_stage.run(make_cfg("annotate", [*base, "action=export"], name="export"))
    imported = import_.run(
        make_cfg(
            "import",
            [f"inputs.tasks={tasks_dir}", f"inputs.answers={exported['run_dir']}",
             "crowd.filters.min_bundle_seconds=null", f"crowd.worker_id_case={case}"],
            name="import",
        )
    )  # fmt: skip
    annotations = tables.ANNOTATIONS.read(imported["run_dir"])
    assert (
        imported["n_workers"]
        == annotations.worker_id.nunique()
        == (1 if case == "insensitive" else 2)
    )
    scored = score.run(
        make_cfg(
            "score",
            [
                f"inputs.crowd={imported['run_dir']}",
                "scoring.bootstrap.n=10",
                "scoring.test_resamples=99",
            ],
            name="score",
        )
    )
    assert Path(scored["run_dir"], "scores.csv").is_file()
