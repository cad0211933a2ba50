"""Servers of the annotation app on loopback for load drills: the real ``saleval-annotate``
console script in its own process group (so simulated workers do not share its GIL), or
the app in a thread; two processes on one store for the attack round. Everything stops:
a process group is signalled, then killed, whatever happened (docs/annotate.md,
*Checking the guarantees*).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A TCP port on loopback that is free now (the OS picks it)."""
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
        "annotate.max_claims_per_client=0",  # every simulated worker comes from loopback
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
        env={**os.environ, "SALEVAL_ANNOTATE_TOKEN": token, **(env or {})},
        start_new_session=True,
    )


def wait_healthy(
    base_url: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 90,
    path: str = "/healthz",
) -> None:
    """Wait until ``path`` (the app's ``/healthz``; MLflow's ``/health``) answers 200;
    fail early if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering")
        try:
            if httpx.get(f"{base_url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} did not answer {path} within {timeout_s}s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the server's process group (it was started in its own session) and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextmanager
def serve(
    tasks: Path,
    db: Path,
    token: str,
    in_process: bool,
    synchronous: str,
    lease_minutes: float,
) -> Iterator[tuple[str, Any]]:
    """(base URL, the server) for the block's lifetime: with ``in_process`` the app from
    a thread (the server is the app); else ``saleval-annotate`` in its own process, the
    server a dict holding it as ``proc`` and ``restart(n)``, which starts it again on the
    same port (for a kill -9 drill)."""
    if in_process:
        from saleval.annotate.app import background_server, create_app
        from saleval.config.annotate import AnnotateConfig

        settings = AnnotateConfig(
            db=str(db),
            admin_token=token,
            synchronous=synchronous,
            lease_minutes=lease_minutes,
            max_claims_per_client=0,  # every simulated worker comes from loopback
        )
        app = create_app(tasks, settings)
        try:
            with background_server(app) as url:
                yield url, app
        finally:
            app.state.store.close()
        return
    port = free_port()
    overrides = [f"annotate.synchronous={synchronous}", f"annotate.lease_minutes={lease_minutes}"]
    holder: dict[str, Any] = {}

    def start(n: int) -> None:
        (db.parent / f"serve{n}").mkdir()
        run_dir = db.parent / f"serve{n}"
        holder["proc"] = start_cli_server(tasks, db, port, token, run_dir, overrides=overrides)

    start(1)
    holder["restart"] = start
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, holder["proc"])
        yield url, holder
    finally:
        stop(holder["proc"])


def kill_and_restart(url: str, holder: dict[str, Any], after_s: float, log: dict[str, Any]) -> None:
    """``after_s`` seconds from now, kill -9 the server :func:`serve` started and start it
    again on its port; ``log`` gets ``killed_rc`` and ``restarted``."""
    time.sleep(after_s)
    stop(holder["proc"], signal.SIGKILL)
    log["killed_rc"] = holder["proc"].returncode
    holder["restart"](2)
    wait_healthy(url, holder["proc"])
    log["restarted"] = True


class TwoServers:
    """Two ``saleval-annotate`` processes on one store, each on its own port, each
    restartable there after a ``kill -9`` (the attack round)."""

    def __init__(
        self, tasks: Path, db: Path, token: str, synchronous: str, lease_minutes: float
    ) -> None:
        self.tasks, self.db, self.token = tasks, db, token
        self.ports = [free_port()]
        while len(self.ports) < 2:
            port = free_port()
            if port not in self.ports:
                self.ports.append(port)
        self.overrides = [
            f"annotate.synchronous={synchronous}",
            f"annotate.lease_minutes={lease_minutes}",
        ]
        self.procs: list[Any] = [None, None]
        self.starts = 0
        self.killed: list[int] = []  # pids killed with SIGKILL

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self, i: int) -> None:
        self.starts += 1
        run_dir = self.db.parent / f"serve{i}-{self.starts}"
        run_dir.mkdir()
        self.procs[i] = start_cli_server(
            self.tasks, self.db, self.ports[i], self.token, run_dir, overrides=self.overrides
        )

    def kill(self, i: int) -> None:
        self.killed.append(self.procs[i].pid)
        stop(self.procs[i], signal.SIGKILL)

    def wait_healthy(self) -> None:
        for url, proc in zip(self.urls, self.procs):
            wait_healthy(url, proc)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                stop(proc)
