"""Simulated workers of the annotation app, over HTTP, and what they saw acknowledged.

Each does what a person does through the pages (start with an id, acknowledge the
instructions, GET a task, POST an answer, repeat); a few re-send an answer they already
sent (a double click, a retry after a timeout). :meth:`LoadResult.check` compares the
answers workers saw acknowledged with the admin export: zero lost, zero duplicated.
Workers stop at a deadline. Needs ``httpx`` (the ``dev`` extra).
"""

from __future__ import annotations

import html
import io
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import numpy as np
import pandas as pd

from saleval.pipeline import tables

_POSITION_RE = re.compile(r'name="position" value="(\d+)"')
_OPTION_RE = re.compile(r'name="answer" value="([^"]*)"')
_NOT_SAVED = "NOT saved"  # what every refused answer's page says (saleval.annotate.app)


@dataclass
class WorkerLog:
    worker_id: str
    sent: dict[int, str] = field(default_factory=dict)  # position -> acknowledged answer
    latencies: list[float] = field(default_factory=list)
    resends: int = 0
    retries: int = 0  # requests sent again because no server answered
    failed_pages: list[str] = field(default_factory=list)  # bodies of refused answers
    completion_code: str | None = None
    error: str | None = None
    refused: dict[int, str] = field(default_factory=dict)  # answers the server said NOT saved
    bundle_lost: bool = False  # the bundle went to another worker while this one was away
    no_bundle: bool = False  # never got a bundle before the deadline (all were taken)
    came_back: bool = False  # left mid-bundle and got it back


@dataclass(frozen=True)
class Behaviour:
    """What a simulated worker does besides answering (the attack scenario).

    ``urls``: further servers of the same store, tried in turn when one does not answer
    (as a load balancer would). ``leave_after``: open the next task after that many
    answers, then stay away ``away_s`` (longer than a lease) before answering it.
    ``wait_for_bundle``: a latecomer who retries the start page while every bundle is
    taken. ``may_be_refused``: a refused answer (410, "NOT saved") or a released bundle
    ends the worker's run instead of failing it; those answers count as not
    acknowledged.
    """

    urls: tuple[str, ...] = ()
    leave_after: int | None = None
    away_s: float = 0.0
    wait_for_bundle: bool = False
    may_be_refused: bool = False


def simulate_worker(
    base_url: str,
    worker_id: str,
    seed: int,
    deadline: float,
    resend_prob: float = 0.1,
    start: threading.Barrier | None = None,
    think_s: float = 0.0,
    behaviour: Behaviour | None = None,
) -> WorkerLog:
    """One worker through the pages; an answer counts as sent once the server said 303.

    A request that meets no server (killed, restarting) is sent again until the deadline,
    as a browser's user would reload: the same answer to the same position, which the
    server stores at most once; with ``behaviour.urls`` it goes to the next server.
    """
    rng = random.Random(seed)
    behaviour = behaviour or Behaviour()
    out = WorkerLog(worker_id)
    urls = [base_url, *behaviour.urls]
    try:
        with httpx.Client(base_url=base_url, follow_redirects=False, timeout=60) as c:

            def send(method: str, url: str, data: dict[str, str] | None = None) -> httpx.Response:
                while True:
                    try:
                        return c.request(method, url, data=data)
                    except httpx.TransportError:
                        if time.monotonic() > deadline:
                            raise
                        out.retries += 1
                        if len(urls) > 1:  # the next server of the same store
                            c.base_url = httpx.URL(urls[out.retries % len(urls)])
                        time.sleep(0.2)

            if start is not None:
                start.wait(timeout=60)
            r = send("POST", "/start", {"worker_id": worker_id})
            while behaviour.wait_for_bundle and r.status_code == 410:
                if time.monotonic() > deadline:
                    out.no_bundle = True
                    return out
                time.sleep(0.3)
                r = send("POST", "/start", {"worker_id": worker_id})
            _expect(r, 303, "/instructions")
            _expect(send("POST", "/instructions"), 303, "/task")
            while time.monotonic() < deadline:
                r = send("GET", "/task")
                if r.status_code == 303:
                    _expect(r, 303, "/done")
                    break
                if r.status_code == 410 and behaviour.may_be_refused:
                    out.bundle_lost = True  # released and taken: the page said so
                    return out
                _expect(r, 200)
                match = _POSITION_RE.search(r.text)
                if match is None:
                    raise AssertionError("task page without a position field")
                position = int(match.group(1))
                answer = rng.choice([html.unescape(o) for o in _OPTION_RE.findall(r.text)])
                form = {"position": str(position), "answer": answer}
                away = behaviour.leave_after == len(out.sent) and not out.came_back
                if away:  # the task stays open while the worker is away
                    time.sleep(behaviour.away_s)
                elif think_s:  # reading the task: uniform in [0.5, 1.5] × think_s
                    time.sleep(think_s * rng.uniform(0.5, 1.5))
                t0 = time.perf_counter()
                r = send("POST", "/answer", form)
                out.latencies.append(time.perf_counter() - t0)
                if r.status_code != 303:
                    out.failed_pages.append(r.text)
                if behaviour.may_be_refused and r.status_code == 410 and _NOT_SAVED in r.text:
                    out.refused[position] = answer
                    out.bundle_lost = True
                    return out
                _expect(r, 303)
                out.sent[position] = answer
                out.came_back = out.came_back or away
                if rng.random() < resend_prob:
                    _expect(send("POST", "/answer", form), 303)
                    out.resends += 1
            r = send("GET", "/done")
            _expect(r, 200)
            code = re.search(r'id="completion-code">([^<]+)<', r.text)
            out.completion_code = code.group(1) if code else None
    except Exception as err:  # reported, never swallowed: the caller checks .error
        out.error = f"{type(err).__name__}: {err}"
    return out


