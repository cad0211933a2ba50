"""A paid study's pages around the tasks: the comprehension check before the first task
(``/comprehension``), the return page (``/returned``) and the attention-check policy
after each gold answer (docs/annotate.md#running-a-paid-study).

The check comes before a bundle is assigned, so one screened out never holds a bundle;
passing it assigns the bundle and counts as having read the instructions (they are on the
check's page). The rules themselves are :mod:`saleval.annotate.policy`'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from saleval.annotate import policy
from saleval.annotate.comprehension import grade
from saleval.annotate.state import AppState, completion_link, redirect, state_of
from saleval.annotate.store_leases import Assignment, BundleRefused
from saleval.annotate.store_participants import ENDED_ATTENTION, Participant

router = APIRouter()

PILOT_REASON = "pilot"


def comprehension_page(
    request: Request, p: Participant, wrong: list[int] | None = None, status: int = 200
) -> HTMLResponse:
    st = state_of(request)
    return st.page(
        request,
        "comprehension.html",
        status,
        participant=p,
        questions=list(enumerate(st.questions)),
        wrong=wrong or [],
        attempts=st.settings.comprehension.attempts,
        instructions=st.instructions_html,
        options=st.options,
        descriptions=st.study.label_descriptions,
    )


def taking_check(request: Request) -> Participant | Response:
    """The participant still taking the check, else where they belong: the start page
    (no participant), the return page (screened out, ended) or their tasks (passed)."""
    st = state_of(request)
    p = st.participant(request)
    if p is None:
        return redirect("/")
    if p.screened_out or p.ended:
        return redirect("/returned")
    if p.passed_at or not st.questions:
        return redirect("/task")
    return p


@router.get("/comprehension", response_class=HTMLResponse)
def comprehension(request: Request) -> Response:
    p = taking_check(request)
    return comprehension_page(request, p) if isinstance(p, Participant) else p


@router.post("/comprehension")
async def answer_comprehension(request: Request) -> Response:
    """Grade one attempt; a pass assigns the bundle, the last failure screens out."""
    p = taking_check(request)
    if not isinstance(p, Participant):
        return p
    st = state_of(request)
    form = await request.form()
    given = {i: str(form.get(f"q{i}", ""))[:500] for i in range(len(st.questions))}
    wrong = grade(st.questions, given)
    try:
        p = st.store.record_attempt(
            st.study.run_key, p.worker_id, given, wrong, st.settings.comprehension.attempts
        )
    except BundleRefused:  # a second tab already used the last attempt or passed
        return redirect("/comprehension")
    if p.screened_out:
        return redirect("/returned")
    if not p.passed_at:
        return comprehension_page(request, p, wrong, 200)
    try:
        a = st.store.assign(
            st.study.run_key,
            p.worker_id,
            platform_session=p.platform_session,
            client=None,
        )
    except BundleRefused as refused:
        return st.error(request, refused.reason, refused.status, heading="No bundle for you")
    st.store.acknowledge_instructions(a.assignment_id)  # they were on the check's page
    response = redirect("/task")
    st.set_cookie(response, st.session_cookie, a.session_token)
    return response


def return_reason(st: AppState, p: Participant | None) -> str:
    if p is None:
        return PILOT_REASON
    if p.screened_out:
        return "screened_out"
    return str(p.ended_reason or ENDED_ATTENTION)


@router.get("/returned", response_class=HTMLResponse)
def returned(request: Request) -> Response:
    """Where a screened-out or ended session lands: the platform's return message, and
    for a screen-out its code (and the platform's link with it, in link mode)."""
    st = state_of(request)
    p = st.participant(request)
    if p is None or not (p.screened_out or p.ended):
        return redirect("/")
    return returned_page(request, p)


def returned_page(request: Request, p: Participant | None, status: int = 200) -> HTMLResponse:
    st = state_of(request)
    check = st.settings.comprehension
    reason = return_reason(st, p)
    code = check.return_code if reason == "screened_out" else None
    link = (
        completion_link(st.settings.completion_url, code)
        if code and st.settings.completion_url
        else None
    )
    return st.page(
        request,
        "returned.html",
        status,
        reason=reason,
        message=check.return_message if reason == "screened_out" else None,
        code=code,
        link=link,
        max_failures=st.settings.attention.max_failures,
    )


def after_gold_answer(request: Request, a: Assignment, position: int) -> Response | None:
    """The attention-check policy after an answer: None to go on, else the return page's
    redirect once the participant has failed ``attention.max_failures`` gold questions
    and ``attention.end_session`` is set (their bundle goes back to the pool)."""
    st = state_of(request)
    att = st.settings.attention
    if not att.end_session or att.max_failures < 1:
        return None
    items = st.study.bundles
    item = items[(items["bundle_id"] == a.bundle_id) & (items["position"] == position)]
    if item.empty or not bool(item["is_gold"].iloc[0]):
        return None
    answers = st.store.answers(st.study.run_key)
    mine = answers[answers["worker_id"] == a.worker_id]
    failed = int(policy.gold_answers(mine, st.study, att.idk_fails)["failed"].sum())
    if not policy.flagged(failed, att):
        return None
    st.store.participant(st.study.run_key, a.worker_id)  # recorded if the admin assigned
    st.store.end_session(st.study.run_key, a.worker_id, ENDED_ATTENTION)
    response = redirect("/returned")
    p = st.store.participant(st.study.run_key, a.worker_id)
    st.set_cookie(response, st.participant_cookie, p.token)
    return response
