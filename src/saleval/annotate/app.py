"""The annotation app: FastAPI, server-rendered Jinja2 pages, no build step.

Flow for a worker: ``/`` (enter a worker id) → ``/instructions`` (once, before the first
task) → ``/task`` (one task per page, label buttons + "I don't know", progress bar) →
``/done`` (completion code). Every answer is a plain form POST followed by a redirect
(post/redirect/get), so a reload never resubmits and always shows the first unanswered
task: the position comes from the database, never from the browser's history.

Worker input is untrusted: ids must match :data:`WORKER_ID_RE`, answers must be one of
the study's options and the position the one currently shown; Jinja2 autoescaping is on
for every template and a strict Content-Security-Policy forbids inline script.

A bundle in progress is handed back only with its session cookie, its resume code or
its platform session id (Prolific's ``SESSION_ID``), never for the worker ID alone.
Every POST must come from the app's own pages (``Origin``/``Referer`` check); every
page, error pages and 500s included, carries the security headers, and an error on
``POST /answer`` says whether the answer was saved.

The admin view (``/admin``) is protected by a token (environment or file), compared in
constant time. Every wrong admin credential (login form, admin cookie, ``Authorization:
Bearer``) counts in one throttle per client; wrong resume codes count in another, so
guessing admin tokens never locks workers behind the same address out of resuming. A
worker's session never opens the admin view. It lists
bundles with their lease status and releases or reassigns them. docs/annotate.md is the
operator's guide.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
import uvicorn
from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from saleval.annotate.export import answers_frame, to_csv_bytes
from saleval.annotate.store import (
    AnnotationStore,
    AnswerRejected,
    Assignment,
    BundleRefused,
    LeasePolicy,
    ResumeRequired,
)
from saleval.annotate.study import IDK, Study, load_study

_HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)

WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,99}")
"""Worker ids: platform ids (Prolific, MTurk), e-mail-like ids; nothing that needs quoting."""

WORKER_ID_RULE = (
    "1 to 100 characters: letters, digits and _ . : @ + - (starting with a letter or digit)"
)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # not "no-referrer": under it browsers send "Origin: null" with the app's own form
    # POSTs, which the origin check must refuse; same-origin leaks nothing off-site
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True)
class AppSettings:
    """What the app needs besides the study. ``admin_token`` must be non-empty."""

    db_path: Path
    admin_token: str
    title: str | None = None
    completion_code: str | None = None
    synchronous: str = "FULL"
    secure_cookies: bool = False  # set when served over HTTPS behind a proxy
    lease: LeasePolicy = field(default_factory=LeasePolicy)
    completion_url: str | None = None  # "{code}" is replaced by the completion code
    allowed_origins: tuple[str, ...] = ()  # more origins a POST may come from
    admin_max_failures: int = 5  # wrong admin credentials (any path) per client per window
    resume_max_failures: int = 5  # wrong resume codes per client per window
    failure_window_s: float = 900.0


PLATFORM_PARAMS = {"PROLIFIC_PID": "worker_id", "STUDY_ID": "study_id", "SESSION_ID": "session_id"}
"""Prolific's URL parameters and the start form's fields they fill (docs/annotate.md)."""

POSITION_RE = re.compile(r"[0-9]{1,9}")
"""A task position: a small non-negative integer (never a 64-bit overflow)."""

NOT_SAVED = "Your answer was NOT saved."


def valid_worker_id(raw: str) -> str | None:
    """The stripped id if it is acceptable, else None."""
    value = (raw or "").strip()
    return value if WORKER_ID_RE.fullmatch(value) else None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of any two strings; never raises (non-ASCII included)."""
    return hmac.compare_digest(
        given.encode("utf-8", "backslashreplace"), expected.encode("utf-8", "backslashreplace")
    )


