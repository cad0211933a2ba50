"""One tracking server on a real database, with authentication (docs/scale-out.md, *One
tracking server*).

PostgreSQL is started from ``initdb`` in a temp dir (as the ``postgres`` user when the tests
run as root: PostgreSQL refuses root), with password authentication, on a free loopback
port. ``mlflow server`` runs on it exactly as the docs give it: the ``postgresql+psycopg``
URL, artifacts served through the server, and MLflow's ``basic-auth`` app whose users and
permissions live in a second database of the same PostgreSQL. A joblib sweep then logs to
it with credentials from the environment, and a client without them is refused.

Needs the Debian package ``postgresql`` and the ``postgres`` extra (``psycopg``, MLflow's
auth app); ``.ci/run`` installs both, elsewhere the test skips naming the command.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tests.conftest import DATA_ROOT
from tests.scaleout_support import BIN, TINY_JOB, launch, require, runs_of, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("keep_mlflow_store")]

INSTALL = "apt-get install -y postgresql (as root; .ci/run does this)"


def _pg_bin(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, or Debian's versioned dir (not on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: p.parts)
    return str(versions[-1]) if versions else None


def _missing() -> str | None:
    try:
        import flask_wtf  # noqa: F401  (MLflow's basic-auth app)
        import psycopg  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed: pip install -e '.[postgres]' (part of .[dev])"
    if _pg_bin("initdb") is None or _pg_bin("pg_ctl") is None:
        return f"PostgreSQL's initdb not found: {INSTALL}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return f"as root, PostgreSQL runs as the user postgres, which is missing: {INSTALL}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_db_user(args: list[str]) -> list[str]:
    """``args`` as the user PostgreSQL runs as (root may not run it)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass
class Server:
    url: str
    artifacts: Path
    db_url: str
    admin: tuple[str, str]


