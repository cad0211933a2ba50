"""The worker's pages: ``/`` → ``/instructions`` → ``/task`` (one per page) → ``/done``.

Every answer is a plain form POST followed by a redirect (post/redirect/get), so a reload
never resubmits and always shows the first unanswered task: the position comes from the
database, never from the browser's history. A bundle in progress is handed back only with
its session cookie, its resume code or its platform session id (Prolific's
``SESSION_ID``), never for the worker ID alone; wrong resume codes count in their own
throttle, apart from the admin's.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from saleval.annotate import routes_participant
from saleval.annotate.security import WORKER_ID_RULE, client_key, valid_worker_id
from saleval.annotate.state import completion_link, redirect, state_of
from saleval.annotate.store_answers import AnswerRejected
from saleval.annotate.store_leases import Assignment, BundleRefused, ResumeRequired
from saleval.annotate.store_participants import ENDED_ATTENTION

PLATFORM_PARAMS = {"PROLIFIC_PID": "worker_id", "STUDY_ID": "study_id", "SESSION_ID": "session_id"}
"""Prolific's URL parameters and the start form's fields they fill (docs/annotate.md)."""

POSITION_RE = re.compile(r"[0-9]{1,9}")
"""A task position: a small non-negative integer (never a 64-bit overflow)."""

router = APIRouter()


@router.get("/healthz")
def healthz() -> JSONResponse:
    return JSONResponse({"ok": True})


def start_form(
    request: Request,
    status: int = 200,
    worker_id: str = "",
    platform: dict[str, str] | None = None,
    error_text: str | None = None,
    ask_resume: bool = False,
) -> HTMLResponse:
    """The start page, with what the worker typed and why it was refused."""
    st = state_of(request)
    return st.page(
        request,
        "start.html",
        status,
        worker_id=worker_id[:200],
        current=st.current(request),
        rule=WORKER_ID_RULE,
        error=error_text,
        ask_resume=ask_resume,
        platform=platform or {},
    )


@router.get("/", response_class=HTMLResponse)
def start_page(request: Request, worker_id: str = "") -> HTMLResponse:
    """``/?worker_id=…`` or Prolific's ``/?PROLIFIC_PID=…&STUDY_ID=…&SESSION_ID=…``."""
    q = request.query_params
    platform = {
        field_: q[param][:200]
        for param, field_ in PLATFORM_PARAMS.items()
        if param in q and field_ != "worker_id"
    }
    return start_form(request, worker_id=q.get("PROLIFIC_PID", worker_id), platform=platform)


@router.post("/start")
def start(
    request: Request,
    worker_id: str = Form(""),
    resume_code: str = Form(""),
    study_id: str = Form(""),
    session_id: str = Form(""),
) -> Response:
    st = state_of(request)
    platform = {k: v[:200] for k, v in (("study_id", study_id), ("session_id", session_id)) if v}
    clean = valid_worker_id(worker_id)
    if clean is None:
        return start_form(
            request,
            400,
            worker_id,
            platform,
            f"“{worker_id[:200]}” is not a valid worker ID. Use {WORKER_ID_RULE}.",
        )
    key = client_key(request)
    wait = st.resume_throttle.retry_after(key) if resume_code else 0
    if wait:
        return st.too_many(
            request, wait, login=False, text="Too many wrong resume codes; try again later."
        )
    if st.store.crowd.worker_id_case.key(clean) in st.excluded:  # annotate.exclude_pilot
        return routes_participant.returned_page(request, None, 403)
    p = st.store.participant(
        st.study.run_key, clean, study_id=study_id[:200], platform_session=session_id[:200]
    )
    if p.screened_out or p.ended or (st.questions and not p.passed_at):
        ahead: Response = redirect("/returned" if p.screened_out or p.ended else "/comprehension")
        st.set_cookie(ahead, st.participant_cookie, p.token)
        return ahead
    try:
        a = st.store.assign(
            st.study.run_key,
            clean,
            session_token=request.cookies.get(st.session_cookie),
            resume_code=resume_code.strip()[:20] or None,
            platform_session=session_id[:200] or None,
            client=key,
        )
    except ResumeRequired as refused:
        if resume_code:
            st.resume_throttle.fail(key)
        return start_form(request, 409, clean, platform, refused.reason, ask_resume=True)
    except BundleRefused as refused:
        return st.error(request, refused.reason, refused.status, heading="No bundle for you")
    response: Response = redirect("/task" if a.instructions_at else "/instructions")
    st.set_cookie(response, st.session_cookie, a.session_token)
    st.set_cookie(response, st.participant_cookie, p.token)
    return response


def active(request: Request) -> Assignment | Response:
    """The worker's assignment, taken back if its lease ran out and nobody took it."""
    st = state_of(request)
    a = st.current(request)
    if a is None:
        return redirect("/")
    if a.released_reason == ENDED_ATTENTION:
        return redirect("/returned")
    if a.released:
        try:
            return st.store.reclaim(a.assignment_id)
        except BundleRefused as refused:
            return st.error(request, refused.reason, refused.status, heading="Bundle released")
    return a


@router.get("/instructions", response_class=HTMLResponse)
def instructions(request: Request) -> Response:
    a = active(request)
    if not isinstance(a, Assignment):
        return a
    st = state_of(request)
    return st.page(
        request,
        "instructions.html",
        assignment=a,
        instructions=st.instructions_html,
        options=st.options,
        descriptions=st.study.label_descriptions,
    )


@router.post("/instructions")
def acknowledge(request: Request) -> Response:
    a = active(request)
    if not isinstance(a, Assignment):
        return a
    state_of(request).store.acknowledge_instructions(a.assignment_id)
    return redirect("/task")


@router.get("/task", response_class=HTMLResponse)
def task(request: Request) -> Response:
    st = state_of(request)
    mine = st.current(request)
    if mine is not None and mine.done:
        return redirect("/done")
    a = active(request)
    if not isinstance(a, Assignment):
        return a
    if a.instructions_at is None:
        return redirect("/instructions")
    nxt = st.store.next_task(a)
    if nxt is None:
        return redirect("/done")
    return st.page(
        request,
        "task.html",
        assignment=a,
        task=nxt,
        display_text=st.study.display_text(nxt.task_id),
        options=st.options,
    )


@router.post("/answer")
def answer(request: Request, position: str = Form(""), answer: str = Form("")) -> Response:
    """An answer must be one of the study's options, for the position currently shown."""
    st = state_of(request)
    a = st.current(request)
    if a is None:
        return st.error(request, "Your session has expired; enter your worker ID again.", 403)
    if answer not in st.study.options:
        return st.error(request, f"“{answer[:200]}” is not one of the answer options.", 400)
    if not POSITION_RE.fullmatch(position):
        return st.error(request, f"“{position[:50]}” is not a task position.", 400)
    try:
        result = st.store.record_answer(a.assignment_id, int(position), answer)
    except AnswerRejected as rejected:
        return st.error(request, rejected.reason, rejected.status)
    ended = (
        routes_participant.after_gold_answer(request, a, int(position)) if result.stored else None
    )
    return ended or redirect("/done" if result.completed else "/task")


@router.get("/done", response_class=HTMLResponse)
def done(request: Request) -> Response:
    st = state_of(request)
    a = st.current(request)
    if a is None:
        return redirect("/")
    if not a.done:
        return redirect("/task")
    p = st.participant(request)
    if p is not None and p.ended:  # flagged at the last task: no completion code
        return redirect("/returned")
    if st.settings.completion_url:
        return redirect(completion_link(st.settings.completion_url, a.completion_code or ""))
    return st.page(request, "done.html", assignment=a)
