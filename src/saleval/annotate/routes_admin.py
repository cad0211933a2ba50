"""The admin view (``/admin``): bundles with their lease status, release, reassign, export.

Protected by a token (environment or file), compared in constant time. Every wrong admin
credential (login form, admin cookie, ``Authorization: Bearer``) counts in one throttle
per client (:func:`admin_check`, the one admin rule); a worker's session never opens the
admin view. docs/annotate.md is the operator's guide.
"""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from saleval.annotate.export import answers_frame, to_csv_bytes
from saleval.annotate.security import WORKER_ID_RULE, client_key, same_secret, valid_worker_id
from saleval.annotate.state import redirect, state_of
from saleval.annotate.store_leases import BundleRefused

router = APIRouter()


def admin_check(request: Request, given: list[tuple[str, str]]) -> int:
    """The one admin rule, for every path (login form, admin cookie, bearer token):
    0 when a presented credential is right, -1 when all are wrong (one failure in the
    admin throttle), else the seconds to wait. While the throttle holds, every
    credential is refused, the right one included: otherwise a guessing loop would
    still learn the token from the first 200."""
    throttle = state_of(request).admin_throttle
    key = client_key(request)
    wait = throttle.retry_after(key)
    if wait:
        return wait
    if any(same_secret(value, expected) for value, expected in given):
        return 0
    throttle.fail(key)
    return -1


def admin_refusal(request: Request, needs: str | None = None) -> Response | None:
    """None when the request carries the admin cookie or ``Authorization: Bearer``
    token; otherwise the refusal: the login page (``needs`` None) or an error page.
    A request that presents neither is refused without counting a failure."""
    st = state_of(request)
    cookie = request.cookies.get(st.admin_cookie, "")
    auth = request.headers.get("authorization", "")
    bearer = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
    pairs = ((cookie, st.admin_cookie_value), (bearer, st.admin_token))
    given = [(value, expected) for value, expected in pairs if value]
    verdict = admin_check(request, given) if given else -1
    if verdict == 0:
        return None
    if verdict > 0:
        return st.too_many(request, verdict, login=needs is None)
    if needs is None:
        return st.login_page(request, 401, "Wrong admin token." if given else None)
    return st.error(request, needs, 401)


def admin_page(request: Request, notice: str | None = None, status: int = 200) -> Response:
    """Every bundle's progress and lease, the released ones, and totals."""
    st = state_of(request)
    run_key = st.study.run_key
    st.store.expire_leases(run_key)
    progress = st.store.progress(run_key)
    rows = progress.astype(object).where(progress.notna(), None).to_dict("records")
    released = st.store.released(run_key)
    summary = {
        "bundles": len(progress),
        "assigned": int(progress["worker_id"].notna().sum()),
        "completed": int(progress["completed_at"].notna().sum()),
        "answers": int(progress["n_answered"].sum()),
        "released_answers": int(released["n_answered"].sum()),
        "tasks": int(progress["n_tasks"].sum()),
    }
    return st.page(
        request,
        "admin.html",
        status,
        rows=rows,
        released=released.to_dict("records"),
        summary=summary,
        run_key=run_key,
        notice=notice,
        lease_minutes=st.settings.lease_minutes,
    )


@router.get("/admin", response_class=HTMLResponse)
def admin(request: Request) -> Response:
    return admin_refusal(request) or admin_page(request)


@router.post("/admin/login")
def admin_login(request: Request, token: str = Form("")) -> Response:
    st = state_of(request)
    verdict = admin_check(request, [(token, st.admin_token)])
    if verdict > 0:
        return st.too_many(request, verdict, login=True)
    if verdict < 0:
        return st.login_page(request, 401, "Wrong admin token.")
    response: Response = redirect("/admin")
    response.set_cookie(
        st.admin_cookie,
        st.admin_cookie_value,
        httponly=True,
        samesite="strict",
        secure=st.settings.secure_cookies,
    )
    return response


@router.post("/admin/logout")
def admin_logout(request: Request) -> Response:
    response = redirect("/admin")
    response.delete_cookie(state_of(request).admin_cookie)
    return response


@router.post("/admin/release")
def admin_release(request: Request, bundle_id: str = Form("")) -> Response:
    denied = admin_refusal(request, "Releasing a bundle needs the admin token.")
    if denied is not None:
        return denied
    st = state_of(request)
    try:
        a = st.store.release(st.study.run_key, bundle_id)
    except BundleRefused as refused:
        return admin_page(request, refused.reason, 409)
    return admin_page(request, f"Bundle {a.bundle_id} released from {a.worker_id}.")


@router.post("/admin/reassign")
def admin_reassign(
    request: Request, bundle_id: str = Form(""), worker_id: str = Form("")
) -> Response:
    denied = admin_refusal(request, "Reassigning a bundle needs the admin token.")
    if denied is not None:
        return denied
    st = state_of(request)
    clean = valid_worker_id(worker_id)
    if clean is None:
        return admin_page(request, f"Not a valid worker ID. Use {WORKER_ID_RULE}.", 400)
    try:
        a = st.store.reassign(st.study.run_key, bundle_id, clean)
    except BundleRefused as refused:
        return admin_page(request, refused.reason, 409)
    return admin_page(
        request,
        f"Bundle {a.bundle_id} given to {a.worker_id}: they start on the study page with "
        f"their worker ID and resume code {a.resume_code}.",
    )


@router.get("/admin/export.csv")
def admin_export(request: Request) -> Response:
    denied = admin_refusal(request, "The export needs the admin token.")
    if denied is not None:
        return denied
    st = state_of(request)
    body = to_csv_bytes(answers_frame(st.store, st.study))
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="answers.csv"'},
    )