@pytest.fixture(scope="module")
def postgres() -> Iterator[tuple[str, int, str]]:
    """A PostgreSQL of its own: yields (user, port, password); always stopped."""
    require(_missing())
    root = Path(tempfile.mkdtemp(prefix="saleval-pg-"))  # short, and not under root's 0700 tmp
    user, password, port = "saleval", secrets.token_urlsafe(16), _free_port()
    (root / "pw").write_text(password)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(root / "pw", "postgres")
    data = root / "data"
    subprocess.run(
        _as_db_user([str(_pg_bin("initdb")), "-D", str(data), "-U", user,
                     f"--pwfile={root / 'pw'}", "--auth=scram-sha-256", "-E", "UTF8",
                     "--no-sync"]),
        check=True, capture_output=True,
    )  # fmt: skip
    # a throwaway database: no fsync, and stopped without a last checkpoint
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
    pg_ctl = str(_pg_bin("pg_ctl"))
    started = subprocess.run(
        _as_db_user([pg_ctl, "-D", str(data), "-l", str(root / "log"), "-o", options, "-w",
                     "start"]),
        capture_output=True, text=True,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr + (root / "log").read_text()[-2000:]
        yield user, port, password
    finally:
        subprocess.run(
            _as_db_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def _request(url: str, method: str = "GET", body: dict | None = None,
             auth: tuple[str, str] | None = None) -> int:  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:  # not listening yet
        return 0


@pytest.fixture(scope="module")
def server(
    postgres: tuple[str, int, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """``mlflow server`` on PostgreSQL with the basic-auth app, as docs/scale-out.md runs it."""
    import psycopg

    user, port, password = postgres
    with psycopg.connect(
        host="127.0.0.1", port=port, user=user, password=password, dbname="postgres",
        autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute("CREATE DATABASE mlflow")
        conn.execute("CREATE DATABASE mlflow_auth")
    db = f"postgresql+psycopg://{user}:{password}@127.0.0.1:{port}"
    where = tmp_path_factory.mktemp("server")
    admin = ("admin", secrets.token_urlsafe(16))
    (where / "basic_auth.ini").write_text(
        "[mlflow]\n"
        "default_permission = EDIT\n"
        f"database_uri = {db}/mlflow_auth\n"
        f"admin_username = {admin[0]}\n"
        f"admin_password = {admin[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    http = _free_port()
    url = f"http://127.0.0.1:{http}"
    env = subprocess_env(
        MLFLOW_AUTH_CONFIG_PATH=str(where / "basic_auth.ini"),
        MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16),
    )
    log = where / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--app-name", "basic-auth",
             "--backend-store-uri", f"{db}/mlflow",
             "--artifacts-destination", str(where / "artifacts"), "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(http), "--workers", "1"],
            cwd=where, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        t0 = time.monotonic()
        while _request(f"{url}/health") != 200:
            if proc.poll() is not None or time.monotonic() - t0 > 120:
                pytest.fail(f"mlflow server not up:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        print(f"mlflow server on PostgreSQL with basic-auth up in {time.monotonic() - t0:.1f} s")
        yield Server(url, where / "artifacts", f"{db}/mlflow", admin)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_a_client_without_credentials_can_neither_read_nor_write(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = f"{server.url}/api/2.0/mlflow"
    create = {"name": "intruder"}
    assert _request(f"{api}/experiments/search?max_results=1") == 401
    assert _request(f"{api}/experiments/create", "POST", create) == 401
    assert _request(f"{api}/runs/search", "POST", {"experiment_ids": ["0"]}) == 401
    wrong = ("admin", "not-the-password")
    assert _request(f"{api}/experiments/search?max_results=1", auth=wrong) == 401
    assert _request(f"{api}/experiments/search?max_results=1", auth=server.admin) == 200
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with pytest.raises(MlflowException, match="401|credentials|Unauthorized|UNAUTHENTICATED"):
        MlflowClient(tracking_uri=server.url).search_experiments()


def test_a_joblib_sweep_logs_to_the_server_with_credentials_from_the_environment(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    # the admin makes an account for the lab's jobs (docs/scale-out.md)
    member = ("lab-jobs", secrets.token_urlsafe(16))
    made = _request(
        f"{server.url}/api/2.0/mlflow/users/create", "POST",
        {"username": member[0], "password": member[1]}, auth=server.admin,
    )  # fmt: skip
    assert made == 200
    out = tmp_path / "outputs"
    env = subprocess_env(
        server.url, MLFLOW_TRACKING_USERNAME=member[0], MLFLOW_TRACKING_PASSWORD=member[1]
    )
    done = launch(
        [BIN / "saleval-train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         *TINY_JOB, f"paths.output_root={out}", "seed=1,2"],
        env, tmp_path, timeout=300,
    )  # fmt: skip
    (sweep,) = (out / "train" / "multirun").iterdir()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", member[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", member[1])
    client = MlflowClient(tracking_uri=server.url)
    runs = runs_of(client, f"tags.sweep = '{sweep}'")
    assert sorted(r.data.tags["sweep.job"] for r in runs) == ["0", "1"]
    for run in runs:
        job = sweep / run.data.tags["sweep.job"]
        info = json.loads((job / "run.json").read_text())
        assert run.info.status == "FINISHED" and run.info.run_id == info["run_id"]
        assert info["tracking_uri"] == server.url
        assert "val_accuracy" in run.data.metrics
        # artifacts went through the server into its destination
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        (stored,) = server.artifacts.rglob(f"{run.info.run_id}/artifacts/metrics.json")
        assert stored.read_bytes() == (job / "metrics.json").read_bytes()
    assert not (out / "mlflow.db").exists()
    # the runs are rows of PostgreSQL
    with psycopg.connect(server.db_url.replace("postgresql+psycopg", "postgresql")) as conn:
        ids = {
            row[0] for row in conn.execute("SELECT run_uuid FROM runs WHERE status = 'FINISHED'")
        }
    assert {r.info.run_id for r in runs} <= ids
    # and still nothing for a client without credentials
    run_id = runs[0].info.run_id
    assert _request(f"{server.url}/api/2.0/mlflow/runs/get?run_id={run_id}") == 401
    assert _request(f"{server.url}/api/2.0/mlflow/runs/get?run_id={run_id}", auth=member) == 200
    # the password given in the environment is in no artefact: run dirs, Hydra's files,
    # the server's copies, the runs' params and tags, the printed lines (issue #45)
    secret = member[1]
    assert secret not in done.output
    for root in (out, server.artifacts):
        leaked = [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
        assert leaked == []
    for run in runs:
        assert all(secret not in v for v in {**run.data.params, **run.data.tags}.values())


def _member(server: Server, name: str) -> tuple[str, str]:
    """An account of the server, made by its admin."""
    account = (name, secrets.token_urlsafe(16))
    made = _request(
        f"{server.url}/api/2.0/mlflow/users/create", "POST",
        {"username": account[0], "password": account[1]}, auth=server.admin,
    )  # fmt: skip
    assert made == 200
    return account


def test_wrong_credentials_and_no_permission_are_one_line_before_any_work(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """401 and 403 end a stage in one line naming the server, the user, the cause and the
    fix (issue #45), not in MLflow's traceback; nothing is computed."""
    from saleval.pipeline import tracking_health
    from saleval.pipeline.stage import Stage
    from saleval.stages.run import compose_stage

    published = DATA_ROOT / "published" / "lu2024" / "AGNEWS.csv"
    wrong = ("lab-jobs-401", "not-the-password")
    env = subprocess_env(
        server.url, MLFLOW_TRACKING_USERNAME=wrong[0], MLFLOW_TRACKING_PASSWORD=wrong[1]
    )
    done = launch(
        [BIN / "saleval-score", "crowd=lu2024", f"crowd.path={published}", "dataset=ag_news",
         f"paths.output_root={tmp_path / 'out'}"],
        env, tmp_path, timeout=120, expect=2,
    )  # fmt: skip
    lines = [ln for ln in done.output.splitlines() if ln.startswith("saleval-score:")]
    assert lines == [
        f"saleval-score: the tracking server {server.url} refused user 'lab-jobs-401' "
        "(401 Unauthorized): set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
        "~/.mlflow/credentials) to an account of that server"
    ], done.tail()
    assert "Traceback" not in done.output and wrong[1] not in done.output
    assert not list((tmp_path / "out").rglob("run.json"))

    # a member with no permission on the lab's study: refused as the run starts, naming both
    reader = _member(server, "reader")
    admin = MlflowClient(tracking_uri=server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", server.admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.admin[1])
    locked = admin.create_experiment("locked-study")
    from mlflow.server import get_app_client

    auth = get_app_client("basic-auth", tracking_uri=server.url)
    # (the server's default permission, EDIT, is a floor under any lesser positive grant)
    auth.grant_user_permission(reader[0], "experiment", locked, "DENY")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", reader[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", reader[1])
    tracking_health.forget_checks()
    cfg = compose_stage("score", ["crowd=lu2024", "dataset=ag_news",
                                  "tracking.experiment=locked-study"])  # fmt: skip
    cfg.run_dir = str(tmp_path / "score")
    with pytest.raises(tracking_health.TrackingError) as refused, Stage(cfg, "score"):
        pytest.fail("the stage must not start")
    assert str(refused.value) == (
        f"the tracking server {server.url} does not let user 'reader' start runs in "
        "experiment 'locked-study' (403 Forbidden): ask its admin for EDIT permission on "
        "experiment 'locked-study', or pick one you may write to with tracking.experiment=<name>"
    )


def test_catch_up_moves_a_chain_of_runs_from_a_laptop_store_to_the_server_once(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str
) -> None:
    """Runs made against a local SQLite store (a laptop) are logged to the lab's server
    afterwards: a sweep of two explain runs and the tasks run made from it, with their
    params, metrics, tags, files, and the tasks run's parent links pointing at the
    explain runs' copies on the server. Run twice, it logs once (issue #45)."""
    from saleval.pipeline.catch_up import COPY_OF
    from saleval.stages import tasks as tasks_stage
    from saleval.testing import explain_frames, make_explain_run
    from tests.conftest import compose_config
    from tests.test_sweeps import LABELS, fake_sweep

    laptop = mlflow_uri  # the session's SQLite store, as a laptop's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", laptop)
    preds, attrs = explain_frames(6, LABELS)

    def job(methods: list[str]):
        return lambda d: make_explain_run(d, preds, attrs[attrs["method"].isin(methods)])

    sweep = fake_sweep(tmp_path / "sweep", [job(["random"]), job(["lime"])])
    cfg = compose_config(
        "tasks",
        [f"inputs.explain={sweep}", "study.n_samples=4", "study.population=correct",
         "study.balance_by=none", "study.methods=[random,lime]", "study.bundle_size=4",
         "study.repeats=1", "kgrid.ks=[5]"],
        tmp_path / "tasks",
    )  # fmt: skip
    tasks_stage.run(cfg)
    here = MlflowClient(tracking_uri=laptop)
    first = {d: json.loads((d / "run.json").read_text())["run_id"]
             for d in (sweep / "0", sweep / "1", tmp_path / "tasks")}  # fmt: skip

    member = _member(server, "mover")
    env = subprocess_env(MLFLOW_TRACKING_USERNAME=member[0], MLFLOW_TRACKING_PASSWORD=member[1])
    move = [BIN / "saleval-catch-up", "--tracking-uri", server.url, tmp_path / "tasks"]
    done = launch(move, env, tmp_path, timeout=180)
    logged = [ln for ln in done.output.splitlines() if ln.startswith("logged: ")]
    assert len(logged) == 3, done.tail()  # the tasks run and, first, both its parents

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", member[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", member[1])
    lab = MlflowClient(tracking_uri=server.url)
    copies = {r.data.tags[COPY_OF]: r for r in runs_of(lab, f"tags.`{COPY_OF}` LIKE '%'")}
    assert set(copies) == set(first.values())
    tasks = copies[first[tmp_path / "tasks"]]
    original = here.get_run(first[tmp_path / "tasks"])
    assert tasks.info.status == "FINISHED" and tasks.info.run_name == original.info.run_name
    assert tasks.data.params == original.data.params
    assert tasks.data.metrics == original.data.metrics
    for i in (0, 1):  # the parent links point at the server's copies
        parent = copies[first[sweep / str(i)]]
        assert tasks.data.tags[f"parent.explain.{i}"] == parent.info.run_id
        assert parent.data.tags["run_dir"] == str((sweep / str(i)).resolve())
    stored = {a.path for a in lab.list_artifacts(tasks.info.run_id)}
    assert {"tasks.csv", "bundles.csv", "config.yaml", "run.json"} <= stored
    fetched = lab.download_artifacts(tasks.info.run_id, "tasks.csv", str(tmp_path))
    assert Path(fetched).read_bytes() == (tmp_path / "tasks" / "tasks.csv").read_bytes()
    record = json.loads((tmp_path / "tasks" / "run.json").read_text())
    assert record["copies"] == {server.url: tasks.info.run_id}

    # again, and the sweep itself: nothing is logged twice
    again = launch([*move, sweep], env, tmp_path, timeout=180)
    assert [ln for ln in again.output.splitlines() if ln.startswith("logged: ")] == []
    assert sum(ln.startswith("already logged: ") for ln in again.output.splitlines()) == 3
    assert len(runs_of(lab, f"tags.`{COPY_OF}` LIKE '%'")) == 3
