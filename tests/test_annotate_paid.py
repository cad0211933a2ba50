"""A paid study over HTTP (no browser): the comprehension check, the attention-check
policy, the decisions and payments of the export, the pilot and the main study, and the
dashboard's figures, each against what scripted participants did.

The store's clock is the test's (:class:`tests.annotate_support.Clock`), so every time,
median and amount is known exactly.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval.annotate import paid_export, policy
from saleval.annotate.app import create_app
from saleval.annotate.comprehension import ComprehensionError, default_questions, read_questions
from saleval.annotate.dashboard import figures, metrics_of
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import IDK, Study, load_study, pilot_study
from saleval.pipeline import tables
from saleval.pipeline.records.run_record import RunRecord
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from saleval.testing.load_servers import free_port, start_cli_server, stop, wait_healthy
from tests.annotate_support import TOKEN, Clock, gold_truth, paid_settings, wrong_label

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building a task run logs to MLflow

POSITION = re.compile(r'name="position" value="(\d+)"')
STEP_S = 20.0  # seconds each scripted participant takes per task


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    """4 bundles of 5 tasks, 2 gold questions on top of each (7 tasks a bundle)."""
    return make_task_run(
        tmp_path_factory.mktemp("paid") / "tasks", n_bundles=4, bundle_size=5, gold_rate=0.4
    )


class Person:
    """One scripted participant in their own browser session (cookies), in-process
    (``app``) or over HTTP to a served ``url`` (then ``study``, ``questions`` and a
    ``store`` to read their bundle from are given)."""

    def __init__(
        self,
        app: Any,
        worker: str,
        clock: Clock | None,
        url: str | None = None,
        view: tuple[Study, list[Any], AnnotationStore] | None = None,
    ) -> None:
        self.worker, self.clock = worker, clock or Clock()
        if url is None:
            st = app.state.annotate
            self.c: Any = TestClient(app, follow_redirects=False)
            self.study, self.questions, self.store = st.study, st.questions, st.store
        else:
            assert view is not None
            self.c = httpx.Client(base_url=url, follow_redirects=False)
            self.study, self.questions, self.store = view
        self.truth = gold_truth(self.study)

    def start(self) -> str:
        r = self.c.post("/start", data={"worker_id": self.worker})
        assert r.status_code in (303, 403), r.text
        return r.headers.get("location", f"{r.status_code}")

    def check(self, right: bool) -> Any:
        """One comprehension attempt: every answer right, or the first one wrong."""
        qs = self.questions
        data = {f"q{i}": q.answer for i, q in enumerate(qs)}
        if not right:
            data["q0"] = next(o for o in qs[0].options if o != qs[0].answer)
        self.clock.advance(60)
        return self.c.post("/comprehension", data=data)

    def bundle(self) -> str:
        held = self.store.assignments(self.study.run_key)
        mine = held[(held.worker_id == self.worker) & held.released_at.isna()]
        return str(mine.bundle_id.iloc[-1])

    def answer(self, n: int | None = None, gold_wrong: int = 0) -> list[str]:
        """Answer ``n`` tasks (None: to the end); the first ``gold_wrong`` gold questions
        get a wrong label, the others the right one; every other task the first label.
        Returns where each answer led."""
        led = []
        while n is None or len(led) < n:
            page = self.c.get("/task")
            if page.status_code != 200:
                led.append(page.headers.get("location", str(page.status_code)))
                break
            pos = int(POSITION.search(page.text).group(1))  # type: ignore[union-attr]
            right = self.truth[(self.bundle(), pos)]
            if right is None:
                given = self.study.label_names[0]
            elif gold_wrong > 0:
                given, gold_wrong = wrong_label(self.study, right), gold_wrong - 1
            else:
                given = right
            self.clock.advance(STEP_S)
            r = self.c.post("/answer", data={"position": str(pos), "answer": given})
            led.append(r.headers["location"])
            if r.headers["location"] != "/task":
                break
        return led


def words(html: str) -> str:
    """The page's text as a reader sees it: entities decoded, whitespace runs as single
    spaces (templates wrap lines)."""
    return " ".join(unescape(html).split())


def serve(root: Path, tasks_dir: Path, study: Study | None = None, **fields: Any) -> Any:
    app = create_app(study or load_study(tasks_dir), paid_settings(root / "db.sqlite", **fields))
    app.state.clock = Clock()
    app.state.store.clock = app.state.clock
    return app


def export(
    make_cfg: Callable[..., DictConfig], tasks_dir: Path, db: Path, *extra: str
) -> dict[str, Any]:
    overrides = [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}"]
    overrides += ["annotate.comprehension.enabled=true", "annotate.comprehension.attempts=2"]
    overrides += ["annotate.pay.seconds_per_task=30", "annotate.pay.hourly_rate=12"]
    overrides += ["annotate.pay.fee=0.25", "annotate.pay.gold_bonus=0.05"]
    return annotate_stage.run(make_cfg("annotate", [*overrides, *extra]))


def test_comprehension_comes_before_any_bundle_and_allows_two_attempts(
    tmp_path: Path, tasks_dir: Path
) -> None:
    app = serve(tmp_path, tasks_dir)
    store: AnnotationStore = app.state.store
    ann = Person(app, "ann", app.state.clock)
    assert ann.start() == "/comprehension"
    assert store.progress(app.state.annotate.study.run_key)["worker_id"].isna().all()
    page = ann.c.get("/comprehension")
    assert 'attempt <strong id="attempt">1 of 2</strong>' in words(page.text)
    for q in app.state.annotate.questions:  # the instructions' own words are asked
        assert q.prompt in words(page.text) and q.answer in q.options
    again = ann.check(right=False)
    assert again.status_code == 200 and "1 of 3 answer was not right" in words(again.text)
    assert 'attempt <strong id="attempt">2 of 2</strong>' in words(again.text)
    assert ann.c.get("/task").headers["location"] == "/"  # still no bundle
    passed = ann.check(right=True)
    assert passed.headers["location"] == "/task"  # the instructions were on the check's page
    assert ann.c.get("/task").status_code == 200
    attempts = store.comprehension_attempts(app.state.annotate.study.run_key)
    assert attempts["passed"].tolist() == [0, 1] and json.loads(attempts["wrong"][0]) == [0]

    bob = Person(app, "bob", app.state.clock)
    bob.start()
    bob.check(right=False)
    out = bob.check(right=False)
    assert out.headers["location"] == "/returned"
    page = bob.c.get("/returned")
    assert "SCREEN01" in page.text and "Please return this study" in page.text
    assert bob.start() == "/returned"  # never a bundle, however they come back
    assert bob.check(right=True).headers["location"] == "/returned"
    assert "bob" not in set(store.assignments(app.state.annotate.study.run_key)["worker_id"])
    with pytest.raises(Exception, match="ended"):
        store.assign(app.state.annotate.study.run_key, "bob")
    app.state.store.close()


def test_two_failed_attention_checks_end_the_session_and_free_the_bundle(
    tmp_path: Path, tasks_dir: Path
) -> None:
    app = serve(tmp_path, tasks_dir, comprehension={"enabled": False})
    st = app.state.annotate
    one = Person(app, "one-slip", app.state.clock)
    assert one.start() == "/instructions"
    one.c.post("/instructions")
    assert one.answer(gold_wrong=1)[-1] == "/done"  # one failure: never flagged
    cat = Person(app, "cat", app.state.clock)
    cat.start()
    cat.c.post("/instructions")
    bundle = cat.bundle()
    led = cat.answer(gold_wrong=2)
    assert led[-1] == "/returned"
    assert "attention-check" in cat.c.get("/returned").text
    assert cat.c.get("/task").headers["location"] == "/returned"
    assert cat.start() == "/returned"
    released = st.store.released(st.study.run_key)
    assert released[["bundle_id", "worker_id", "released_reason"]].values.tolist() == [
        [bundle, "cat", "attention"]
    ]
    dan = Person(app, "dan", app.state.clock)  # the freed bundle is served again
    dan.start()
    dan.c.post("/instructions")
    assert dan.bundle() == bundle
    app.state.store.close()


def test_the_export_lists_each_decision_and_pays_what_each_did(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    app = serve(tmp_path, tasks_dir)
    clock: Clock = app.state.clock
    st = app.state.annotate
    people = {w: Person(app, w, clock) for w in ("ann", "bea", "cy", "dee", "eve")}
    people["ann"].start(), people["ann"].check(True), people["ann"].answer()
    people["bea"].start(), people["bea"].check(False), people["bea"].check(True)
    people["bea"].answer()
    people["cy"].start(), people["cy"].check(False), people["cy"].check(False)
    people["dee"].start(), people["dee"].check(True), people["dee"].answer(gold_wrong=2)
    people["eve"].start(), people["eve"].check(True), people["eve"].answer(n=3)
    clock.advance(2 * 3600)  # eve's lease runs out: she left
    st.store.expire_leases(st.study.run_key)
    app.state.store.close()

    out = export(make_cfg, tasks_dir, tmp_path / "db.sqlite")
    run = Path(out["run_dir"])
    table = pd.read_csv(run / paid_export.PARTICIPANTS).set_index("worker_id")
    assert table["decision"].to_dict() == {
        "ann": "approve",
        "bea": "approve",
        "cy": "return",
        "dee": "reject",
        "eve": "return",
    }
    assert table.at["dee", "reason"].startswith("failed 2 of 2 attention checks")
    assert "comprehension" in table.at["cy", "reason"]
    assert table.at["eve", "reason"] == "did not finish: 3 of 7 answered"
    reward = round(7 * 30 / 3600 * 12, 2)  # 7 tasks at 30 s and 12 an hour: 0.70
    assert table.loc[["ann", "bea"], "reward"].tolist() == [reward, reward]
    assert table.loc[["ann", "bea"], "bonus"].tolist() == [0.10, 0.10]  # 2 gold right each
    assert table.at["eve", "bonus"] == round(reward * 3 / 7, 2)
    assert pd.read_csv(run / paid_export.APPROVALS)["worker_id"].tolist() == ["ann", "bea"]
    rej = pd.read_csv(run / paid_export.REJECTIONS)
    assert rej["worker_id"].tolist() == ["dee"] and "attention" in rej["reason"][0]
    bonus = pd.read_csv(run / paid_export.BONUSES, dtype={"amount": str})
    assert bonus[["worker_id", "amount"]].values.tolist() == [
        ["ann", "0.10"],
        ["bea", "0.10"],
        ["eve", f"{round(reward * 3 / 7, 2):.2f}"],
    ]
    assert (run / paid_export.PROLIFIC_APPROVE).read_text() == "ann\nbea\n"
    assert (run / paid_export.PROLIFIC_BONUS).read_text().splitlines()[0] == "ann,0.10"
    pay = json.loads((run / paid_export.PAYMENTS).read_text())
    assert pay["rewards"] == 2 * reward
    assert pay["total"] == round((2 * reward + 0.20 + round(reward * 3 / 7, 2)) * 1.25, 2)
    # every bundle completed at the reward: the planner's cost of the same answers
    assert pay["cost_at_reward"] == pytest.approx(pay["planned_cost"], abs=0.005 * 4 * 1.25)
    assert pay["planned_cost"] == round(4 * 7 * 30 / 3600 * 12 * 1.25, 2)
    answers = tables.ANSWERS.read(run)
    assert "dee" not in set(answers["worker_id"])  # flagged: left out (export.exclude_rejected)
    assert set(answers["worker_id"]) == {"ann", "bea", "eve"}
    metrics = MlflowClient().get_run(out["run_id"]).data.metrics
    assert metrics["n_approve"] == 2 and metrics["pay_total"] == pay["total"]


def test_a_pilot_measures_time_and_the_main_study_refuses_its_participants(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    full = load_study(tasks_dir)
    pilot = pilot_study(full, 2)
    assert pilot.bundle_ids == full.bundle_ids[:2] and pilot.run_key.endswith("/pilot")
    app = serve(tmp_path, tasks_dir, pilot)
    for w in ("p1", "p2"):
        p = Person(app, w, app.state.clock)
        p.start(), p.check(True), p.answer()
    p3 = Person(app, "p3", app.state.clock)
    p3.start(), p3.check(False), p3.check(False)
    app.state.store.close()
    out = export(make_cfg, tasks_dir, tmp_path / "db.sqlite", "annotate.phase=pilot")
    run = Path(out["run_dir"])
    report = json.loads((run / paid_export.PILOT).read_text())
    assert report["median_task_s"] == STEP_S
    assert report["median_bundle_s"] == 7 * STEP_S  # the check's minute is before the bundle
    assert report["median_submission_s"] == 60 + 7 * STEP_S
    assert report["reward_for_hourly_rate"] == round(12 * (60 + 7 * STEP_S) / 3600, 2)
    assert report["comprehension_pass_rate"] == round(2 / 3, 2)
    assert report["gold_accuracy"] == 1.0
    assert report["main_cost_at_pilot_times"] == round(28 * STEP_S / 3600 * 12 * 1.25, 2)
    assert "Median seconds per task: 20.0" in (run / paid_export.PILOT_MD).read_text()

    # the main study: the same database, every bundle free, the pilot's people refused
    main = annotate_stage.build_app(
        full,
        make_cfg(
            "annotate", [f"inputs.tasks={tasks_dir}", f"annotate.db={tmp_path / 'db.sqlite'}"]
        ),
        "admin-token-for-tests",
        annotate_stage.read_pilot(run),
    )
    assert main.state.annotate.seconds_hint == STEP_S
    assert main.state.store.progress(full.run_key)["worker_id"].isna().all()
    refused = Person(main, "P1", Clock()).c.post("/start", data={"worker_id": "P1"})
    assert refused.status_code == 403 and "pilot" in refused.text
    assert Person(main, "new", Clock()).start() == "/instructions"
    main.state.store.close()
    main_run = export(
        make_cfg, tasks_dir, tmp_path / "db.sqlite", f"inputs.pilot={run}", "action=export"
    )
    record = RunRecord.read(main_run["run_dir"])
    assert Path(str(record.parent_dirs["pilot"])).resolve() == run.resolve()


def test_the_dashboard_shows_what_the_participants_did(tmp_path: Path, tasks_dir: Path) -> None:
    app = serve(tmp_path, tasks_dir)
    clock: Clock = app.state.clock
    ann, bob, cy = (Person(app, w, clock) for w in ("ann", "bob", "cy"))
    ann.start(), ann.check(True), ann.answer()
    bob.start(), bob.check(False), bob.check(False)
    cy.start(), cy.check(True), cy.answer(n=2, gold_wrong=1)
    st = app.state.annotate
    f = figures(st.store, st.study, st.settings, st.seconds_hint, now=clock.now)
    assert (f["bundles"], f["bundles_done"], f["bundles_leased"], f["bundles_free"]) == (4, 1, 1, 2)
    assert f["answers"] == 9 and f["median_task_s"] == STEP_S
    assert f["comprehension_failures"] == 2 and f["screened_out"] == 1
    assert f["comprehension_pass_rate"] == pytest.approx(2 / 3)
    elapsed = (clock.now - Clock().now).total_seconds() / 60
    assert f["elapsed_minutes"] == pytest.approx(elapsed)
    assert f["answers_per_minute"] == pytest.approx(9 / 10)  # all within the last 10 min
    people = f["participants"].set_index("worker_id")
    assert people.at["ann", "gold_accuracy"] == 1.0
    reward = round(7 * 30 / 3600 * 12, 2)
    assert f["spent"] == round((reward + 0.10) * 1.25, 2)
    assert f["projected_total"] == round(f["spent"] + 3 * reward * 1.25, 2)
    assert set(metrics_of(f)) >= {"dashboard_bundles_done", "dashboard_spent"}
    c = TestClient(app, follow_redirects=False)
    assert c.get("/admin/dashboard").status_code == 401  # behind the admin token
    auth = {"Authorization": "Bearer admin-token-for-tests"}
    page = c.get("/admin/dashboard", headers=auth)
    assert 'http-equiv="refresh"' in page.text and ">1 of 4<" in page.text
    body = c.get("/admin/dashboard.json", headers=auth).json()
    assert body["bundles_done"] == 1 and len(body["participants"]) == 3
    app.state.store.close()


def test_a_version_2_database_gains_the_participant_tables(tmp_path: Path) -> None:
    db = tmp_path / "v2.sqlite"
    AnnotationStore(db).close()
    con = sqlite3.connect(db)
    con.execute("DROP TABLE comprehension_attempts")
    con.execute("DROP TABLE participants")
    con.execute("UPDATE meta SET value='2'")
    con.commit()
    con.close()
    store = AnnotationStore(db)
    assert store.participants("any").empty
    store.close()
    assert sqlite3.connect(db).execute("SELECT value FROM meta").fetchone()[0] == "3"


def test_own_questions_are_read_with_row_and_field_named(tmp_path: Path) -> None:
    good = tmp_path / "q.yaml"
    good.write_text(
        "- question: Hidden words are shown as?\n  options: [dots, stars]\n  answer: dots\n"
    )
    assert read_questions(good)[0].answer == "dots"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- question: a?\n  options: [x, y]\n  answer: z\n")
    with pytest.raises(ComprehensionError, match=r"entry 1, field 'answer': 'z' is not one of"):
        read_questions(bad)


def test_idk_on_a_gold_question_fails_only_when_the_study_says(tasks_dir: Path) -> None:
    study = load_study(tasks_dir)
    gold = study.tasks[study.tasks["is_gold"].astype(bool)]
    task = str(gold.index[0])
    answers = pd.DataFrame({"worker_id": ["w"], "task_id": [task], "answer": [IDK]})
    assert not policy.gold_answers(answers, study, idk_fails=False)["failed"].any()
    assert policy.gold_answers(answers, study, idk_fails=True)["failed"].all()


def test_the_serving_run_logs_the_dashboard_figures_to_mlflow_as_it_goes(
    tmp_path: Path, tasks_dir: Path
) -> None:
    """The logger's thread logs every interval, and the last figures at the end."""
    import time

    import mlflow

    from saleval.annotate.dashboard import MetricsLogger

    app = serve(tmp_path, tasks_dir, comprehension={"enabled": False})
    st = app.state.annotate
    ann = Person(app, "ann", app.state.clock)
    ann.start()
    ann.c.post("/instructions")
    with mlflow.start_run() as run:
        compute = lambda: figures(st.store, st.study, st.settings, st.seconds_hint)  # noqa: E731
        with MetricsLogger(compute, run.info.run_id, every_s=0.2):
            time.sleep(0.7)
            ann.answer()
    history = MlflowClient().get_metric_history(run.info.run_id, "dashboard_bundles_done")
    assert len(history) >= 3  # the interval's, then the final one
    assert history[0].value == 0 and history[-1].value == 1
    app.state.store.close()


