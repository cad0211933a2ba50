"""What the annotation app's routes share: its settings (the ``annotate`` node,
:class:`~saleval.config.annotate.AnnotateConfig`), its study and store, and the page
helpers every route answers with.

One :class:`AppState` per app, kept as ``app.state.annotate`` and read by the routes
(:func:`state_of`), so the worker routes (:mod:`saleval.annotate.routes_worker`) and the
admin routes (:mod:`saleval.annotate.routes_admin`) are plain module functions rather
than closures inside one long factory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from saleval.annotate.comprehension import Question
from saleval.annotate.security import SECURITY_HEADERS, Throttle
from saleval.annotate.store_answers import AnnotationStore
from saleval.annotate.store_leases import Assignment
from saleval.annotate.store_participants import Participant
from saleval.annotate.study import Study
from saleval.config.annotate import AnnotateConfig

NOT_SAVED = "Your answer was NOT saved."


@dataclass
class AppState:
    """One app's study, store, cookies, throttles and templates, built by ``create_app``
    from the study and the typed ``annotate`` node (``settings``, resolved, with the admin
    token in it)."""

    study: Study
    store: AnnotationStore
    settings: AnnotateConfig
    templates: Jinja2Templates
    title: str
    admin_token: str  # settings.admin_token, checked by create_app
    session_cookie: str  # per task set: several apps may share a host
    admin_cookie: str
    admin_cookie_value: str
    instructions_html: Markup
    options: list[dict[str, Any]]
    # two throttles: admin guesses must not lock workers out of resuming (docs/annotate.md)
    admin_throttle: Throttle
    resume_throttle: Throttle
    allowed_origins: frozenset[str]
    participant_cookie: str  # the participant before (and beside) their bundle's session
    questions: list[Question]  # the comprehension check (empty when it is off)
    excluded: frozenset[str]  # the pilot's participants (worker-ID rule keys)
    seconds_hint: float | None  # pay.seconds_per_task, else the pilot's median

    def participant(self, request: Request) -> Participant | None:
        """The participant of the request's cookie, if of this task set."""
        p = self.store.by_participant_token(request.cookies.get(self.participant_cookie))
        return p if p is not None and p.run_key == self.study.run_key else None

    def set_cookie(self, response: Response, name: str, value: str) -> None:
        """A worker's cookie: HTTP only, same-site lax, two weeks."""
        response.set_cookie(
            name,
            value,
            httponly=True,
            samesite="lax",
            secure=self.settings.secure_cookies,
            max_age=14 * 24 * 3600,
        )

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A template rendered with the app's title, with the security headers set here
        too: a 500 is answered where no middleware runs."""
        base = {"title": self.title, "dataset": self.study.dataset}
        response = self.templates.TemplateResponse(
            request, name, {**base, **context}, status_code=status
        )
        response.headers.update(SECURITY_HEADERS)
        response.headers["Cache-Control"] = "no-store"
        return response

    def error(
        self,
        request: Request,
        message: str,
        status: int,
        heading: str = "Sorry",
        saved: str | None = None,
    ) -> HTMLResponse:
        """The error page; a refused ``POST /answer`` says its answer was not saved."""
        if saved is None and request.method == "POST" and request.url.path == "/answer":
            saved = NOT_SAVED
        return self.page(
            request, "error.html", status, heading=heading, message=message, saved=saved
        )

    def login_page(self, request: Request, status: int, message: str | None = None) -> Response:
        return self.page(request, "admin_login.html", status, error=message)

    def too_many(
        self,
        request: Request,
        wait: int,
        login: bool,
        text: str = "Too many wrong admin tokens from your address; try again later.",
    ) -> Response:
        """429 with ``Retry-After``, on the login page or an error page."""
        slow = self.login_page(request, 429, text) if login else self.error(request, text, 429)
        slow.headers["Retry-After"] = str(wait)
        return slow

    def current(self, request: Request) -> Assignment | None:
        """The assignment of the request's session cookie, if it is of this task set."""
        a = self.store.by_session(request.cookies.get(self.session_cookie))
        return a if a is not None and a.run_key == self.study.run_key else None


def completion_link(template: str, code: str) -> str:
    """The platform's completion URL with the code put in (URL-quoted) for ``{code}``.

    >>> completion_link("https://app.prolific.com/submissions/complete?cc={code}", "AB CD")
    'https://app.prolific.com/submissions/complete?cc=AB%20CD'
    """
    return template.replace("{code}", quote(code, safe=""))


def redirect(path: str) -> RedirectResponse:
    """Post/redirect/get: a reload never resubmits."""
    return RedirectResponse(path, status_code=303)


def state_of(request: Request) -> AppState:
    """The state of the app serving ``request``."""
    state: AppState = request.app.state.annotate
    return state
