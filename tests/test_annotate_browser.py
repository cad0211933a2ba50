"""The annotation app in real headless Chromium (Debian's package, driven by Playwright).

Small bundles (5 tasks) keep each test to a few seconds. The kill/restart test runs the
real ``saleval-annotate`` console script in its own process and SIGKILLs it.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import IDK, load_study
from saleval.pipeline import tables
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from saleval.testing.load_servers import free_port, start_cli_server, stop, wait_healthy
from tests.annotate_support import TOKEN, launch_chromium, needs_chromium, served_app

# building a task run logs to MLflow
pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.usefixtures("mlflow_uri")]

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect
CODE = re.compile(r"[A-Z2-9]{4}-[A-Z2-9]{4}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context()
    ctx.set_default_timeout(15_000)
    p = ctx.new_page()
    dialogs: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.dialogs = dialogs  # every test asserts no script of ours or an attacker's ran
    yield p
    ctx.close()
    assert dialogs == [], f"a dialog opened: {dialogs}"


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Any]:
    with served_app(tmp_path, n_bundles=3, bundle_size=5) as s:
        yield s


def start(page: Any, url: str, worker: str) -> None:
    page.goto(url + "/")
    page.get_by_label("Worker ID").fill(worker)
    page.get_by_role("button", name="Start").click()


def heading(page: Any) -> Any:
    return page.get_by_role("heading", level=1)


def expect_task(page: Any, i: int, n: int = 5) -> None:
    """On task i (1-based) of n, with i-1 answered on the progress bar."""
    expect(heading(page)).to_have_text(f"Task {i} of {n}")
    bar = page.get_by_role("progressbar", name=f"{i - 1} of {n} tasks answered")
    expect(bar).to_have_attribute("value", str(i - 1))


def answer(page: Any, how: str, i: int | None = None) -> None:
    """On task ``i`` (checked first: a key pressed during navigation would go to the old
    page), click a button by its label or press a shortcut key (``key:1``)."""
    if i is not None:
        expect_task(page, i)
    if how.startswith("key:"):
        page.keyboard.press(how.removeprefix("key:"))
    else:
        page.get_by_role("button", name=how, exact=True).click()


def test_full_bundle_through_the_ui_then_exported(
    page: Any, browser: Any, srv: Any, make_cfg: Callable[..., DictConfig]
) -> None:
    start(page, srv.url, "worker-1")
    # Instruction page before the first task, with the dataset's instructions and keys.
    expect(heading(page)).to_have_text("Instructions")
    expect(page.get_by_role("heading", name="Instructions (ag_news)")).to_be_visible()
    expect(page.locator("dl.options")).to_contain_text("I don't know (keys: 0 or ?)")
    page.get_by_role("button", name=re.compile("start the tasks")).click()

    plan = ["World", "key:2", "key:0", "key:?", "Sci/Tech"]
    expected = ["World", "Sports", IDK, IDK, "Sci/Tech"]
    for i, how in enumerate(plan, start=1):
        expect(page.locator("#words")).not_to_be_empty()
        answer(page, how, i)
    expect(heading(page)).to_have_text("Thank you!")
    code = page.locator("#completion-code").inner_text()
    assert CODE.fullmatch(code)

    # The export stage writes what was clicked, in order, in the import format.
    out = annotate_stage.run(
        make_cfg(
            "annotate", [f"inputs.tasks={srv.tasks_dir}", "action=export", f"annotate.db={srv.db}"]
        )
    )
    df = tables.ANSWERS.read(out["run_dir"])
    assert df.worker_id.tolist() == ["worker-1"] * 5
    assert df.answer.tolist() == expected
    assert df.position.tolist() == sorted(df.position.tolist())
    bundle = srv.study.bundles[srv.study.bundles.bundle_id == df.bundle_id[0]]
    assert df.task_id.tolist() == bundle.sort_values("position").task_id.tolist()
    started = pd.to_datetime(df.started_at, utc=True)
    submitted = pd.to_datetime(df.submitted_at, utc=True)
    assert (started <= submitted).all() and (
        submitted.iloc[:-1].values <= started.iloc[1:].values
    ).all()
    assert pd.read_csv(Path(out["run_dir"]) / "completions.csv").completion_code.tolist() == [code]

    # The admin view (token from config) shows the bundle done and offers the same export.
    admin = browser.new_context().new_page()
    admin.goto(srv.url + "/admin")
    admin.get_by_label("Admin token").fill(TOKEN)
    admin.get_by_role("button", name="Sign in").click()
    row = admin.locator(f'tr[data-bundle="{df.bundle_id[0]}"]')
    expect(row).to_contain_text("worker-1")
    expect(row).to_contain_text("5/5")
    expect(row).to_contain_text(code)
    with admin.expect_download() as dl:
        admin.get_by_role("link", name="Download answers.csv").click()
    downloaded = tables.ANSWERS.read(dl.value.path())
    pd.testing.assert_frame_equal(downloaded, df)
    admin.context.close()


def test_reload_mid_bundle_resumes_at_the_next_unanswered_task(
    page: Any, browser: Any, srv: Any
) -> None:
    start(page, srv.url, "worker-2")
    page.get_by_role("button", name=re.compile("start the tasks")).click()
    answer(page, "key:1", 1)
    answer(page, "key:3", 2)
    expect_task(page, 3)
    page.reload()
    expect_task(page, 3)
    # Back to the start page: it offers to continue; entering the id again resumes too.
    page.goto(srv.url + "/")
    expect(page.get_by_role("link", name="Continue your bundle")).to_be_visible()
    start(page, srv.url, "worker-2")
    expect_task(page, 3)
    # A fresh browser (cookie lost) with the same id alone gets no session: it is asked for
    # the resume code shown on the task page, and with it resumes the same bundle.
    code = page.locator("#resume-code").inner_text()
    other = browser.new_context().new_page()
    start(other, srv.url, "worker-2")
    expect(other.get_by_role("alert")).to_contain_text("resume code")
    other.get_by_label("Resume code").fill(code)
    other.get_by_role("button", name="Start").click()
    expect_task(other, 3)
    other.context.close()
    progress = srv.app.state.store.progress(srv.study.run_key)
    assert progress.worker_id.tolist().count("worker-2") == 1
    assert progress.n_answered.sum() == 2


def test_second_bundle_for_the_same_worker_and_dataset_is_refused(page: Any, srv: Any) -> None:
    start(page, srv.url, "worker-3")
    page.get_by_role("button", name=re.compile("start the tasks")).click()
    for i in range(1, 6):
        answer(page, "key:4", i)
    expect(heading(page)).to_have_text("Thank you!")
    page.goto(srv.url + "/")
    page.get_by_label("Worker ID").fill("worker-3")
    with page.expect_response(lambda r: r.url.endswith("/start")) as resp:
        page.get_by_role("button", name="Start").click()
    assert resp.value.status == 409
    expect(heading(page)).to_have_text("No bundle for you")
    expect(page.get_by_role("alert")).to_contain_text("already completed a bundle")
    progress = srv.app.state.store.progress(srv.study.run_key)
    assert progress.worker_id.tolist().count("worker-3") == 1
    assert progress.worker_id.notna().sum() == 1  # no second bundle was handed out


def test_server_killed_mid_bundle_loses_no_committed_answer(
    page: Any, tmp_path: Path, mlflow_uri: str, make_cfg: Callable[..., DictConfig]
) -> None:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=2, bundle_size=5)
    db = tmp_path / "annotations.sqlite"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "serve1").mkdir()
    proc = start_cli_server(tasks_dir, db, port, TOKEN, tmp_path / "serve1")
    try:
        wait_healthy(url, proc)
        start(page, url, "worker-4")
        page.get_by_role("button", name=re.compile("start the tasks")).click()
        for i, how in enumerate(("key:1", "key:2", "key:0"), start=1):
            answer(page, how, i)
        expect_task(page, 4)  # the third answer was acknowledged
        study = load_study(tasks_dir)
        reader = AnnotationStore(db)
        before = reader.answers(study.run_key)
        assert before.answer.tolist() == ["World", "Sports", IDK]
        stop(proc, signal.SIGKILL)
        assert proc.returncode == -signal.SIGKILL
        (tmp_path / "serve2").mkdir()
        proc = start_cli_server(tasks_dir, db, port, TOKEN, tmp_path / "serve2")
        wait_healthy(url, proc)
        page.reload()
        expect_task(page, 4)
        answer(page, "key:3", 4)
        answer(page, "World", 5)
        expect(heading(page)).to_have_text("Thank you!")
        after = reader.answers(study.run_key)
        reader.close()
        stop(proc)  # SIGTERM: graceful, the stage ends its run
    finally:
        stop(proc)
    killed = json.loads((tmp_path / "serve1" / "run.json").read_text())
    ended = json.loads((tmp_path / "serve2" / "run.json").read_text())
    # the second server, started on the same store and host, ended the killed one's run
    # (docs/tracking.md, issue #28): KILLED in run.json and in MLflow, with an end time
    assert (killed["status"], ended["status"]) == ("KILLED", "FINISHED")
    dead = MlflowClient().get_run(killed["run_id"]).info
    assert (dead.status, dead.end_time is not None) == ("KILLED", True)
    assert MlflowClient().get_run(ended["run_id"]).data.metrics["n_answers"] == 5
    pd.testing.assert_frame_equal(
        after.iloc[:3].drop(columns="bundle_complete"), before.drop(columns="bundle_complete")
    )
    assert after.answer.tolist() == ["World", "Sports", IDK, "Business", "World"]
    out = annotate_stage.run(
        make_cfg("annotate", [f"inputs.tasks={tasks_dir}", "action=export", f"annotate.db={db}"])
    )
    assert len(tables.ANSWERS.read(out["run_dir"])) == 5


def test_accessible_markup_focus_order_and_shortcuts(page: Any, srv: Any) -> None:
    page.goto(srv.url + "/")
    assert page.get_attribute("html", "lang") == "en"
    expect(page.get_by_role("main")).to_be_visible()
    expect(page.get_by_label("Worker ID")).to_have_attribute("aria-describedby", "worker-id-help")
    start(page, srv.url, "worker-5")
    page.get_by_role("button", name=re.compile("start the tasks")).click()
    expect_task(page, 1)
    group = page.get_by_role("group", name="Which label fits this text best?")
    names = [b.get_attribute("value") for b in group.get_by_role("button").all()]
    assert names == ["World", "Sports", "Business", "Sci/Tech", IDK]
    shortcuts = [b.get_attribute("aria-keyshortcuts") for b in group.get_by_role("button").all()]
    assert shortcuts == ["1", "2", "3", "4", "0 ?"]
    # Focus order: skip link, then the answer buttons in reading order.
    order = []
    for _ in range(6):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert order == [
        "Skip to content",
        "1 World",
        "2 Sports",
        "3 Business",
        "4 Sci/Tech",
        "0 I don't know",
    ]
    # A key without a button does nothing; Enter on the focused button answers it.
    page.keyboard.press("9")
    expect_task(page, 1)
    page.keyboard.press("Enter")
    expect_task(page, 2)
    got = srv.app.state.store.answers(srv.study.run_key)
    assert got.answer.tolist() == [IDK]


@pytest.mark.parametrize(
    "evil", ["<img src=x onerror=alert(1)>", '"><script>alert(document.cookie)</script>']
)
def test_xss_worker_id_is_refused_and_shown_inert(page: Any, srv: Any, evil: str) -> None:
    page.goto(srv.url + "/?worker_id=" + evil.replace("#", "%23"))
    expect(page.get_by_label("Worker ID")).to_have_value(evil)  # prefilled, as text
    with page.expect_response(lambda r: r.url.endswith("/start")) as resp:
        page.get_by_role("button", name="Start").click()
    assert resp.value.status == 400
    expect(page.get_by_role("alert")).to_contain_text(evil)  # echoed as text, not markup
    assert page.locator("main img, main script").count() == 0
    assert page.dialogs == []
    assert srv.app.state.store.progress(srv.study.run_key).worker_id.isna().all()
