"""Is the tracking store fit to use: no password in any setting, reachable, ours to write
(the user's view: docs/tracking.md, *When the tracking server fails*).

* **No credential in any artefact.** saleval writes its config into every run dir
  (``config.yaml``, ``run.json``, Hydra's ``.hydra/*.yaml``), logs it to MLflow and prints
  its tracking URI. A secret inside a URL (a password, ``http://user:secret@host``,
  ``postgresql://user:secret@host/db``; an http user-info, often a token; a query, fragment
  or path parameter named like a credential, ``?token=``, ``;api_key=``) would land in all
  of them, so any setting holding one is refused before anything is written, in one line
  that masks it and says where the secret goes instead (:func:`secret_problem`):
  ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` (or
  ``MLFLOW_TRACKING_TOKEN``) for a tracking server, the database's own password file for
  a database URI. :func:`redact` shows a URI without its secrets.
* **The store is checked once, before any work** (:func:`check_store`): a server is asked
  one cheap question within ``tracking.wait_s`` seconds (default 15); unreachable, 401
  (no or wrong credentials) and 403 (not permitted) each end the stage in one line naming
  the URI, the cause and the fix (:class:`TrackingError`). MLflow's own retries (about four
  minutes by default) stay for the calls of a run that has started, so a short outage mid-run
  costs nothing.
* :func:`store_failure` tells an error of the store (a lost connection, an HTTP error
  status, a database that went away) from any other, so that a run whose server stops
  answering after it started goes on and keeps what it could not log
  (:mod:`saleval.pipeline.tracker.tracking_journal`).

This module imports MLflow only inside the functions that talk to a server, so the console
scripts can check settings for passwords before they import anything.

>>> redact("http://lab-jobs:s3cret@mlflow.lab:5000")
'http://lab-jobs:***@mlflow.lab:5000'
>>> print(secret_problem("tracking.uri", "http://lab-jobs:s3cret@mlflow.lab:5000"))
tracking.uri=http://lab-jobs:***@mlflow.lab:5000 holds a password, which saleval would write into config.yaml, run.json, Hydra's files, MLflow and its printed lines: pass tracking.uri=http://mlflow.lab:5000 and give the account in the environment: MLFLOW_TRACKING_USERNAME=lab-jobs and MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials; a bearer token: MLFLOW_TRACKING_TOKEN)
>>> redact("http://mlflow.lab:5000/?token=abc123&view=runs")
'http://mlflow.lab:5000/?token=***&view=runs'
>>> secret_problem("tracking.uri", "sqlite:///outputs/mlflow.db") is None
True
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from saleval.errors import UserError

#: a URL's user-info with a password: ``scheme://user:password@``
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://(?P<user>[^/\s:@]*):)(?P<pw>[^/\s]+)@")
#: a URL's user-info without a password: ``scheme://name@`` (an http token passed as the user)
_BARE_USER = re.compile(
    r"(?P<head>\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)(?P<user>[^/\s:@?#;'\"]+)@"
)
#: a ``name=value`` of a URL's query string or fragment, and of its path (``;name=value``)
_PARAM = re.compile(r"(?P<head>[?&#](?P<name>[A-Za-z0-9_.~-]+)=)(?P<value>[^&;#\s'\"]*)")
_PATH_PARAM = re.compile(r"(?P<head>;(?P<name>[A-Za-z0-9_.~-]+)=)(?P<value>[^/&;?#\s'\"]*)")
#: a URL anywhere in a text (a setting, a YAML file Hydra wrote)
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
#: parameter names whose value is a credential (matched on the lower-cased name)
_SECRET_NAME = re.compile(
    r"token|secret|passw|pwd|api[_-]?key|apikey|access[_-]?key|signature|credential|auth"
    r"|^(key|sig|pass|code|session|sessionid)$"
)
#: the environment variable whose value is a store URI (it wins over ``tracking.uri``)
URI_ENV = "MLFLOW_TRACKING_URI"
#: the default of ``tracking.wait_s`` (saleval.config.common.TrackingConfig)
DEFAULT_WAIT_S = 15.0
#: errors of a full disk or quota: the disk's failure, never the store's
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: MLflow error codes that say the store (not the request) failed
_STORE_CODES = ("INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")
_DATABASES = ("postgresql", "mysql", "mssql", "oracle")
#: stores already found usable by this process: checked once
_CHECKED: set[str] = set()


class TrackingError(UserError, RuntimeError):
    """The tracking store cannot be used as configured: the message says why and what to do."""


def _http(scheme: str) -> bool:
    return scheme.lower().split("+")[0] in ("http", "https")


def _secret_param(name: str) -> bool:
    return _SECRET_NAME.search(name.lower()) is not None


def _redact_url(url: str) -> str:
    url = _USERINFO.sub(lambda m: f"{m['head']}***@", url)
    url = _BARE_USER.sub(lambda m: f"{m['head']}***@" if _http(m["scheme"]) else m[0], url)
    for params in (_PARAM, _PATH_PARAM):
        url = params.sub(lambda m: f"{m['head']}***" if _secret_param(m["name"]) else m[0], url)
    return url


def redact(text: str) -> str:
    """``text`` with every secret of every URL in it replaced by ``***``: a user-info's
    password (and an http URL's whole user-info, often a token), and the value of a query,
    fragment or path parameter named like a credential (``token``, ``api_key``, ``sig``,
    ``X-Amz-Signature``, ...).

    >>> redact("see http://mlflow.lab:5000/?token=abc123&view=1 and postgresql://u@db/x")
    'see http://mlflow.lab:5000/?token=***&view=1 and postgresql://u@db/x'
    """
    return _URL.sub(lambda m: _redact_url(m[0]), text)


def _url_secret(url: str) -> str | None:
    """What secret ``url`` holds, in words (None: none)."""
    if _USERINFO.search(url):
        return "a password"
    bare = _BARE_USER.search(url)
    if bare and _http(bare["scheme"]):
        return "a user-info (an http URL's user-info is a credential)"
    for m in [*_PARAM.finditer(url), *_PATH_PARAM.finditer(url)]:
        if _secret_param(m["name"]) and m["value"]:
            kind = {"?": "query", "&": "query", ";": "path", "#": "fragment"}[m["head"][0]]
            return f"a credential in its {kind} parameter {m['name']!r}"
    return None


def _without_secrets(url: str) -> str:
    """``url`` with its secrets taken out (the user-info's password, an http user-info,
    credential parameters): the value to pass instead."""
    url = _USERINFO.sub(lambda m: m["head"][:-1] + "@", url)
    url = _BARE_USER.sub(lambda m: m["head"] if _http(m["scheme"]) else m[0], url)
    keep = {"?": "?", "#": "#", "&": "", ";": ""}  # the first parameter keeps its ``?``
    for params in (_PARAM, _PATH_PARAM):
        url = params.sub(lambda m: keep[m["head"][0]] if _secret_param(m["name"]) else m[0], url)
    return re.sub(r"([?#])&", r"\1", url).rstrip("?#")


def secret_problem(key: str, value: Any) -> str | None:
    """Why the setting ``key=value`` may not be used (None: it may): a URL in it holds a
    secret (:func:`redact` says which parts count). The line masks it and says where the
    secret goes instead."""
    if not isinstance(value, str):
        return None
    found = [(m[0], _url_secret(m[0])) for m in _URL.finditer(value)]
    found = [(url, what) for url, what in found if what]
    if not found:
        return None
    url, what = found[0]
    userinfo = _USERINFO.search(url)
    user = userinfo["user"] if userinfo else ""
    scheme = url.split(":")[0].lower()
    where = (
        f"{key}={redact(value)} holds {what}, which saleval would write into config.yaml, "
        "run.json, Hydra's files, MLflow and its printed lines"
    )
    bare = value.replace(url, _without_secrets(url))
    if _http(scheme):
        account = (
            f"MLFLOW_TRACKING_USERNAME={user} and " if user else "MLFLOW_TRACKING_USERNAME and "
        )
        return (
            f"{where}: pass {key}={bare} and give the account in the environment: {account}"
            "MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials; a bearer token: "
            "MLFLOW_TRACKING_TOKEN)"
        )
    if scheme.split("+")[0] in _DATABASES:
        return (
            f"{where}: pass {key}={bare} and keep the password where the database client "
            "reads it (PostgreSQL: ~/.pgpass or PGPASSWORD)"
        )
    return (
        f"{where}: pass {key}={bare} and keep the credentials out of the setting (use the "
        "service's own credential file or environment variable)"
    )


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a plain config container."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, node


def first_secret(items: Iterable[tuple[str, Any]]) -> str | None:
    """The line refusing the first (key, value) that holds a password (None: none does)."""
    for key, value in items:
        problem = secret_problem(key, value)
        if problem:
            return problem
    return None


def environment_problem() -> str | None:
    """``MLFLOW_TRACKING_URI`` holding a password (it wins over ``tracking.uri``)."""
    return secret_problem(URI_ENV, os.environ.get(URI_ENV))


def check_uri(uri: str) -> None:
    """Refuse a store URI that holds a password (:func:`secret_problem`)."""
    source = URI_ENV if os.environ.get(URI_ENV) == uri else "tracking.uri"
    problem = secret_problem(source, uri)
    if problem:
        raise TrackingError(problem)


# -- the store answers: checked once, before any work ---------------------------------


def _account() -> str | None:
    """The user name MLflow sends (environment or ``~/.mlflow/credentials``)."""
    from mlflow.utils.credentials import read_mlflow_creds

    return read_mlflow_creds().username


def _who() -> str:
    user = _account()
    return f"user {user!r}" if user else "a client without credentials"


def _fix_credentials() -> str:
    return (
        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials) "
        "to an account of that server"
    )


def auth_message(uri: str, code: int, experiment: str | None = None, what: str = "") -> str:
    """The one line for a 401 or 403 from the server at ``uri``."""
    shown = redact(uri)
    if code == 401:
        return (
            f"the tracking server {shown} refused {_who()} (401 Unauthorized): {_fix_credentials()}"
        )
    exp = f" experiment {experiment!r}" if experiment else " its experiments"
    return (
        f"the tracking server {shown} does not let {_who()} {what or 'use'}{exp} "
        f"(403 Forbidden): ask its admin for EDIT permission on{exp}, or pick one you may "
        "write to with tracking.experiment=<name>"
    )


def unreachable_message(uri: str, wait_s: float, cause: str) -> str:
    """The one line for a store that did not answer within ``wait_s`` seconds."""
    return (
        f"the tracking store {redact(uri)} did not answer within {wait_s:g} s ({cause}): "
        "start it or fix tracking.uri / MLFLOW_TRACKING_URI; wait longer with "
        "tracking.wait_s=<seconds>, or track into a local store (tracking.uri=sqlite:///<file>) "
        "and copy the runs over later with saleval-catch-up"
    )


def _http_check(uri: str, deadline: float) -> tuple[int | None, str]:
    """One question to the server (the first experiment): (HTTP status, or None when it
    did not answer; the cause)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    timeout = max(1, min(10, int(deadline - time.monotonic()) or 1))
    try:
        response = http_request(
            get_default_host_creds(uri.rstrip("/")),
            "/api/2.0/mlflow/experiments/search",
            "GET",
            max_retries=0,
            backoff_factor=0,
            timeout=timeout,
            raise_on_status=False,
            params={"max_results": 1},
        )
    except Exception as err:
        return None, network_cause(str(err))
    return int(response.status_code), f"HTTP {response.status_code}"


def _tcp_check(uri: str, deadline: float) -> tuple[int | None, str]:
    """A database store: can its port be reached (the database checks the account)."""
    parts = urlsplit(uri)
    default = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}.get(
        parts.scheme.split("+")[0], 5432
    )
    try:
        with socket.create_connection(
            (parts.hostname or "localhost", parts.port or default),
            timeout=max(0.5, min(5.0, deadline - time.monotonic())),
        ):
            return 200, "connected"
    except OSError as err:
        return None, network_cause(str(err))


