"""Leases, identity and web hygiene of the annotation app (issue: real crowd studies).

A bundle whose worker left goes back to the pool after its lease; a worker ID alone
never opens someone else's session; every state-changing POST checks its origin; every
error page carries the security headers and says whether the answer was saved.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pytest
from fastapi.testclient import TestClient

from saleval.annotate.app import create_app
from saleval.annotate.security import SECURITY_HEADERS
from saleval.annotate.store_answers import AnnotationStore, AnswerRejected
from saleval.annotate.store_leases import BundleRefused
from saleval.annotate.study import Study, load_study
from saleval.config.annotate import AnnotateConfig
from saleval.testing import make_task_run
from tests.annotate_support import TOKEN, settings

pytestmark = pytest.mark.usefixtures("mlflow_uri")  # building a task run logs to MLflow

POSITION = re.compile(r'name="position" value="(\d+)"')
RESUME = re.compile(r'id="resume-code">([^<]+)<')


class Clock:
    """A settable clock: leases run out without sleeping."""

    def __init__(self) -> None:
        self.t = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t

    def advance(self, minutes: float) -> None:
        self.t += timedelta(minutes=minutes)


@pytest.fixture
def study(tmp_path: Path) -> Study:
    return load_study(make_task_run(tmp_path / "tasks", n_bundles=3, bundle_size=3))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, study: Study, clock: Clock) -> Iterator[AnnotationStore]:
    s = AnnotationStore(
        tmp_path / "db.sqlite",
        AnnotateConfig(lease_minutes=30, max_claims_per_client=0),
        clock=clock,
    )
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    yield s
    s.close()


def answer_next(s: AnnotationStore, a_id: int, answer: str = "World") -> int:
    a = s._get(s._conn(), a_id)
    nxt = s.next_task(a)
    assert nxt is not None
    assert s.record_answer(a_id, nxt.position, answer).stored
    return nxt.position


# -- leases in the store ------------------------------------------------------------------
def test_bot_claims_everything_then_after_the_lease_a_real_worker_gets_a_bundle(
    store: AnnotationStore, study: Study, clock: Clock
) -> None:
    bots = [store.assign(study.run_key, f"bot{i}") for i in range(3)]
    with pytest.raises(BundleRefused) as full:
        store.assign(study.run_key, "real")
    assert full.value.status == 410
    answer_next(store, bots[0].assignment_id)  # the bot answered one task and left
    clock.advance(29)
    with pytest.raises(BundleRefused):
        store.assign(study.run_key, "real")  # leases still running
    clock.advance(2)
    a = store.assign(study.run_key, "real")
    assert a.bundle_id == study.bundle_ids[0]  # file order: the first released bundle
    progress = store.progress(study.run_key)
    assert progress.status.tolist() == ["active", "free", "free"]
    released = store.released(study.run_key)
    assert sorted(released.worker_id) == ["bot0", "bot1", "bot2"]
    assert set(released.released_reason) == {"expired"}
    # The bot's acknowledged answer is kept (and exported); the new worker starts afresh.
    answers = store.answers(study.run_key)
    assert answers.worker_id.tolist() == ["bot0"] and not answers.bundle_complete.any()
    assert store.next_task(a).index == 0


def test_an_answer_renews_the_lease(store: AnnotationStore, study: Study, clock: Clock) -> None:
    a = store.assign(study.run_key, "slow")
    for _ in range(2):
        clock.advance(25)
        answer_next(store, a.assignment_id)
    clock.advance(25)
    assert store.expire_leases(study.run_key) == 0
    clock.advance(6)
    assert store.expire_leases(study.run_key) == 1


def test_late_answer_after_expiry_is_kept_if_nobody_took_the_bundle(
    store: AnnotationStore, study: Study, clock: Clock
) -> None:
    a = store.assign(study.run_key, "w1")
    store.next_task(a)
    first = answer_next(store, a.assignment_id)
    nxt = store.next_task(a)
    clock.advance(31)
    assert store.expire_leases(study.run_key) == 1
    # Nobody claimed the bundle: the late answer takes it back and is stored.
    assert store.record_answer(a.assignment_id, nxt.position, "Sports").stored
    assert store.progress(study.run_key).status.iloc[0] == "active"
    assert store.answers(study.run_key).position.tolist() == [first, nxt.position]


def test_late_answer_after_reassignment_is_refused_clearly_and_nothing_is_lost(
    store: AnnotationStore, study: Study, clock: Clock
) -> None:
    a = store.assign(study.run_key, "w1")
    answer_next(store, a.assignment_id)
    nxt = store.next_task(a)
    clock.advance(31)
    b = store.assign(study.run_key, "w2")
    assert b.bundle_id == a.bundle_id  # the expired bundle went to w2
    with pytest.raises(AnswerRejected) as late:
        store.record_answer(a.assignment_id, nxt.position, "Sports")
    assert late.value.status == 410
    assert "NOT saved" in late.value.reason and "1 earlier answer is saved" in late.value.reason
    with pytest.raises(BundleRefused, match="went to another worker"):
        store.reclaim(a.assignment_id)
    answers = store.answers(study.run_key)
    assert answers.worker_id.tolist() == ["w1"]  # the first answer is kept
    # w1 starting again gets a bundle without the task they already answered.
    c = store.assign(study.run_key, "w1")
    done_task = answers.task_id.iloc[0]
    items = study.bundles[study.bundles.bundle_id == c.bundle_id].task_id
    assert c.bundle_id != a.bundle_id and done_task not in set(items)


def test_admin_release_and_reassign(store: AnnotationStore, study: Study) -> None:
    a = store.assign(study.run_key, "w1")
    answer_next(store, a.assignment_id)
    r = store.release(study.run_key, a.bundle_id)
    assert r.released_reason == "admin"
    with pytest.raises(BundleRefused, match="organiser released"):
        store.reclaim(a.assignment_id)
    with pytest.raises(BundleRefused, match="not assigned"):
        store.release(study.run_key, a.bundle_id)
    b = store.reassign(study.run_key, a.bundle_id, "w9")
    assert b.bundle_id == a.bundle_id and b.worker_id == "w9"
    c = store.reassign(study.run_key, a.bundle_id, "w8")  # releases w9 in the same transaction
    assert c.worker_id == "w8"
    assert store.released(study.run_key).released_reason.tolist() == [
        "admin",
        "reassigned",
    ]
    with pytest.raises(BundleRefused, match="not part of task set"):
        store.reassign(study.run_key, "no-such-bundle", "w7")


def test_claims_per_client_are_bounded(tmp_path: Path, study: Study) -> None:
    s = AnnotationStore(tmp_path / "c.sqlite", AnnotateConfig(max_claims_per_client=2))
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    s.assign(study.run_key, "x1", client="10.0.0.1")
    s.assign(study.run_key, "x2", client="10.0.0.1")
    with pytest.raises(BundleRefused) as info:
        s.assign(study.run_key, "x3", client="10.0.0.1")
    assert info.value.status == 429
    assert s.assign(study.run_key, "y1", client="10.0.0.2").worker_id == "y1"
    s.close()


def test_many_threads_claiming_never_share_a_bundle(tmp_path: Path) -> None:
    st = load_study(make_task_run(tmp_path / "many", n_bundles=12, bundle_size=2, seed=3))
    s = AnnotationStore(tmp_path / "m.sqlite", AnnotateConfig(max_claims_per_client=0))
    s.register_run(st.run_key, st.dataset, str(st.tasks_dir), st.bundles)
    got: list[str] = []
    refused: list[int] = []
    barrier = threading.Barrier(30)

    def claim(i: int) -> None:
        barrier.wait()
        try:
            got.append(s.assign(st.run_key, f"t{i}").bundle_id)
        except BundleRefused as r:
            refused.append(r.status)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(st.bundle_ids) and refused == [410] * 18
    s.close()


def _race_once(db: Path, study: Study, first: Literal["answer", "claim"] | None = None) -> bool:
    """One round: a claim that releases h0's expired bundle against h0's late answer.

    ``first``: ``"answer"`` or ``"claim"`` runs the two one after the other in that order,
    so each order is met on every run; None starts them together, and the scheduler picks.
    True when the late answer was stored."""
    clock = Clock()
    s = AnnotationStore(db, AnnotateConfig(lease_minutes=1, max_claims_per_client=0), clock=clock)
    s.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)
    holders = [s.assign(study.run_key, f"h{i}") for i in range(3)]
    a = holders[0]
    nxt = s.next_task(a)
    assert nxt is not None
    clock.advance(2)
    for h in holders[1:]:  # the other two answer, so only h0's lease has run out
        s.record_answer(h.assignment_id, s.next_task(h).position, "World")  # type: ignore[union-attr]
    result: dict[str, object] = {}
    barrier = threading.Barrier(2 if first is None else 1)  # in turn: nobody to wait for

    def late() -> None:
        barrier.wait()
        try:
            result["answer"] = s.record_answer(a.assignment_id, nxt.position, "Sports").stored
        except AnswerRejected as r:
            result["answer"] = r.status

    def claim() -> None:
        barrier.wait()
        try:
            result["claim"] = s.assign(study.run_key, "newcomer").bundle_id
        except BundleRefused as r:
            result["claim"] = r.status

    if first is None:
        threads = [threading.Thread(target=late), threading.Thread(target=claim)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for step in (late, claim) if first == "answer" else (claim, late):
            step()
    stored = s.answers(study.run_key)
    h0 = stored[stored.worker_id == "h0"]
    if result["answer"] is True:  # the answer committed first: h0 keeps the bundle
        assert len(h0) == 1 and result["claim"] != a.bundle_id
    else:  # the claim committed first: refused, nothing written, the bundle moved
        assert result["answer"] == 410 and h0.empty
        assert result["claim"] == a.bundle_id
    shared = s._conn().execute(
        "SELECT bundle_id FROM assignments WHERE released_at IS NULL "
        "GROUP BY bundle_id HAVING COUNT(*) > 1"
    )
    assert shared.fetchall() == []
    s.close()
    return result["answer"] is True


def test_expiry_racing_a_late_answer_loses_nothing_and_never_shares(
    tmp_path: Path, study: Study
) -> None:
    """Whichever transaction commits first wins; never both, never a lost acknowledgement.

    Each order is forced once, so both outcomes are checked on every run (the scheduler
    alone may pick one order every time); the concurrent rounds then check that racing
    for real gives one of those two outcomes, each consistent (``_race_once``)."""
    assert _race_once(tmp_path / "answer_first.sqlite", study, first="answer") is True
    assert _race_once(tmp_path / "claim_first.sqlite", study, first="claim") is False
    for i in range(12):
        _race_once(tmp_path / f"race{i}.sqlite", study)


def test_version_1_database_is_upgraded_in_place(tmp_path: Path, study: Study) -> None:
    db = tmp_path / "v1.sqlite"
    con = sqlite3.connect(db)
    v1 = """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE runs (run_key TEXT PRIMARY KEY, dataset TEXT NOT NULL, tasks_dir TEXT NOT NULL,
      n_bundles INTEGER NOT NULL, registered_at TEXT NOT NULL);
    CREATE TABLE assignments (assignment_id INTEGER PRIMARY KEY, run_key TEXT NOT NULL
      REFERENCES runs (run_key), dataset TEXT NOT NULL, bundle_id TEXT NOT NULL,
      worker_id TEXT NOT NULL, session_token TEXT NOT NULL UNIQUE, n_tasks INTEGER NOT NULL,
      assigned_at TEXT NOT NULL, instructions_at TEXT, completed_at TEXT, completion_code TEXT,
      CONSTRAINT one_bundle_per_worker_per_dataset UNIQUE (worker_id, dataset),
      CONSTRAINT one_worker_per_bundle UNIQUE (run_key, bundle_id));
    CREATE TABLE answers (assignment_id INTEGER NOT NULL REFERENCES assignments (assignment_id),
      position INTEGER NOT NULL, task_id TEXT NOT NULL, answer TEXT NOT NULL,
      started_at TEXT NOT NULL, submitted_at TEXT NOT NULL, PRIMARY KEY (assignment_id, position));
    INSERT INTO meta VALUES ('schema_version', '1');
    INSERT INTO runs VALUES ('rk', 'ag_news', '/x', 3, 't');
    INSERT INTO assignments VALUES (1, 'rk', 'ag_news', 'b1', 'old', 'tok', 3, 't', 't', NULL, NULL);
    INSERT INTO answers VALUES (1, 0, 'task-a', 'World', 't', 't');
    """
    con.executescript(v1)
    con.close()
    s = AnnotationStore(db)
    a = s.by_session("tok")
    assert a is not None and len(a.resume_code) == 9 and not a.released
    row = s._conn().execute("SELECT * FROM answers").fetchone()
    assert tuple(row) == (1, 0, "task-a", "World", "t", "t")
    assert s._conn().execute("PRAGMA foreign_key_check").fetchall() == []
    fks = s._conn().execute("PRAGMA foreign_key_list(answers)").fetchall()
    assert [f["table"] for f in fks] == ["assignments"]
    s.close()


# -- identity and hygiene over HTTP --------------------------------------------------------
@pytest.fixture
def app(tmp_path: Path, study: Study) -> Iterator[object]:
    app = create_app(study, settings(tmp_path / "app.sqlite"))
    yield app
    app.state.store.close()


def client(app: object) -> TestClient:
    return TestClient(app, follow_redirects=False, raise_server_exceptions=False)  # type: ignore[arg-type]


def start(c: TestClient, worker: str, **form: str) -> str:
    r = c.post("/start", data={"worker_id": worker, **form})
    assert r.status_code == 303, r.text
    c.post("/instructions")
    return RESUME.search(c.get("/task").text).group(1)


def test_worker_id_alone_never_hands_out_a_session(app: object) -> None:
    owner = client(app)
    code = start(owner, "w1")
    thief = client(app)
    r = thief.post("/start", data={"worker_id": "w1"})
    assert r.status_code == 409 and "set-cookie" not in r.headers
    assert "resume code" in r.text and 'id="resume_code"' in r.text
    assert thief.get("/task").headers["location"] == "/"
    wrong = thief.post("/start", data={"worker_id": "w1", "resume_code": "AAAA-AAAA"})
    assert wrong.status_code == 409 and "set-cookie" not in wrong.headers
    # The code from the task page resumes the same bundle in another browser.
    ok = thief.post("/start", data={"worker_id": "w1", "resume_code": code.lower()})
    assert ok.status_code == 303 and ok.headers["location"] == "/task"
    assert POSITION.search(thief.get("/task").text)
    # The owner's own browser resumes with its cookie.
    assert owner.post("/start", data={"worker_id": "w1"}).status_code == 303


def test_resume_code_guessing_is_throttled(tmp_path: Path, study: Study) -> None:
    app = create_app(study, settings(tmp_path / "t.sqlite", resume_max_failures=3))
    start(client(app), "w1")
    guesser = client(app)
    codes = [
        guesser.post("/start", data={"worker_id": "w1", "resume_code": f"GUESS{i}"}).status_code
        for i in range(5)
    ]
    assert codes == [409, 409, 409, 429, 429]
    app.state.store.close()


def test_prolific_link_mode_identity_and_completion_redirect(tmp_path: Path, study: Study) -> None:
    url = "https://app.prolific.com/submissions/complete?cc={code}"
    app = create_app(
        study, settings(tmp_path / "p.sqlite", completion_url=url, completion_code="C0DE")
    )
    c = client(app)
    page = c.get("/", params={"PROLIFIC_PID": "5f3a9", "STUDY_ID": "s1", "SESSION_ID": "sess-x"})
    assert 'value="5f3a9"' in page.text and 'name="session_id" value="sess-x"' in page.text
    form = {"study_id": "s1", "session_id": "sess-x"}
    start(c, "5f3a9", **form)
    # The same Prolific session in a fresh browser resumes; another session does not.
    assert client(app).post("/start", data={"worker_id": "5f3a9", **form}).status_code == 303
    other = client(app).post("/start", data={"worker_id": "5f3a9", "session_id": "sess-y"})
    assert other.status_code == 409
    for _ in range(3):
        pos = POSITION.search(c.get("/task").text).group(1)
        r = c.post("/answer", data={"position": pos, "answer": "World"})
    assert r.headers["location"] == "/done"
    done = c.get("/done")
    assert done.status_code == 303
    assert done.headers["location"] == "https://app.prolific.com/submissions/complete?cc=C0DE"
    app.state.store.close()


def test_cross_site_posts_are_refused(app: object) -> None:
    c = client(app)
    evil = {"Origin": "https://evil.example"}
    r = c.post("/start", data={"worker_id": "w1"}, headers=evil)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert c.post("/admin/login", data={"token": TOKEN}, headers=evil).status_code == 403
    assert c.post("/start", data={"worker_id": "w1"}, headers={"Origin": "null"}).status_code == 403
    ref = {"Referer": "https://evil.example/page"}
    assert c.post("/start", data={"worker_id": "w1"}, headers=ref).status_code == 403
    own = {"Origin": "http://testserver"}
    assert c.post("/start", data={"worker_id": "w1"}, headers=own).status_code == 303
    assert app.state.store.progress(app.state.study.run_key).worker_id.notna().sum() == 1  # type: ignore[attr-defined]


def test_admin_login_is_throttled(app: object) -> None:
    c = client(app)
    codes = [c.post("/admin/login", data={"token": f"wrong{i}"}).status_code for i in range(6)]
    assert codes == [401] * 5 + [429]
    r = c.post("/admin/login", data={"token": TOKEN})  # even the right token waits
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0


@pytest.mark.parametrize("path", ["/admin", "/admin/export.csv"])
def test_bearer_guessing_meets_the_same_throttle_as_the_form(app: object, path: str) -> None:
    guesser = client(app)
    codes = [
        guesser.get(path, headers={"Authorization": f"Bearer guess-{i:04d}"}).status_code
        for i in range(30)
    ]
    assert codes == [401] * 5 + [429] * 25  # admin_max_failures=5, as the login form
    # While throttled the right token waits too (a 200 would end the guessing).
    right = guesser.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 429 and int(right.headers["retry-after"]) > 0
    # One throttle for every admin path: the form from that address now waits as well.
    assert guesser.post("/admin/login", data={"token": TOKEN}).status_code == 429


def test_wrong_admin_cookies_count_and_form_failures_block_bearer(app: object) -> None:
    run_key = app.state.study.run_key  # type: ignore[attr-defined]
    name = "saleval_a_" + hashlib.sha256(run_key.encode()).hexdigest()[:10]
    c = client(app)
    # Opening /admin without any credential is no guess: the login page, nothing counted
    assert [c.get("/admin").status_code for _ in range(8)] == [401] * 8
    codes = [c.get("/admin", headers={"Cookie": f"{name}=forged{i}"}).status_code for i in range(3)]
    codes += [c.post("/admin/login", data={"token": f"wrong{i}"}).status_code for i in range(2)]
    assert codes == [401] * 5
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert c.get("/admin/export.csv", headers=bearer).status_code == 429
    assert c.post("/admin/release", data={"bundle_id": "b"}, headers=bearer).status_code == 429
    # The login page itself stays reachable (to wait out the Retry-After)
    assert client(app).get("/admin").status_code == 401


def test_admin_lockout_leaves_resume_codes_working(tmp_path: Path, study: Study) -> None:
    app = create_app(study, settings(tmp_path / "r.sqlite", admin_max_failures=2))
    code = start(client(app), "w1")  # the worker's first browser
    nat = client(app)  # another browser behind the same address (the test client's)
    for i in range(4):
        nat.get("/admin", headers={"Authorization": f"Bearer guess{i}"})
    assert nat.get("/admin", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
    # The worker resumes from that address on a new device with their resume code.
    resumed = nat.post("/start", data={"worker_id": "w1", "resume_code": code})
    assert resumed.status_code == 303 and resumed.headers["location"] == "/task"
    assert POSITION.search(nat.get("/task").text)
    app.state.store.close()


@pytest.mark.parametrize("position", ["9223372036854775808", "-1", "1e3", " 1", "１", "0" * 10, ""])
def test_integer_fields_are_range_checked(app: object, position: str) -> None:
    c = client(app)
    start(c, "w1")
    r = c.post("/answer", data={"position": position, "answer": "World"})
    assert r.status_code == 400 and "NOT saved" in r.text
    for k, v in SECURITY_HEADERS.items():
        assert r.headers[k] == v


@pytest.mark.parametrize("cookie", ["é", "\u2603" * 40, "x" * 5000, "", "%ff"])
def test_any_admin_cookie_gives_401(app: object, cookie: str) -> None:
    run_key = app.state.study.run_key  # type: ignore[attr-defined]
    name = "saleval_a_" + hashlib.sha256(run_key.encode()).hexdigest()[:10]
    c = client(app)
    r = c.get("/admin", headers={"Cookie": f"{name}={cookie}".encode()})
    assert r.status_code == 401
    r = c.get("/admin", headers={"Authorization": f"Bearer {cookie}".encode()})
    assert r.status_code == 401


def test_every_error_carries_headers_and_says_whether_saved(app: object) -> None:
    c = client(app)
    start(c, "w1")
    store = app.state.store  # type: ignore[attr-defined]
    original = store.record_answer

    def crash(*args: object) -> object:
        raise RuntimeError("disk on fire")

    store.record_answer = crash
    pos = POSITION.search(c.get("/task").text).group(1)
    r = c.post("/answer", data={"position": pos, "answer": "World"})
    store.record_answer = original
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/html")
    assert "may not have been saved" in r.text and "disk on fire" not in r.text
    for resp in (r, c.get("/nope"), c.post("/answer", data={"position": pos, "answer": "bogus"})):
        for k, v in SECURITY_HEADERS.items():
            assert resp.headers[k] == v, (resp.status_code, k)
    assert c.post("/answer", data={"position": pos, "answer": "bogus"}).text.count("NOT saved")


def test_healthz_says_only_that_the_app_is_up(app: object) -> None:
    r = client(app).get("/healthz")
    assert r.status_code == 200 and r.json() == {"ok": True}


def test_admin_page_lists_and_releases_bundles(app: object) -> None:
    w = client(app)
    start(w, "w1")
    admin = client(app)
    admin.post("/admin/login", data={"token": TOKEN})
    page = admin.get("/admin").text
    first = app.state.study.bundle_ids[0]  # type: ignore[attr-defined]
    assert f'data-bundle="{first}" data-status="active"' in page
    r = admin.post("/admin/release", data={"bundle_id": first})
    assert r.status_code == 200 and f"Bundle {first} released from w1" in r.text
    assert f'data-bundle="{first}" data-status="free"' in r.text
    # The worker's session now says the bundle was released, and nothing is silently lost.
    gone = w.get("/task")
    assert gone.status_code == 410 and "organiser released" in gone.text
    r = admin.post("/admin/reassign", data={"bundle_id": first, "worker_id": "w2"})
    code = re.search(r"resume code ([A-Z0-9-]+)", r.text).group(1)
    w2 = client(app)
    assert w2.post("/start", data={"worker_id": "w2", "resume_code": code}).status_code == 303
    assert client(app).post("/admin/release", data={"bundle_id": first}).status_code == 401


def test_over_http_bots_block_only_until_their_leases_run_out(
    tmp_path: Path, study: Study, clock: Clock
) -> None:
    app = create_app(
        study,
        settings(tmp_path / "b.sqlite", lease_minutes=30, max_claims_per_client=0),
    )
    app.state.store.clock = clock
    for i in range(3):  # a script claims every bundle and leaves
        assert client(app).post("/start", data={"worker_id": f"bot{i}"}).status_code == 303
    real = client(app)
    refused = real.post("/start", data={"worker_id": "real"})
    assert refused.status_code == 410 and "has been taken" in refused.text
    clock.advance(31)
    code = start(real, "real")  # after the lease: a bundle, instructions, a task
    assert code and POSITION.search(real.get("/task").text)
    app.state.store.close()


def test_over_http_claims_per_client_are_bounded(tmp_path: Path, study: Study) -> None:
    app = create_app(study, settings(tmp_path / "q.sqlite", max_claims_per_client=2))
    codes = [client(app).post("/start", data={"worker_id": f"x{i}"}).status_code for i in range(3)]
    assert codes == [303, 303, 429]
    app.state.store.close()
