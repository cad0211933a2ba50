"""The annotation app: FastAPI, server-rendered Jinja2 pages, no build step.

Flow for a worker: ``/`` (enter a worker id) → ``/instructions`` (once, before the first
task) → ``/task`` (one task per page, label buttons + "I don't know", progress bar) →
``/done`` (completion code). The app is built from three parts sharing one
:class:`~saleval.annotate.state.AppState`:

* :mod:`saleval.annotate.routes_worker`: the worker's pages (post/redirect/get; a bundle
  in progress is handed back only with its session cookie, resume code or platform
  session id);
* :mod:`saleval.annotate.routes_admin`: the token-protected admin view (``/admin``),
  which lists bundles with their lease status and releases or reassigns them;
* :mod:`saleval.annotate.security`: the origin check on every POST, the security headers
  on every page (error pages and 500s included), worker id validation, the throttles.

An error on ``POST /answer`` says whether the answer was saved (:func:`_server_error`).
Wrong admin credentials and wrong resume codes count in separate throttles, so guessing
admin tokens never locks workers behind the same address out of resuming.
docs/annotate.md is the operator's guide.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jinja2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.base import BaseHTTPMiddleware

from saleval.annotate import routes_admin, routes_dashboard, routes_participant, routes_worker
from saleval.annotate.comprehension import Question, default_questions, read_questions
from saleval.annotate.security import FAILURE_WINDOW_S, Throttle, security_headers
from saleval.annotate.state import AppState, state_of
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.study import IDK, Study, load_study
from saleval.config.annotate import AnnotateConfig, AnnotateCrowdConfig

_HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)


def create_app(
    study: Study | str | Path,
    settings: AnnotateConfig,
    crowd: AnnotateCrowdConfig | None = None,
    excluded: Iterable[str] = (),
    seconds_hint: float | None = None,
) -> FastAPI:
    """Build the app for one task set from ``saleval-annotate``'s typed ``annotate`` and
    ``crowd`` nodes (``settings`` resolved: ``annotate.db`` a path and
    ``annotate.admin_token`` the token itself, as
    :func:`saleval.schema.to_schema` gives them); the store is opened and the bundles
    registered now. ``excluded``: worker IDs refused at the start (a pilot's
    participants); ``seconds_hint``: the time per task pay is reckoned at (the pilot's
    median) when ``pay.seconds_per_task`` is not set."""
    if not isinstance(study, Study):
        study = load_study(study)
    if "${" in f"{settings.db} {settings.admin_token}":  # a schema default, never resolved
        raise ValueError(
            "annotate.db or annotate.admin_token is an interpolation (${...}), not resolved: "
            "build the settings with saleval.schema.to_schema(AnnotateConfig, cfg.annotate)"
        )
    if not settings.admin_token or len(settings.admin_token) < 8:
        raise ValueError("annotate.admin_token must be at least 8 characters")
    store = AnnotationStore(Path(settings.db), settings, crowd)
    store.register_run(study.run_key, study.store_dataset, str(study.tasks_dir), study.bundles)
    state = _state(study, store, settings)
    case = store.crowd.worker_id_case
    state.excluded = frozenset(case.key(str(w)) for w in excluded)
    state.seconds_hint = (
        settings.pay.seconds_per_task if settings.pay.seconds_per_task is not None else seconds_hint
    )

    app = FastAPI(title="saleval annotate", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.annotate = state
    app.state.study = study
    app.state.store = store
    app.state.settings = settings
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")
    app.add_middleware(
        BaseHTTPMiddleware,
        dispatch=functools.partial(
            security_headers, allowed_origins=state.allowed_origins, refuse=_foreign_post
        ),
    )
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _bad_form)
    app.add_exception_handler(Exception, _server_error)
    app.include_router(routes_worker.router)
    app.include_router(routes_participant.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_dashboard.router)
    return app


def _state(study: Study, store: AnnotationStore, settings: AnnotateConfig) -> AppState:
    """The app's shared state: cookie names and the admin cookie's value are per task set
    (several apps may share a host), the cookie value an HMAC of the token."""
    token = str(settings.admin_token)  # create_app checked it
    suffix = hashlib.sha256(study.run_key.encode()).hexdigest()[:10]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,  # every echoed value is escaped, in every template
        undefined=jinja2.StrictUndefined,
    )
    return AppState(
        study=study,
        store=store,
        settings=settings,
        templates=Jinja2Templates(env=env),
        title=settings.title or f"Which label? ({study.dataset})",
        admin_token=token,
        session_cookie=f"saleval_s_{suffix}",
        admin_cookie=f"saleval_a_{suffix}",
        admin_cookie_value=hmac.new(
            token.encode(), f"saleval-admin:{study.run_key}".encode(), "sha256"
        ).hexdigest(),
        instructions_html=render_instructions(study.instructions_md),
        options=_options(study),
        admin_throttle=Throttle(settings.admin_max_failures, FAILURE_WINDOW_S),
        resume_throttle=Throttle(settings.resume_max_failures, FAILURE_WINDOW_S),
        allowed_origins=frozenset(o.rstrip("/").lower() for o in settings.allowed_origins),
        participant_cookie=f"saleval_p_{suffix}",
        questions=_questions(study, settings),
        excluded=frozenset(),
        seconds_hint=None,
    )


def _questions(study: Study, settings: AnnotateConfig) -> list[Question]:
    """The comprehension check's questions: the study's file, else the default three."""
    check = settings.comprehension
    if not check.enabled:
        return []
    if check.attempts < 1:
        raise ValueError(f"annotate.comprehension.attempts={check.attempts}: must be at least 1")
    if check.questions_file:
        return read_questions(check.questions_file)
    return default_questions(study.target, study.run_key)


def _foreign_post(request: Request) -> Response:
    """What a POST from another site gets instead of its route."""
    return state_of(request).error(
        request,
        "This form was sent from another web site and was refused. Open the study "
        "from its own address.",
        403,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return state_of(request).error(request, str(exc.detail), exc.status_code)


async def _bad_form(request: Request, exc: Exception) -> Response:
    return state_of(request).error(request, "The form was incomplete or malformed.", 400)


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
    return state_of(request).error(request, "The server hit an internal error.", 500, saved=saved)


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
