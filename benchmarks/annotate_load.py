"""Load test of the annotation app on loopback: N concurrent simulated workers over HTTP.

Bounded and self-stopping: every worker stops at a deadline, the server is stopped at
the end whatever happens. Each simulated worker does what a person does through the
pages (start with an id, acknowledge the instructions, GET a task, POST an answer,
repeat), and a few re-send an answer they already sent (a double click or a retry
after a timeout). At the end, the answers exported through the admin view must equal,
one for one, the answers the workers saw acknowledged: zero lost, zero duplicated.

    .venv/bin/python benchmarks/annotate_load.py --workers 50 --bundle-size 20

prints answers, p50/p95/max latency per answer (the POST /answer round trip) and
throughput as JSON. ``--think 1.0`` paces workers like people (about a second per
task); the default 0 is a stress run where latency is mostly queueing (Little's law). By default the server is the real ``saleval-annotate`` console
script in its own process (so client threads do not share its GIL); ``--in-process``
serves from a thread instead.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from saleval import tables

AG_NEWS = ("World", "Sports", "Business", "Sci/Tech")
_WORDS = [
    "the",
    "market",
    "rallied",
    "after",
    "strong",
    "earnings",
    "from",
    "chip",
    "makers",
    "while",
    "the",
    "central",
    "bank",
    "held",
    "rates",
    "steady",
    "and",
    "the",
    "team",
    "won",
    "the",
    "final",
    "in",
    "extra",
    "time",
    "as",
    "rescue",
    "workers",
    "searched",
    "the",
    "coast",
    "after",
    "the",
    "storm",
]
_POSITION_RE = re.compile(r'name="position" value="(\d+)"')
_OPTION_RE = re.compile(r'name="answer" value="([^"]*)"')


# -- a task run dir built by hand (the shape saleval-tasks writes) ----------------------
def make_task_run(
    run_dir: str | Path,
    n_bundles: int = 4,
    bundle_size: int = 5,
    label_names: Sequence[str] = AG_NEWS,
    dataset: str = "ag_news",
    seed: int = 0,
    instructions: str | None = None,
    tricky_text: bool = True,
) -> Path:
    """Write tasks.csv, bundles.csv, instructions.md, config.yaml and run.json.

    ``bundle_size`` samples × ``n_bundles`` (method, k) pairs; bundle b holds sample p
    with pair (b + p) mod n_bundles at position p, so no bundle repeats a sample. With
    ``tricky_text`` sample 0 shows markup (``<b>AT&T</b>``) in every task: pages must escape it.
    """
    rng = np.random.default_rng(seed)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    methods = ("random", "all_attention", "vanilla_gradient", "integrated_gradients", "lime")
    ks = (5, 10, 20, 30, 40)
    pairs = [(m, k) for k in ks for m in methods]
    n_pairs = min(n_bundles, len(pairs))
    rows = []
    for i in range(bundle_size):
        words = list(rng.choice(_WORDS, size=int(rng.integers(12, 30))))
        if tricky_text and i == 0:
            words[1:1] = ["<b>AT&T</b>", '"quoted"']
        label = int(rng.integers(len(label_names)))
        for j in range(n_pairs):
            method, k = pairs[j]
            order = rng.permutation(len(words)).tolist()
            if tricky_text and i == 0:  # the markup is always among the words shown
                order = [1, 2] + [t for t in order if t not in (1, 2)]
            shown = set(order[: min(k, len(words))])
            text = "".join(w + " " if t in shown else "." for t, w in enumerate(words))
            rows.append(
                {
                    "task_id": f"s{i:03d}-{method}-k{k}",
                    "sample_id": f"s{i:03d}",
                    "method": method,
                    "k": k,
                    "label": label,
                    "display_text": text,
                    "n_words_shown": len(shown),
                    "n_words": len(words),
                    "is_gold": False,
                }
            )
    tasks = pd.DataFrame(rows)
    by_pair = {(r["sample_id"], r["method"], r["k"]): r["task_id"] for r in rows}
    bundle_rows = []
    for b in range(n_bundles):
        order = rng.permutation(bundle_size)  # random order within the bundle (SPEC §4)
        for p, i in enumerate(order):
            method, k = pairs[(b + int(i)) % n_pairs]
            bundle_rows.append(
                {
                    "bundle_id": f"b{b:04d}",
                    "position": p,
                    "task_id": by_pair[(f"s{int(i):03d}", method, k)],
                    "is_gold": False,
                }
            )
    tables.TASKS.write(tasks, run_dir)
    tables.BUNDLES.write(pd.DataFrame(bundle_rows), run_dir)
    (run_dir / "instructions.md").write_text(
        instructions
        or (
            f"# Guess the topic\n\nEach task shows a news text from **{dataset}** with most "
            "words hidden: a hidden word is shown as one dot. Choose the label that fits "
            'best, or "I don\'t know" when the words shown do not tell.\n'
        ),
        encoding="utf-8",
    )
    OmegaConf.save(
        OmegaConf.create(
            {
                "task_name": "tasks",
                "dataset": {
                    "name": dataset,
                    "label_names": list(label_names),
                    "label_descriptions": {n: f"Texts about {n}." for n in label_names},
                },
            }
        ),
        run_dir / "config.yaml",
    )
    (run_dir / "run.json").write_text(
        json.dumps({"stage": "tasks", "run_id": uuid.uuid4().hex, "fingerprint": "hand-made"})
    )
    return run_dir


# -- servers -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cli_server(
    tasks_dir: Path,
    db: Path,
    port: int,
    token: str,
    run_dir: Path,
    env: dict[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """The real ``saleval-annotate`` console script in its own process group."""
    exe = Path(sys.executable).with_name("saleval-annotate")
    cmd = [
        str(exe),
        f"inputs.tasks={tasks_dir}",
        f"annotate.db={db}",
        f"annotate.port={port}",
        f"annotate.admin_token={token}",
        "annotate.log_level=warning",
        f"run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    log = open(run_dir.parent / f"server-{port}.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def wait_healthy(
    base_url: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 90
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} did not answer /healthz within {timeout_s}s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the server's process group (it was started in its own session) and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# -- simulated workers -------------------------------------------------------------------
@dataclass
class WorkerLog:
    worker_id: str
    sent: dict[int, str] = field(default_factory=dict)  # position -> acknowledged answer
    latencies: list[float] = field(default_factory=list)
    resends: int = 0
    completion_code: str | None = None
    error: str | None = None


def simulate_worker(
    base_url: str,
    worker_id: str,
    seed: int,
    deadline: float,
    resend_prob: float = 0.1,
    start: threading.Barrier | None = None,
    think_s: float = 0.0,
) -> WorkerLog:
    """One worker through the pages; an answer counts as sent once the server said 303."""
    rng = random.Random(seed)
    out = WorkerLog(worker_id)
    try:
        with httpx.Client(base_url=base_url, follow_redirects=False, timeout=60) as c:
            if start is not None:
                start.wait(timeout=60)
            r = c.post("/start", data={"worker_id": worker_id})
            _expect(r, 303, "/instructions")
            _expect(c.post("/instructions"), 303, "/task")
            while time.monotonic() < deadline:
                r = c.get("/task")
                if r.status_code == 303:
                    _expect(r, 303, "/done")
                    break
                _expect(r, 200)
                match = _POSITION_RE.search(r.text)
                if match is None:
                    raise AssertionError("task page without a position field")
                position = int(match.group(1))
                answer = rng.choice([html.unescape(o) for o in _OPTION_RE.findall(r.text)])
                form = {"position": str(position), "answer": answer}
                if think_s:  # reading the task: uniform in [0.5, 1.5] × think_s
                    time.sleep(think_s * rng.uniform(0.5, 1.5))
                t0 = time.perf_counter()
                r = c.post("/answer", data=form)
                out.latencies.append(time.perf_counter() - t0)
                _expect(r, 303)
                out.sent[position] = answer
                if rng.random() < resend_prob:
                    _expect(c.post("/answer", data=form), 303)
                    out.resends += 1
            r = c.get("/done")
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=50)
    ap.add_argument("--bundle-size", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=300, help="seconds before workers stop")
    ap.add_argument("--in-process", action="store_true", help="serve from a thread")
    ap.add_argument("--synchronous", default="FULL")
    ap.add_argument(
        "--think", type=float, default=0.0, help="mean seconds a worker reads a task (0: stress)"
    )
    args = ap.parse_args(argv)
    token = "load-test-token"
    with tempfile.TemporaryDirectory(prefix="annotate-load-") as tmp:
        root = Path(tmp)
        tasks = make_task_run(root / "tasks", n_bundles=args.workers, bundle_size=args.bundle_size)
        db = root / "annotations.sqlite"
        if args.in_process:
            from saleval.annotate.app import AppSettings, background_server, create_app

            app = create_app(tasks, AppSettings(db, token, synchronous=args.synchronous))
            with background_server(app) as url:
                result = run_load(url, token, args.workers, args.deadline, think_s=args.think)
            app.state.store.close()
        else:
            port = free_port()
            (root / "serve").mkdir()
            env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
            proc = start_cli_server(
                tasks,
                db,
                port,
                token,
                root / "serve",
                env,
                [f"annotate.synchronous={args.synchronous}"],
            )
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, proc)
                result = run_load(url, token, args.workers, args.deadline, think_s=args.think)
            finally:
                stop(proc)
    summary = {
        "server": "thread" if args.in_process else "saleval-annotate process",
        "bundle_size": args.bundle_size,
        "synchronous": args.synchronous,
        "think_s": args.think,
        **result.summary(),
    }
    print(json.dumps(summary, indent=2))
    bad = summary["lost"] or summary["duplicated"] or summary["altered"] or summary["errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
