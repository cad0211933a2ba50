"""The annotation app's defences that do not depend on the study: who may POST, what
every response carries, which worker ids pass, constant-time secrets and throttles.

Worker input is untrusted: ids must match :data:`WORKER_ID_RE`; every POST must come from
the app's own pages (:func:`same_origin`); every response, error pages included, carries
:data:`SECURITY_HEADERS` (a strict Content-Security-Policy forbids inline script) and is
never cached, static files aside (:func:`security_headers`).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Collection
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response

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


def valid_worker_id(raw: str) -> str | None:
    """The stripped id if it is acceptable, else None."""
    value = (raw or "").strip()
    return value if WORKER_ID_RE.fullmatch(value) else None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of any two strings; never raises (non-ASCII included)."""
    return hmac.compare_digest(
        given.encode("utf-8", "backslashreplace"), expected.encode("utf-8", "backslashreplace")
    )


#: the window of both throttles: ``annotate.admin_max_failures`` wrong admin credentials and
#: ``annotate.resume_max_failures`` wrong resume codes per client per 15 minutes
FAILURE_WINDOW_S = 15 * 60.0


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


def client_key(request: Request) -> str:
    """The client a throttle counts against (uvicorn puts ``X-Forwarded-For`` here for
    trusted proxies, ``forwarded_allow_ips``)."""
    return request.client.host if request.client else "unknown"


def same_origin(request: Request, allowed_origins: Collection[str]) -> bool:
    """A POST from this app's own pages: Origin (else Referer) names this host, or one of
    ``allowed_origins`` (lower case, no trailing ``/``).

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


async def security_headers(
    request: Request,
    call_next: Callable[[Request], Awaitable[Response]],
    *,
    allowed_origins: Collection[str],
    refuse: Callable[[Request], Response],
) -> Response:
    """The app's HTTP middleware: a POST from elsewhere gets ``refuse(request)`` instead of
    its route; every response gets the security headers, and all but static files
    ``Cache-Control: no-store``."""
    if request.method == "POST" and not same_origin(request, allowed_origins):
        response = refuse(request)
    else:
        response = await call_next(request)
    response.headers.update(SECURITY_HEADERS)
    if not request.url.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response
