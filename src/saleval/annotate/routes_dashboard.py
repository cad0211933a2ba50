"""The researcher's live dashboard (``/admin/dashboard``, and its figures as JSON),
behind the admin token like every admin page (docs/annotate.md#the-dashboard).

The page reloads itself (a meta refresh: the Content-Security-Policy allows no script to
fetch), and shows :func:`saleval.annotate.dashboard.figures`, the figures the serving run
also logs to MLflow.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from saleval.annotate.dashboard import figures
from saleval.annotate.routes_admin import admin_refusal
from saleval.annotate.state import state_of

router = APIRouter()


def _fmt(x: Any, digits: int) -> str:
    return (
        "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"
    )


@router.get("/admin/dashboard")
def dashboard(request: Request) -> Response:
    denied = admin_refusal(request)
    if denied is not None:
        return denied
    st = state_of(request)
    figs = figures(st.store, st.study, st.settings, st.seconds_hint)
    table = figs.pop("participants")
    currency = st.settings.pay.currency
    return st.page(
        request,
        "dashboard.html",
        f=figs,
        rows=table.astype(object).where(table.notna(), None).to_dict("records"),
        run_key=st.study.run_key,
        phase=st.study.phase,
        refresh_s=max(1, int(st.settings.dashboard.refresh_s)),
        window=st.settings.dashboard.rate_window_minutes,
        fmt=_fmt,
        pct=lambda x: "—" if _fmt(x, 1) == "—" else f"{100 * x:.1f} %",
        money=lambda x: "—" if _fmt(x, 2) == "—" else f"{x:.2f} {currency}",
    )


@router.get("/admin/dashboard.json")
def dashboard_json(request: Request) -> Response:
    denied = admin_refusal(request, "The dashboard needs the admin token.")
    if denied is not None:
        return denied
    st = state_of(request)
    figs = figures(st.store, st.study, st.settings, st.seconds_hint)
    table = figs.pop("participants")
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in figs.items()
    }
    rows = table.astype(object).where(table.notna(), None).to_dict("records")
    return JSONResponse({**clean, "participants": rows})