#: MLflow's settings of its HTTP client that :func:`request_bounds` sets
_HTTP_SETTINGS = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "MLFLOW_HTTP_REQUEST_TIMEOUT")  # fmt: skip


def request_bounds(wait_s: float) -> dict[str, str]:
    """MLflow's HTTP settings under which one call to a server gives up within ``wait_s``
    seconds (docs/tracking.md#when-the-tracking-server-fails). MLflow's defaults (7 retries,
    pauses doubling from 2 s, a 120 s timeout per try) wait about four minutes for a server
    that is gone. Here: 2 retries, pausing 1 s then 2 s (backoff factor 1, no jitter), each
    try at most ``T = (wait_s - 3) // 3`` s, so ``3 T + 3 <= wait_s``; under 7 s, one try
    of ``wait_s``.

    >>> request_bounds(15)["MLFLOW_HTTP_REQUEST_MAX_RETRIES"], request_bounds(15)["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    ('2', '4')
    >>> request_bounds(5)["MLFLOW_HTTP_REQUEST_MAX_RETRIES"], request_bounds(5)["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    ('0', '5')
    """
    retries, timeout = (2, int((wait_s - 3) // 3)) if wait_s >= 7 else (0, max(1, int(wait_s)))
    return dict(zip(_HTTP_SETTINGS, (str(retries), "1", "0", str(timeout)), strict=True))


def bound_requests(wait_s: float | None) -> None:
    """Set :func:`request_bounds` for this process and the processes it starts (a launcher's
    jobs inherit them): every wait on the store is bounded by ``tracking.wait_s``."""
    os.environ.update(request_bounds(DEFAULT_WAIT_S if wait_s is None else float(wait_s)))


def check_store(uri: str, wait_s: float | None = None, experiment: str | None = None) -> None:
    """Check, once per process, that the store at ``uri`` answers and accepts this client,
    waiting at most ``wait_s`` seconds for it to come up (a server starting, a short
    network blip); MLflow's later calls to a server give up within ``wait_s`` too
    (:func:`bound_requests`). A local store (SQLite, a directory) needs no check. Raises
    :class:`TrackingError` with the one line the console scripts print."""
    check_uri(uri)
    scheme = urlsplit(uri).scheme.split("+")[0].lower()
    if scheme in ("http", "https"):
        bound_requests(wait_s)
    if uri in _CHECKED or scheme not in ("http", "https", *_DATABASES):
        return
    wait = DEFAULT_WAIT_S if wait_s is None else float(wait_s)
    deadline = time.monotonic() + wait
    ask = _http_check if scheme in ("http", "https") else _tcp_check
    while True:
        status, cause = ask(uri, deadline)
        if status == 200:
            _CHECKED.add(uri)
            return
        if status in (401, 403):
            raise TrackingError(auth_message(uri, status, experiment, "read"))
        if status == 404:
            raise TrackingError(
                f"{redact(uri)} answered 404 to MLflow's REST API: it is not an MLflow "
                "tracking server (or the path is wrong): fix tracking.uri / MLFLOW_TRACKING_URI"
            )
        if time.monotonic() >= deadline:
            raise TrackingError(unreachable_message(uri, wait, cause))
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def forget_checks() -> None:
    """Check every store again (a test that stops and starts its server)."""
    _CHECKED.clear()


# -- which errors are the store's ------------------------------------------------------


def network_cause(message: str) -> str:
    """A short cause from a connection error's message.

    >>> network_cause("HTTPConnectionPool(...): Max retries exceeded (Caused by "
    ...               "NewConnectionError('...: [Errno 111] Connection refused'))")
    'connection refused'
    """
    text = message.lower()
    for needle, cause in (
        ("connection refused", "connection refused"),
        ("timed out", "timed out"),
        ("timeout", "timed out"),
        ("name or service not known", "unknown host"),
        ("nodename nor servname", "unknown host"),
        ("temporary failure in name resolution", "unknown host"),
        ("no route to host", "no route to host"),
        ("network is unreachable", "network unreachable"),
        ("connection reset", "connection reset"),
        ("remote end closed", "connection closed by the server"),
        ("connection aborted", "connection closed by the server"),
        ("too many 50", "the server keeps answering 5xx"),
        ("ssl", "TLS error"),
    ):
        if needle in text:
            return cause
    return " ".join(message.split())[:120] or "no answer"


def _http_code(message: str) -> int | None:
    m = re.search(r"error code (\d{3})", message) or re.search(r"\b(401|403)\b", message)
    return int(m.group(1)) if m else None


def store_failure(err: BaseException) -> str | None:
    """A short cause when ``err`` is the tracking store failing (unreachable, an HTTP error
    status after MLflow's retries, 401/403, a database connection lost), else None: a full
    disk, a bad request or a bug in the caller are not the store's and must not be hidden.

    >>> store_failure(OSError(28, "No space left on device")) is None
    True
    >>> store_failure(ConnectionRefusedError(111, "Connection refused"))
    'connection refused'
    """
    if isinstance(err, OSError) and err.errno in DISK_FULL:
        return None
    message = " ".join(str(err).split())
    code = getattr(err, "error_code", None)
    if code == "UNAUTHENTICATED" or (code is not None and _http_code(message) == 401):
        return "401 Unauthorized"
    if code == "PERMISSION_DENIED" or (code is not None and _http_code(message) == 403):
        return "403 Forbidden"
    if code is not None:  # an MlflowException
        if "API request to" in message and "failed with" in message:
            status = _http_code(message)
            return f"HTTP {status}" if status else network_cause(message)
        if code in _STORE_CODES:
            return f"{code}: {message[:120]}"
        return None
    modules = {c.__module__.split(".")[0] for c in type(err).__mro__}
    if modules & {"requests", "urllib3", "sqlalchemy", "psycopg", "psycopg2", "pymysql"}:
        return network_cause(message)
    if isinstance(err, ConnectionError | TimeoutError | socket.timeout):
        return network_cause(message)
    return None


def _refused(cause: str, uri: str, experiment: str | None = None, action: str = "") -> str | None:
    """:func:`auth_message`'s line when the store's ``cause`` is a 401 or a 403 (None: it
    is not)."""
    if cause.startswith("401"):
        return auth_message(uri, 401)
    if cause.startswith("403"):
        return auth_message(uri, 403, experiment, action)
    return None


def start_message(err: BaseException, uri: str, experiment: str | None) -> str | None:
    """The one line for a store that failed as a run started (None: not the store's)."""
    cause = store_failure(err)
    if cause is None:
        return None
    refused = _refused(cause, uri, experiment, "start runs in")
    if refused:
        return refused
    return (
        f"the tracking store {redact(uri)} failed as the run started ({cause}): nothing was "
        "computed; check the server (and its database), then rerun"
    )


def failure_message(err: BaseException, uri: str) -> str | None:
    """The one line for a store that failed where saleval's journal does not cover it (a
    search before a stage, a library logging straight to MLflow); None: not the store's."""
    cause = store_failure(err)
    if cause is None:
        return None
    refused = _refused(cause, uri)
    if refused:
        return refused
    return (
        f"the tracking store {redact(uri)} failed ({cause}): the run dirs keep what was "
        "computed; once the store answers, rerun (finished runs are reused) or log them "
        "with saleval-catch-up"
    )


@contextlib.contextmanager
def quick_requests(timeout_s: float) -> Iterator[None]:
    """MLflow's HTTP calls in the block try once, for at most ``timeout_s`` seconds, instead
    of retrying for minutes (for a store already known to be down)."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                                             "MLFLOW_HTTP_REQUEST_TIMEOUT")}  # fmt: skip
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(timeout_s)))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