class Throttle:
    """At most ``limit`` failures per key in a sliding window (admin logins, resume codes)."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._fails: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        q = self._fails[key]
        while q and q[0] <= now - self.window_s:
            q.popleft()
        return q

    def retry_after(self, key: str) -> int:
        """Seconds until ``key`` may try again; 0: now."""
        now = time.monotonic()
        with self._lock:
            q = self._recent(key, now)
            if self.limit <= 0 or len(q) < self.limit:
                return 0
            return max(1, int(q[0] + self.window_s - now) + 1)

    def fail(self, key: str) -> None:
        with self._lock:
            self._recent(key, time.monotonic()).append(time.monotonic())


def create_app(study: Study | str | Path, settings: AppSettings) -> FastAPI:
    """Build the app for one task set; the store is opened and the bundles registered now."""
    if not isinstance(study, Study):
        study = load_study(study)
    if not settings.admin_token or len(settings.admin_token) < 8:
        raise ValueError("annotate.admin_token must be at least 8 characters")
    store = AnnotationStore(
        settings.db_path,
        synchronous=settings.synchronous,
        completion_code=settings.completion_code,
        lease=settings.lease,
    )
    store.register_run(study.run_key, study.dataset, str(study.tasks_dir), study.bundles)

    title = settings.title or f"Which label? ({study.dataset})"
    suffix = hashlib.sha256(study.run_key.encode()).hexdigest()[:10]
    session_cookie = f"saleval_s_{suffix}"  # per task set: several apps may share a host
    admin_cookie = f"saleval_a_{suffix}"
    admin_cookie_value = hmac.new(
        settings.admin_token.encode(), f"saleval-admin:{study.run_key}".encode(), "sha256"
    ).hexdigest()
    instructions_html = render_instructions(study.instructions_md)
    options = _options(study)
    # two throttles: admin guesses must not lock workers out of resuming (docs/annotate.md)
    admin_throttle = Throttle(settings.admin_max_failures, settings.failure_window_s)
    resume_throttle = Throttle(settings.resume_max_failures, settings.failure_window_s)
    allowed_origins = {o.rstrip("/").lower() for o in settings.allowed_origins}

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,  # every echoed value is escaped, in every template
        undefined=jinja2.StrictUndefined,
    )
    templates = Jinja2Templates(env=env)

    app = FastAPI(title="saleval annotate", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.study = study
    app.state.store = store
    app.state.settings = settings
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        base = {"title": title, "dataset": study.dataset}
        response = templates.TemplateResponse(
            request, name, {**base, **context}, status_code=status
        )
        response.headers.update(SECURITY_HEADERS)  # also where no middleware runs (500s)
        response.headers["Cache-Control"] = "no-store"
        return response

    def error(
        request: Request,
        message: str,
        status: int,
        heading: str = "Sorry",
        saved: str | None = None,
    ) -> HTMLResponse:
        if saved is None and request.method == "POST" and request.url.path == "/answer":
            saved = NOT_SAVED
        return page(request, "error.html", status, heading=heading, message=message, saved=saved)

    def client_key(request: Request) -> str:
        # uvicorn puts X-Forwarded-For here for trusted proxies (forwarded_allow_ips)
        return request.client.host if request.client else "unknown"

    def same_origin(request: Request) -> bool:
        """A POST from this app's own pages: Origin (else Referer) names this host.

        Browsers send Origin with every cross-site form POST, so a foreign page cannot
        start, answer or log in on a worker's behalf. A client that sends neither (curl,
        the load tests) holds no browser's cookies and is let through.
        """
        origin = request.headers.get("origin")
        if origin is None:
            referer = request.headers.get("referer")
            if not referer:
                return True
            parts = urlsplit(referer)
            origin = f"{parts.scheme}://{parts.netloc}"
        origin = origin.rstrip("/").lower()
        if origin in allowed_origins:
            return True
        host = (request.headers.get("host") or "").lower()
        return bool(host) and urlsplit(origin).netloc == host

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Response:
        if request.method == "POST" and not same_origin(request):
            response: Response = error(
                request,
                "This form was sent from another web site and was refused. Open the study "
                "from its own address.",
                403,
            )
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def current(request: Request) -> Assignment | None:
        a = store.by_session(request.cookies.get(session_cookie))
        return a if a is not None and a.run_key == study.run_key else None

    def redirect(path: str) -> RedirectResponse:
        return RedirectResponse(path, status_code=303)

    def login_page(request: Request, status: int, message: str | None = None) -> Response:
        return page(request, "admin_login.html", status, error=message)

    def too_many(
        request: Request,
        wait: int,
        login: bool,
        text: str = "Too many wrong admin tokens from your address; try again later.",
    ) -> Response:
        """429 with ``Retry-After``, on the login page or an error page."""
        slow = login_page(request, 429, text) if login else error(request, text, 429)
        slow.headers["Retry-After"] = str(wait)
        return slow

    def admin_check(request: Request, given: list[tuple[str, str]]) -> int:
        """The one admin rule, for every path (login form, admin cookie, bearer token):
        0 when a presented credential is right, -1 when all are wrong (one failure in the
        admin throttle), else the seconds to wait. While the throttle holds, every
        credential is refused, the right one included: otherwise a guessing loop would
        still learn the token from the first 200."""
        key = client_key(request)
        wait = admin_throttle.retry_after(key)
        if wait:
            return wait
        if any(same_secret(value, expected) for value, expected in given):
            return 0
        admin_throttle.fail(key)
        return -1

    def admin_refusal(request: Request, needs: str | None = None) -> Response | None:
        """None when the request carries the admin cookie or ``Authorization: Bearer``
        token; otherwise the refusal: the login page (``needs`` None) or an error page.
        A request that presents neither is refused without counting a failure."""
        cookie = request.cookies.get(admin_cookie, "")
        auth = request.headers.get("authorization", "")
        bearer = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        pairs = ((cookie, admin_cookie_value), (bearer, settings.admin_token))
        given = [(value, expected) for value, expected in pairs if value]
        verdict = admin_check(request, given) if given else -1
        if verdict == 0:
            return None
        if verdict > 0:
            return too_many(request, verdict, login=needs is None)
        if needs is None:
            return login_page(request, 401, "Wrong admin token." if given else None)
        return error(request, needs, 401)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error(request, str(exc.detail), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _bad_form(request: Request, exc: RequestValidationError) -> Response:
        return error(request, "The form was incomplete or malformed.", 400)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> Response:
        """A crash still answers with a page that says what happened to the answer.

        Every answer is one transaction: an error before its COMMIT rolled it back, and
        the task page always shows the first task without a stored answer.
        """
        log.exception("%s %s failed", request.method, request.url.path)
        saved = None
        if request.method == "POST" and request.url.path == "/answer":
            saved = (
                "Your answer may not have been saved. Open the task page: if the same task "
                "is shown, answer it again (an answer is never stored twice)."
            )
        return error(request, "The server hit an internal error.", 500, saved=saved)

    # -- worker pages -----------------------------------------------------------
    @app.get("/healthz")
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
        return page(
            request,
            "start.html",
            status,
            worker_id=worker_id[:200],
            current=current(request),
            rule=WORKER_ID_RULE,
            error=error_text,
            ask_resume=ask_resume,
            platform=platform or {},
        )

    @app.get("/", response_class=HTMLResponse)
    def start_page(request: Request, worker_id: str = "") -> HTMLResponse:
        """``/?worker_id=…`` or Prolific's ``/?PROLIFIC_PID=…&STUDY_ID=…&SESSION_ID=…``."""
        q = request.query_params
        platform = {
            field_: q[param][:200]
            for param, field_ in PLATFORM_PARAMS.items()
            if param in q and field_ != "worker_id"
        }
        return start_form(request, worker_id=q.get("PROLIFIC_PID", worker_id), platform=platform)

    @app.post("/start")
    def start(
        request: Request,
        worker_id: str = Form(""),
        resume_code: str = Form(""),
        study_id: str = Form(""),
        session_id: str = Form(""),
    ) -> Response:
        platform = {
            k: v[:200] for k, v in (("study_id", study_id), ("session_id", session_id)) if v
        }
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
        wait = resume_throttle.retry_after(key) if resume_code else 0
        if wait:
            return too_many(
                request, wait, login=False, text="Too many wrong resume codes; try again later."
            )
        try:
            a = store.assign(
                study.run_key,
                clean,
                session_token=request.cookies.get(session_cookie),
                resume_code=resume_code.strip()[:20] or None,
                platform_session=session_id[:200] or None,
                client=key,
            )
        except ResumeRequired as refused:
            if resume_code:
                resume_throttle.fail(key)
            return start_form(request, 409, clean, platform, refused.reason, ask_resume=True)
        except BundleRefused as refused:
            return error(request, refused.reason, refused.status, heading="No bundle for you")
        response: Response = redirect("/task" if a.instructions_at else "/instructions")
        response.set_cookie(
            session_cookie,
            a.session_token,
            httponly=True,
            samesite="lax",
            secure=settings.secure_cookies,
            max_age=14 * 24 * 3600,
        )
        return response

    def active(request: Request) -> Assignment | Response:
        """The worker's assignment, taken back if its lease ran out and nobody took it."""
        a = current(request)
        if a is None:
            return redirect("/")
        if a.released:
            try:
                return store.reclaim(a.assignment_id)
            except BundleRefused as refused:
                return error(request, refused.reason, refused.status, heading="Bundle released")
        return a

    @app.get("/instructions", response_class=HTMLResponse)
    def instructions(request: Request) -> Response:
        a = active(request)
        if not isinstance(a, Assignment):
            return a
        return page(
            request,
            "instructions.html",
            assignment=a,
            instructions=instructions_html,
            options=options,
            descriptions=study.label_descriptions,
        )

    @app.post("/instructions")
    def acknowledge(request: Request) -> Response:
        a = active(request)
        if not isinstance(a, Assignment):
            return a
        store.acknowledge_instructions(a.assignment_id)
        return redirect("/task")

    @app.get("/task", response_class=HTMLResponse)
    def task(request: Request) -> Response:
        mine = current(request)
        if mine is not None and mine.done:
            return redirect("/done")
        a = active(request)
        if not isinstance(a, Assignment):
            return a
        if a.instructions_at is None:
            return redirect("/instructions")
        nxt = store.next_task(a)
        if nxt is None:
            return redirect("/done")
        return page(
            request,
            "task.html",
            assignment=a,
            task=nxt,
            display_text=study.display_text(nxt.task_id),
            options=options,
        )

    @app.post("/answer")
    def answer(request: Request, position: str = Form(""), answer: str = Form("")) -> Response:
        a = current(request)
        if a is None:
            return error(request, "Your session has expired; enter your worker ID again.", 403)
        if answer not in study.options:
            return error(request, f"“{answer[:200]}” is not one of the answer options.", 400)
        if not POSITION_RE.fullmatch(position):
            return error(request, f"“{position[:50]}” is not a task position.", 400)
        try:
            result = store.record_answer(a.assignment_id, int(position), answer)
        except AnswerRejected as rejected:
            return error(request, rejected.reason, rejected.status)
        return redirect("/done" if result.completed else "/task")

    @app.get("/done", response_class=HTMLResponse)
    def done(request: Request) -> Response:
        a = current(request)
        if a is None:
            return redirect("/")
        if not a.done:
            return redirect("/task")
        if settings.completion_url:
            return redirect(completion_link(settings.completion_url, a.completion_code or ""))
        return page(request, "done.html", assignment=a)

    # -- admin ----------------------------------------------------------------------
    def admin_page(request: Request, notice: str | None = None, status: int = 200) -> Response:
        store.expire_leases(study.run_key)
        progress = store.progress(study.run_key)
        rows = progress.astype(object).where(progress.notna(), None).to_dict("records")
        released = store.released(study.run_key)
        summary = {
            "bundles": len(progress),
            "assigned": int(progress["worker_id"].notna().sum()),
            "completed": int(progress["completed_at"].notna().sum()),
            "answers": int(progress["n_answered"].sum()),
            "released_answers": int(released["n_answered"].sum()),
            "tasks": int(progress["n_tasks"].sum()),
        }
        return page(
            request,
            "admin.html",
            status,
            rows=rows,
            released=released.to_dict("records"),
            summary=summary,
            run_key=study.run_key,
            notice=notice,
            lease_minutes=settings.lease.lease_minutes,
        )

    @app.get("/admin", response_class=HTMLResponse)
    def admin(request: Request) -> Response:
        return admin_refusal(request) or admin_page(request)

    @app.post("/admin/login")
    def admin_login(request: Request, token: str = Form("")) -> Response:
        verdict = admin_check(request, [(token, settings.admin_token)])
        if verdict > 0:
            return too_many(request, verdict, login=True)
        if verdict < 0:
            return login_page(request, 401, "Wrong admin token.")
        response: Response = redirect("/admin")
        response.set_cookie(
            admin_cookie,
            admin_cookie_value,
            httponly=True,
            samesite="strict",
            secure=settings.secure_cookies,
        )
        return response

    @app.post("/admin/logout")
    def admin_logout() -> Response:
        response = redirect("/admin")
        response.delete_cookie(admin_cookie)
        return response

    @app.post("/admin/release")
    def admin_release(request: Request, bundle_id: str = Form("")) -> Response:
        denied = admin_refusal(request, "Releasing a bundle needs the admin token.")
        if denied is not None:
            return denied
        try:
            a = store.release(study.run_key, bundle_id)
        except BundleRefused as refused:
            return admin_page(request, refused.reason, 409)
        return admin_page(request, f"Bundle {a.bundle_id} released from {a.worker_id}.")

    @app.post("/admin/reassign")
    def admin_reassign(
        request: Request, bundle_id: str = Form(""), worker_id: str = Form("")
    ) -> Response:
        denied = admin_refusal(request, "Reassigning a bundle needs the admin token.")
        if denied is not None:
            return denied
        clean = valid_worker_id(worker_id)
        if clean is None:
            return admin_page(request, f"Not a valid worker ID. Use {WORKER_ID_RULE}.", 400)
        try:
            a = store.reassign(study.run_key, bundle_id, clean)
        except BundleRefused as refused:
            return admin_page(request, refused.reason, 409)
        return admin_page(
            request,
            f"Bundle {a.bundle_id} given to {a.worker_id}: they start on the study page with "
            f"their worker ID and resume code {a.resume_code}.",
        )

    @app.get("/admin/export.csv")
    def admin_export(request: Request) -> Response:
        denied = admin_refusal(request, "The export needs the admin token.")
        if denied is not None:
            return denied
        body = to_csv_bytes(answers_frame(store, study))
        return Response(
            body,
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="answers.csv"'},
        )

    return app