def _expect(r: httpx.Response, status: int, location: str | None = None) -> None:
    if r.status_code != status or (location and r.headers.get("location") != location):
        raise AssertionError(
            f"{r.request.method} {r.request.url.path}: {r.status_code} "
            f"{r.headers.get('location', '')} (expected {status} {location or ''})"
        )


@dataclass
class LoadResult:
    workers: list[WorkerLog]
    exported: pd.DataFrame
    seconds: float

    @property
    def latencies(self) -> np.ndarray:
        return np.array([x for w in self.workers for x in w.latencies])

    def check(self) -> dict[str, int]:
        """Lost, duplicated and altered answers between what workers sent and the export."""
        sent = {(w.worker_id, p): a for w in self.workers for p, a in w.sent.items()}
        keys = list(zip(self.exported["worker_id"], self.exported["position"].astype(int)))
        stored = dict(zip(keys, self.exported["answer"]))
        return {
            "sent": len(sent),
            "exported": len(self.exported),
            "lost": len(set(sent) - set(stored)),
            "duplicated": len(keys) - len(set(keys)),
            "duplicated_tasks": int(self.exported.duplicated(["worker_id", "task_id"]).sum()),
            "altered": sum(stored.get(k) != a for k, a in sent.items() if k in stored),
            "unexpected": len(set(stored) - set(sent)),
            "errors": sum(w.error is not None for w in self.workers),
        }

    def summary(self) -> dict[str, float | int]:
        lat = self.latencies * 1000
        return {
            "workers": len(self.workers),
            **self.check(),
            "resends": sum(w.resends for w in self.workers),
            "retries": sum(w.retries for w in self.workers),
            "completed": sum(w.completion_code is not None for w in self.workers),
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat.size else float("nan"),
            "p95_ms": round(float(np.percentile(lat, 95)), 1) if lat.size else float("nan"),
            "max_ms": round(float(lat.max()), 1) if lat.size else float("nan"),
            "seconds": round(self.seconds, 2),
            "answers_per_s": round(len(lat) / self.seconds, 1) if self.seconds else 0.0,
        }


