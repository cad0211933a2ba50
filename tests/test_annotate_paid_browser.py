"""A paid study in real headless Chromium: five participants as people take part, the
researcher's dashboard (refreshing by itself, then a screenshot whose figures are read),
and the export's decisions and payment files checked against what each one did.

1. ann passes the comprehension check and completes her bundle;
2. bea fails the check once, passes on the second attempt and completes;
3. cy fails it twice: the return page and screen-out code, never a bundle;
4. dee fails two attention checks (gold questions): her session ends;
5. eve leaves in the middle of her bundle, returns in a new browser with her resume
   code, and finishes where she left off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import DictConfig

from saleval.annotate import paid_export
from saleval.annotate.app import background_server, create_app
from saleval.annotate.study import Study, load_study
from saleval.pipeline import tables
from saleval.stages import annotate as annotate_stage
from saleval.testing import make_task_run
from tests.annotate_support import (
    TOKEN,
    gold_truth,
    launch_chromium,
    needs_chromium,
    paid_settings,
    wrong_label,
)

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.usefixtures("mlflow_uri")]

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect
CODE = re.compile(r"[A-Z2-9]{4}-[A-Z2-9]{4}")
N_TASKS = 7  # 5 tasks and 2 gold questions a bundle


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


class PaidServer:
    """The served paid study: its URL, app and the right answers."""

    def __init__(self, url: str, app: Any, tasks_dir: Path, db: Path) -> None:
        self.url, self.app, self.tasks_dir, self.db = url, app, tasks_dir, db
        self.st = app.state.annotate
        self.study: Study = self.st.study
        self.truth = gold_truth(self.study)


@pytest.fixture
def paid(tmp_path: Path) -> Iterator[PaidServer]:
    tasks_dir = make_task_run(tmp_path / "tasks", n_bundles=5, bundle_size=5, gold_rate=0.4)
    db = tmp_path / "db.sqlite"
    app = create_app(load_study(tasks_dir), paid_settings(db, dashboard={"refresh_s": 1}))
    try:
        with background_server(app) as url:
            yield PaidServer(url, app, tasks_dir, db)
    finally:
        app.state.store.close()


def new_page(browser: Any) -> Any:
    ctx = browser.new_context(viewport={"width": 1100, "height": 1400})
    ctx.set_default_timeout(15_000)
    return ctx.new_page()


def start(page: Any, s: PaidServer, worker: str) -> None:
    page.goto(s.url + "/")
    page.get_by_label("Worker ID").fill(worker)
    page.get_by_role("button", name="Start").click()


def take_check(page: Any, s: PaidServer, right: bool) -> None:
    """Tick one option per question, as a person does, and submit."""
    expect(page.get_by_role("heading", level=1)).to_have_text("Before you start")
    for i, q in enumerate(s.st.questions):
        choice = q.answer if right or i else next(o for o in q.options if o != q.answer)
        page.locator(f'fieldset[data-question="{i}"]').get_by_label(choice, exact=True).check()
    page.get_by_role("button", name="Check my answers").click()


def answer_tasks(page: Any, s: PaidServer, worker: str, n: int, gold_wrong: int = 0) -> None:
    """Answer ``n`` tasks by clicking: gold questions right (the first ``gold_wrong``
    wrong), every other task the first label."""
    for _ in range(n):
        expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"^Task \d+ of"))
        pos = int(page.locator('input[name="position"]').get_attribute("value"))
        held = s.st.store.assignments(s.study.run_key)
        bundle = held[(held.worker_id == worker) & held.released_at.isna()].bundle_id.iloc[-1]
        right = s.truth[(bundle, pos)]
        label = s.study.label_names[0] if right is None else right
        if right is not None and gold_wrong:
            label, gold_wrong = wrong_label(s.study, right), gold_wrong - 1
        page.get_by_role("button", name=label, exact=True).click()


def test_five_participants_the_dashboard_and_the_payment_files(
    browser: Any, paid: PaidServer, make_cfg: Callable[..., DictConfig], tmp_path: Path
) -> None:
    s = paid
    admin = new_page(browser)
    admin.goto(s.url + "/admin/dashboard")
    admin.get_by_label("Admin token").fill(TOKEN)
    admin.get_by_role("button", name="Sign in").click()
    admin.goto(s.url + "/admin/dashboard")
    expect(admin.locator("#bundles-done")).to_have_text("0 of 5")

    ann = new_page(browser)
    start(ann, s, "ann")
    take_check(ann, s, right=True)
    answer_tasks(ann, s, "ann", N_TASKS)
    expect(ann.get_by_role("heading", level=1)).to_have_text("Thank you!")
    assert CODE.fullmatch(ann.locator("#completion-code").inner_text())
    # the open dashboard reloads by itself and shows ann's bundle done
    expect(admin.locator("#bundles-done")).to_have_text("1 of 5", timeout=10_000)

    bea = new_page(browser)
    start(bea, s, "bea")
    take_check(bea, s, right=False)
    expect(bea.get_by_role("alert")).to_contain_text("1 of 3 answer was not right")
    expect(bea.locator("#attempt")).to_have_text("2 of 2")
    expect(bea.locator('fieldset[data-question="0"]')).to_have_attribute("aria-invalid", "true")
    take_check(bea, s, right=True)
    answer_tasks(bea, s, "bea", N_TASKS)
    expect(bea.get_by_role("heading", level=1)).to_have_text("Thank you!")

    cy = new_page(browser)
    start(cy, s, "cy")
    take_check(cy, s, right=False)
    take_check(cy, s, right=False)
    expect(cy.get_by_role("heading", level=1)).to_have_text("Please return this study")
    expect(cy.locator("#return-code")).to_have_text("SCREEN01")
    cy.goto(s.url + "/task")  # no way to a task
    expect(cy.get_by_role("heading", level=1)).not_to_have_text(re.compile("Task"))

    dee = new_page(browser)
    start(dee, s, "dee")
    take_check(dee, s, right=True)
    gold_left = 2
    while gold_left:  # answer until the second gold question is failed
        answer_tasks(dee, s, "dee", 1, gold_wrong=2)
        gold_left = 2 - sum(1 for _ in _gold_answered(s, "dee"))
    expect(dee.get_by_role("heading", level=1)).to_have_text("Please return this study")
    expect(dee.locator("#return-message")).to_contain_text("attention-check")

    eve = new_page(browser)
    start(eve, s, "eve")
    take_check(eve, s, right=True)
    answer_tasks(eve, s, "eve", 3)
    resume = eve.locator("#resume-code").inner_text()
    eve.context.close()  # she leaves in the middle of her bundle
    back = new_page(browser)  # and comes back in another browser
    start(back, s, "eve")
    expect(back.get_by_role("alert")).to_contain_text("resume code")
    back.get_by_label("Resume code").fill(resume)
    back.get_by_role("button", name="Start").click()
    expect(back.get_by_role("heading", level=1)).to_have_text(f"Task 4 of {N_TASKS}")
    answer_tasks(back, s, "eve", N_TASKS - 3)
    expect(back.get_by_role("heading", level=1)).to_have_text("Thank you!")

    # the dashboard after all five: read off the page that is screenshotted
    reward = round(N_TASKS * 30 / 3600 * 12, 2)
    expect(admin.locator("#bundles-done")).to_have_text("3 of 5", timeout=10_000)
    shot = tmp_path / "dashboard.png"
    admin.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    figures = {
        k: admin.locator(f"#{k}").inner_text()
        for k in ("bundles-done", "bundles-leased", "bundles-free", "answers", "flagged")
    } | {k: admin.locator(f"#{k}").inner_text() for k in ("screened-out", "pass-rate", "spent")}
    dee_answers = len(_answers_of(s, "dee"))
    assert figures == {
        "bundles-done": "3 of 5",
        "bundles-leased": "0",
        "bundles-free": "2",  # dee's bundle went back to the pool
        "answers": str(3 * N_TASKS + dee_answers),
        "flagged": "1",
        "screened-out": "1",
        "pass-rate": "80.0 %",  # 4 of the 5 who took the check passed it
        "spent": f"{(3 * reward + 3 * 0.10) * 1.25:.2f} GBP",
    }
    rows = admin.locator("#participants-table tbody tr")
    decisions = {
        rows.nth(i).get_attribute("data-worker"): rows.nth(i).get_attribute("data-decision")
        for i in range(rows.count())
    }
    assert decisions == {
        "ann": "approve",
        "bea": "approve",
        "cy": "return",
        "dee": "reject",
        "eve": "approve",
    }

    # the export: decisions and the platform's files, against what each one did
    out = annotate_stage.run(
        make_cfg(
            "annotate",
            [
                f"inputs.tasks={s.tasks_dir}",
                "action=export",
                f"annotate.db={s.db}",
                "annotate.comprehension.enabled=true",
                "annotate.comprehension.return_code=SCREEN01",
                "annotate.pay.seconds_per_task=30",
                "annotate.pay.hourly_rate=12",
                "annotate.pay.fee=0.25",
                "annotate.pay.gold_bonus=0.05",
            ],
        )
    )
    run = Path(out["run_dir"])
    people = pd.read_csv(run / paid_export.PARTICIPANTS).set_index("worker_id")
    assert people["decision"].to_dict() == decisions
    assert people.at["bea", "comprehension_attempts"] == 2
    assert people.at["dee", "gold_failed"] == 2
    assert pd.read_csv(run / paid_export.APPROVALS)["worker_id"].tolist() == ["ann", "bea", "eve"]
    assert pd.read_csv(run / paid_export.REJECTIONS)["worker_id"].tolist() == ["dee"]
    bonus = pd.read_csv(run / paid_export.BONUSES, dtype={"amount": str})
    assert bonus[["worker_id", "amount"]].values.tolist() == [
        ["ann", "0.10"],
        ["bea", "0.10"],
        ["eve", "0.10"],
    ]
    pay = json.loads((run / paid_export.PAYMENTS).read_text())
    assert pay["total"] == round((3 * reward + 0.30) * 1.25, 2)
    answers = tables.ANSWERS.read(run)
    assert answers.groupby("worker_id").size().to_dict() == {"ann": 7, "bea": 7, "eve": 7}
    eve_rows = answers[answers.worker_id == "eve"]
    assert eve_rows["position"].tolist() == sorted(eve_rows["position"])  # nothing twice
    for p in (admin, ann, bea, cy, dee, back):
        p.context.close()


def _answers_of(s: PaidServer, worker: str) -> pd.DataFrame:
    a = s.st.store.answers(s.study.run_key)
    return a[a.worker_id == worker]


def _gold_answered(s: PaidServer, worker: str) -> list[str]:
    a = _answers_of(s, worker)
    gold = set(s.study.tasks.index[s.study.tasks["is_gold"].astype(bool)])
    return [t for t in a.task_id if t in gold]