def completion_link(template: str, code: str) -> str:
    """The platform's completion URL with the code put in (URL-quoted) for ``{code}``.

    >>> completion_link("https://app.prolific.com/submissions/complete?cc={code}", "AB CD")
    'https://app.prolific.com/submissions/complete?cc=AB%20CD'
    """
    return template.replace("{code}", quote(code, safe=""))


def render_instructions(markdown: str) -> Markup:
    """Markdown → HTML with raw HTML escaped and headings one level down (the page owns h1)."""
    md = MarkdownIt("commonmark", {"html": False})
    tokens = md.parse(markdown)
    for tok in tokens:
        if tok.type in ("heading_open", "heading_close"):
            tok.tag = f"h{min(6, int(tok.tag[1]) + 1)}"
    return Markup(md.renderer.render(tokens, md.options, {}))


def _options(study: Study) -> list[dict[str, Any]]:
    """Buttons in order with their keyboard shortcuts: 1..9 for labels, 0 or ? for IDK."""
    out: list[dict[str, Any]] = []
    for i, name in enumerate(study.label_names):
        keys = [str(i + 1)] if i < 9 else []
        out.append({"value": name, "shortcuts": keys, "idk": False})
    out.append({"value": IDK, "shortcuts": ["0", "?"], "idk": True})
    return out


@contextmanager
def background_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread (tests, load runs); yields the base URL.

    Port 0 lets the OS pick a free port, read back from the bound socket, so parallel
    runs never collide. The server is stopped and joined on exit.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="annotate-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the annotation server did not start")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