def test_the_documented_commands_run_a_pilot_then_a_main_study(
    tmp_path: Path, tasks_dir: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    """saleval-annotate (the console script) serves the pilot, its export reports it, and
    the main study served with inputs.pilot refuses the pilot's participants."""
    db = tmp_path / "db.sqlite"
    paid = ["annotate.comprehension.enabled=true", "annotate.pay.reward=0.80"]
    full = load_study(tasks_dir)
    pilot = pilot_study(full, 2)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "pilot").mkdir()
    pilot_args = ["annotate.phase=pilot", "annotate.pilot.bundles=2", *paid]
    proc = start_cli_server(tasks_dir, db, port, TOKEN, tmp_path / "pilot", overrides=pilot_args)
    try:
        wait_healthy(url, proc)
        reader = AnnotationStore(db, readonly=True)
        view = (pilot, default_questions(pilot.target, pilot.run_key), reader)
        p1 = Person(None, "p1", None, url, view)
        assert p1.start() == "/comprehension"
        assert p1.check(True).headers["location"] == "/task"
        assert p1.answer()[-1] == "/done"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        live = httpx.get(f"{url}/admin/dashboard.json", headers=auth).json()
        assert (live["bundles"], live["bundles_done"], live["answers"]) == (2, 1, 7)
        reader.close()
    finally:
        stop(proc)
    assert proc.returncode == 0
    out = annotate_stage.run(
        make_cfg(
            "annotate",
            [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}", *pilot_args],
        )
    )
    report = json.loads((Path(out["run_dir"]) / paid_export.PILOT).read_text())
    assert report["bundles_completed"] == 1 and report["reward"] == 0.80

    (tmp_path / "main").mkdir()
    main_args = [f"inputs.pilot={out['run_dir']}", *paid]
    proc = start_cli_server(tasks_dir, db, port, TOKEN, tmp_path / "main", overrides=main_args)
    try:
        wait_healthy(url, proc)
        again = httpx.post(f"{url}/start", data={"worker_id": "p1"})
        assert again.status_code == 403 and "pilot" in again.text
        assert httpx.post(f"{url}/start", data={"worker_id": "m1"}).status_code == 303
    finally:
        stop(proc)
    client = MlflowClient()
    serve_run = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        "tags.stage = 'annotate' and tags.`annotate.phase` = 'pilot' "
        "and tags.`annotate.action` = 'serve'",
    )[0]
    assert serve_run.data.metrics["dashboard_bundles_done"] == 1  # logged at the end at least
