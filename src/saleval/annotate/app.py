"""The annotation app: FastAPI, server-rendered Jinja2 pages, no build step.

Flow for a worker: ``/`` (enter a worker id) → ``/instructions`` (once, before the first
task) → ``/task`` (one task per page, label buttons + "I don't know", progress bar) →
``/done`` (completion code). Every answer is a plain form POST followed by a redirect
(post/redirect/get), so a reload never resubmits and always shows the first unanswered
task: the position comes from the database, never from the browser's history.

Worker input is untrusted: ids must match :data:`WORKER_ID_RE`, answers must be one of
the study's options and the position the one currently shown; Jinja2 autoescaping is on
for every template and a strict Content-Security-Policy forbids inline script.

The admin view (``/admin``) is protected by a token from config, checked with
:func:`secrets.compare_digest`; a worker's session never opens it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import uvicorn
from fastapi import FastAPI, Form, Request
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
)
from saleval.annotate.study import IDK, Study, load_study

_HERE = Path(__file__).resolve().parent

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
    "Referrer-Policy": "no-referrer",
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


def valid_worker_id(raw: str) -> str | None:
    """The stripped id if it is acceptable, else None."""
    value = (raw or "").strip()
    return value if WORKER_ID_RE.fullmatch(value) else None


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

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        base = {"title": title, "dataset": study.dataset}
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)

    def error(request: Request, message: str, status: int, heading: str = "Sorry") -> HTMLResponse:
        return page(request, "error.html", status, heading=heading, message=message)

    def current(request: Request) -> Assignment | None:
        a = store.by_session(request.cookies.get(session_cookie))
        return a if a is not None and a.run_key == study.run_key else None

    def redirect(path: str) -> RedirectResponse:
        return RedirectResponse(path, status_code=303)

    def is_admin(request: Request) -> bool:
        cookie = request.cookies.get(admin_cookie, "")
        if cookie and hmac.compare_digest(cookie, admin_cookie_value):
            return True
        auth = request.headers.get("authorization", "")
        bearer = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        return bool(bearer) and hmac.compare_digest(bearer.encode(), settings.admin_token.encode())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error(request, str(exc.detail), exc.status_code)

    # -- worker pages -----------------------------------------------------------
    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return JSONResponse({"ok": True, "dataset": study.dataset, "run_key": study.run_key})

    @app.get("/", response_class=HTMLResponse)
    def start_page(request: Request, worker_id: str = "") -> HTMLResponse:
        return page(
            request,
            "start.html",
            worker_id=worker_id[:200],
            current=current(request),
            rule=WORKER_ID_RULE,
            error=None,
        )

    @app.post("/start")
    def start(request: Request, worker_id: str = Form("")) -> Response:
        clean = valid_worker_id(worker_id)
        if clean is None:
            return page(
                request,
                "start.html",
                400,
                worker_id=worker_id[:200],
                current=None,
                rule=WORKER_ID_RULE,
                error=f"“{worker_id[:200]}” is not a valid worker ID. Use {WORKER_ID_RULE}.",
            )
        try:
            a = store.assign(study.run_key, clean)
        except BundleRefused as refused:
            return error(request, refused.reason, refused.status, heading="No bundle for you")
        response = redirect("/task" if a.instructions_at else "/instructions")
        response.set_cookie(
            session_cookie,
            a.session_token,
            httponly=True,
            samesite="lax",
            secure=settings.secure_cookies,
            max_age=14 * 24 * 3600,
        )
        return response

    @app.get("/instructions", response_class=HTMLResponse)
    def instructions(request: Request) -> Response:
        a = current(request)
        if a is None:
            return redirect("/")
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
        a = current(request)
        if a is None:
            return redirect("/")
        store.acknowledge_instructions(a.assignment_id)
        return redirect("/task")

    @app.get("/task", response_class=HTMLResponse)
    def task(request: Request) -> Response:
        a = current(request)
        if a is None:
            return redirect("/")
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
        try:
            pos = int(position)
        except ValueError:
            return error(request, f"“{position[:50]}” is not a task position.", 400)
        try:
            result = store.record_answer(a.assignment_id, pos, answer)
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
        return page(request, "done.html", assignment=a)

    # -- admin ----------------------------------------------------------------------
    @app.get("/admin", response_class=HTMLResponse)
    def admin(request: Request) -> Response:
        if not is_admin(request):
            return page(request, "admin_login.html", 401, error=None)
        progress = store.progress(study.run_key)
        rows = progress.astype(object).where(progress.notna(), None).to_dict("records")
        summary = {
            "bundles": len(progress),
            "assigned": int(progress["worker_id"].notna().sum()),
            "completed": int(progress["completed_at"].notna().sum()),
            "answers": int(progress["n_answered"].sum()),
            "tasks": int(progress["n_tasks"].sum()),
        }
        return page(request, "admin.html", rows=rows, summary=summary, run_key=study.run_key)

    @app.post("/admin/login")
    def admin_login(request: Request, token: str = Form("")) -> Response:
        if not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            return page(request, "admin_login.html", 401, error="Wrong admin token.")
        response = redirect("/admin")
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

    @app.get("/admin/export.csv")
    def admin_export(request: Request) -> Response:
        if not is_admin(request):
            return error(request, "The export needs the admin token.", 401)
        body = to_csv_bytes(answers_frame(store, study))
        return Response(
            body,
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="answers.csv"'},
        )

    return app


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