def run_load(
    base_url: str,
    token: str,
    n_workers: int = 50,
    deadline_s: float = 300,
    seed: int = 0,
    resend_prob: float = 0.1,
    think_s: float = 0.0,
) -> LoadResult:
    """``n_workers`` concurrent workers released together; the export read over HTTP."""
    deadline = time.monotonic() + deadline_s
    barrier = threading.Barrier(n_workers)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        futures = [
            pool.submit(
                simulate_worker,
                base_url,
                f"load-{seed}-{i:03d}",
                seed * 1000 + i,
                deadline,
                resend_prob,
                barrier,
                think_s,
            )
            for i in range(n_workers)
        ]
        workers = [f.result() for f in futures]
    seconds = time.perf_counter() - t0
    r = httpx.get(
        f"{base_url}/admin/export.csv", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    _expect(r, 200)
    exported = pd.read_csv(io.StringIO(r.text), keep_default_na=False, na_values=[""])
    return LoadResult(workers, tables.ANSWERS.validate(exported, "admin export"), seconds)


def claim_and_leave(base_url: str, n: int, prefix: str = "bot") -> list[int]:
    """``n`` clients that each start a bundle and never answer; their HTTP statuses."""
    statuses = []
    for i in range(n):
        with httpx.Client(base_url=base_url, follow_redirects=False, timeout=30) as c:
            statuses.append(c.post("/start", data={"worker_id": f"{prefix}-{i:03d}"}).status_code)
    return statuses


def run_attack(
    urls: Sequence[str],
    token: str,
    n_workers: int,
    n_leavers: int,
    lease_s: float,
    deadline_s: float = 300,
    think_s: float = 0.2,
    seed: int = 0,
    during: Callable[[], None] | None = None,
) -> LoadResult:
    """Workers spread over several servers of one store, while ``during`` (the killer)
    runs beside them; the export is read after both are done.

    ``n_workers`` start together, each on one server and failing over to the others;
    the first ``n_leavers`` of them leave after two answers with the third task open
    and come back after three leases. As many latecomers arrive after one and a half
    leases and retry until a bundle comes free: they take the leavers' bundles, and a
    leaver's late answer then meets the "NOT saved" page. Every worker may be refused
    (a lease can also run out while both servers are down); a refused answer is never
    counted as acknowledged, so the check still finds any answer stored without one.
    """
    deadline = time.monotonic() + deadline_s
    barrier = threading.Barrier(n_workers)
    jobs: list[tuple[float, str, Behaviour, threading.Barrier | None, str]] = []
    for i in range(n_workers):
        home = urls[i % len(urls)]
        others = tuple(u for u in urls if u != home)
        leaves = i < n_leavers
        behaviour = Behaviour(
            urls=others,
            leave_after=2 if leaves else None,
            away_s=3 * lease_s if leaves else 0.0,
            may_be_refused=True,
        )
        jobs.append((0.0, home, behaviour, barrier, f"attack-{seed}-{i:03d}"))
    for j in range(n_leavers):
        home = urls[j % len(urls)]
        others = tuple(u for u in urls if u != home)
        behaviour = Behaviour(urls=others, wait_for_bundle=True, may_be_refused=True)
        jobs.append((1.5 * lease_s, home, behaviour, None, f"late-{seed}-{j:03d}"))

    def worker(k: int) -> WorkerLog:
        delay, home, behaviour, start, worker_id = jobs[k]
        time.sleep(delay)
        return simulate_worker(
            home, worker_id, seed * 1000 + k, deadline, 0.1, start, think_s, behaviour
        )

    t0 = time.perf_counter()
    side = threading.Thread(target=during, name="attack") if during else None
    if side is not None:
        side.start()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        workers = list(pool.map(worker, range(len(jobs))))
    if side is not None:
        side.join()
    seconds = time.perf_counter() - t0
    return LoadResult(workers, read_export(urls, token), seconds)


def read_export(urls: Sequence[str], token: str) -> pd.DataFrame:
    """The admin export over HTTP from the first server that answers."""
    last: Exception | None = None
    for url in urls:
        try:
            r = httpx.get(
                f"{url}/admin/export.csv", headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
        except httpx.TransportError as err:
            last = err
            continue
        _expect(r, 200)
        exported = pd.read_csv(io.StringIO(r.text), keep_default_na=False, na_values=[""])
        return tables.ANSWERS.validate(exported, "admin export")
    raise RuntimeError(f"no server answered the export: {last}")
