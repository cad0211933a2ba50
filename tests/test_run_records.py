"""Run records you can trust (issue #45; docs/tracking.md, *When the tracking server fails*).

* an input that did not finish (FAILED, KILLED, a failed sweep job) is refused in one line,
  unless ``allow_unfinished_inputs=true``, which every run downstream records;
* a table changed after its run wrote it (rows deleted, scores negated, bytes damaged) is
  refused naming the table and the run, before anything is computed;
* a full disk, a damaged table and a tracking server that stops mid-run each end in one
  line and lose nothing already on disk; the run is caught up afterwards, once;
* no password in a setting reaches any file or line.

The tracking server is a real ``mlflow server`` started here (SQLite behind it); the
PostgreSQL-backed server with authentication is exercised in tests/test_tracking_postgres.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval.cli import disk_full
from saleval.pipeline import tables
from saleval.pipeline.records import run_record
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.provenance import Provenance, resolve
from saleval.pipeline.records.run_inputs import resolve_inputs
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking, tracking_health, tracking_journal, tracking_reads
from saleval.pipeline.tracker.catch_up import catch_up
from saleval.stages import tasks as tasks_stage
from saleval.stages.run import compose_stage
from saleval.testing import explain_frames, make_explain_run
from saleval.testing.load_servers import free_port
from tests.cli_support import script
from tests.conftest import DATA_ROOT, FinishedPipeline
from tests.scaleout_support import BIN, NO_JOB_RUNNER, launch, subprocess_env, wait_healthy
from tests.sweeps_support import LABELS, fake_sweep, tasks_cfg

pytestmark = pytest.mark.usefixtures("keep_mlflow_store")

PUBLISHED = DATA_ROOT / "published" / "lu2024" / "AGNEWS.csv"
SCORE = ["crowd=lu2024", f"crowd.path={PUBLISHED}", "dataset=ag_news", "scoring.bootstrap.n=50",
         "scoring.test_resamples=99"]  # fmt: skip


def _frames(methods: tuple[str, ...] = ("random", "lime")) -> tuple[pd.DataFrame, pd.DataFrame]:
    preds, attrs = explain_frames(6, LABELS, methods=["random", "lime"])
    return preds, attrs[attrs["method"].isin(list(methods))]


def failed_explain_run(run_dir: Path, error: BaseException | None = None) -> Path:
    """An explain run that wrote both tables, then failed (or was stopped: ``error``)."""
    preds, attrs = _frames()
    cfg = compose_stage("explain", ["dataset=ag_news", "method=[random,lime]"])
    cfg.run_dir, cfg.tracking.artifact_root = str(run_dir), str(run_dir.parent / "mlartifacts")
    with pytest.raises(type(error or RuntimeError())), Stage(cfg, "explain") as st:
        st.write(tables.PREDICTIONS, preds)
        st.write(tables.ATTRIBUTIONS, attrs)
        raise error or RuntimeError("boom")
    return run_dir


# -- 1. inputs are finished runs -------------------------------------------------------


def test_an_unfinished_input_is_refused_and_an_override_is_recorded_downstream(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], mlflow_uri: str
) -> None:
    failed = failed_explain_run(tmp_path / "failed")
    info = json.loads((failed / "run.json").read_text())
    assert info["status"] == "FAILED" and "boom" in info["error"]
    with pytest.raises(InputError) as refused:
        tasks_stage.run(tasks_cfg(make_cfg, str(failed), "tasks"))
    line = str(refused.value)
    assert "\n" not in line
    assert f"inputs.explain={failed}" in line and "is FAILED (RuntimeError('boom'))" in line
    assert "rerun it" in line and "allow_unfinished_inputs=true" in line
    assert not (tmp_path / "tasks").exists()  # refused before a run dir exists

    killed = failed_explain_run(tmp_path / "killed", KeyboardInterrupt())
    assert json.loads((killed / "run.json").read_text())["status"] == "KILLED"
    with pytest.raises(InputError, match=r"is KILLED \(KeyboardInterrupt\(\)\), not FINISHED"):
        resolve_inputs("explain", str(killed))

    cfg = tasks_cfg(make_cfg, str(failed), "tasks")
    cfg.allow_unfinished_inputs = True
    out = tasks_stage.run(cfg)
    record = json.loads((tmp_path / "tasks" / "run.json").read_text())
    assert record["status"] == "FINISHED"
    assert record["provenance"]["unfinished"] == [f"{failed} (FAILED)"]
    run = MlflowClient().get_run(out["run_id"])
    assert run.data.tags["unfinished_inputs"] == f"{failed} (FAILED)"
    assert run.data.params["allow_unfinished_inputs"] == "True"
    # sticky: a run downstream of that one names it too, whatever it is given itself
    child = resolve(
        Provenance(), {"tasks": Provenance.from_json(record["provenance"])}, {"tasks": "t"}
    )
    assert child.unfinished == (f"{failed} (FAILED)",)


def test_a_failed_sweep_job_is_refused_like_a_failed_run(tmp_path: Path, mlflow_uri: str) -> None:
    preds, attrs = _frames(("random",))
    sweep = fake_sweep(
        tmp_path / "sweep",
        [lambda j: make_explain_run(j, preds, attrs), lambda j: failed_explain_run(j)],
    )
    with pytest.raises(InputError) as refused:
        resolve_inputs("explain", str(sweep))
    line = str(refused.value)
    assert f"sweep job {sweep / '1'}" in line and "is FAILED" in line
    assert f"hydra.sweep.dir={sweep}" in line and "allow_unfinished_inputs=true" in line
    assert resolve_inputs("explain", str(sweep), allow_unfinished=True) == [
        (sweep / "0").resolve(),
        (sweep / "1").resolve(),
    ]


# -- 2. checksums ----------------------------------------------------------------------


def test_the_record_holds_the_checksum_of_every_table_written(
    tmp_path: Path, mlflow_uri: str
) -> None:
    preds, attrs = _frames()
    run = make_explain_run(tmp_path / "explain", preds, attrs)
    record = json.loads((run / "run.json").read_text())
    assert record["checksums"] == {
        "attributions.parquet": run_record.file_digest(run / "attributions.parquet"),
        "predictions.parquet": run_record.file_digest(run / "predictions.parquet"),
    }
    assert record["checksums"]["predictions.parquet"].startswith("sha256:")
    assert not list(run.glob(".*.tmp"))  # tables are renamed into place


@pytest.mark.parametrize("edit", ["drop a method", "negate scores", "damage bytes"])
def test_a_table_changed_after_its_run_is_refused_naming_table_and_run(
    tmp_path: Path, make_cfg: Callable[..., DictConfig], mlflow_uri: str, edit: str
) -> None:
    preds, attrs = _frames()
    run = make_explain_run(tmp_path / "explain", preds, attrs)
    path = run / "attributions.parquet"
    if edit == "drop a method":
        attrs[attrs["method"] != "lime"].to_parquet(path, index=False)
    elif edit == "negate scores":
        attrs.assign(score=-attrs["score"]).to_parquet(path, index=False)
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    with pytest.raises(InputError) as refused:
        tasks_stage.run(tasks_cfg(make_cfg, str(run), "tasks"))
    line = str(refused.value)
    assert "\n" not in line and f"{path}: attributions.parquet" in line
    assert f"run {run} changed" in line and "rerun that explain run" in line
    assert not (tmp_path / "tasks").exists()
    # a table read from an ancestor (not a direct input) is checked by the reader itself
    with pytest.raises(tables.TableError, match="changed after the run wrote it"):
        tables.ATTRIBUTIONS.read(run)
    tables.PREDICTIONS.read(run)  # the other table is as it was written


def test_a_damaged_table_without_a_checksum_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A run recorded before run.json held checksums: the reader still says it in one line."""
    preds, _ = _frames()
    tables.PREDICTIONS.write(preds, tmp_path)
    path = tmp_path / "predictions.parquet"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # cut short
    with pytest.raises(tables.TableError) as damaged:
        tables.PREDICTIONS.read(tmp_path)
    assert str(damaged.value).startswith(f"{path}: table 'predictions' cannot be read (")
    assert "\n" not in str(damaged.value) and "rerun the run that wrote it" in str(damaged.value)


# -- disk full: one line, nothing written before is lost -------------------------------


def test_a_full_disk_ends_the_stage_keeping_what_it_wrote(
    tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    preds, attrs = _frames()
    real = pd.DataFrame.to_parquet

    def half_then_full(df: pd.DataFrame, path: str, **kw: object) -> None:
        if "attributions" in str(path):
            Path(path).write_bytes(b"PAR1 half a table")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(df, path, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_then_full)
    cfg = compose_stage("explain", ["dataset=ag_news", "method=[random,lime]"])
    cfg.run_dir, cfg.tracking.artifact_root = str(tmp_path / "explain"), str(tmp_path / "art")
    with pytest.raises(OSError) as full, Stage(cfg, "explain") as st:
        st.write(tables.PREDICTIONS, preds)
        st.write(tables.ATTRIBUTIONS, attrs)
    run = tmp_path / "explain"
    assert full.value.errno == errno.ENOSPC
    assert full.value.filename == str(run / "attributions.parquet")
    line = disk_full(full.value)
    assert line is not None and "\n" not in line
    assert line.startswith(f"no space left on device writing {run / 'attributions.parquet'}")
    # what was written before is whole and recorded; no half table under its name
    assert not (run / "attributions.parquet").exists() and not list(run.glob(".*.tmp"))
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "FAILED" and "No space left" in record["error"]
    assert list(record["checksums"]) == ["predictions.parquet"]
    pd.testing.assert_frame_equal(tables.PREDICTIONS.read(run), tables.PREDICTIONS.validate(preds))
    assert MlflowClient().get_run(st.tracking.run_id).info.status == "FAILED"


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="needs root to mount a small tmpfs")
def test_a_real_full_disk_is_one_line(tmp_path: Path, mlflow_uri: str) -> None:
    """``saleval-score`` writing into a 96 KiB filesystem: ENOSPC from the kernel, one line."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(small)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        done = launch(
            [BIN / "saleval-score", *SCORE, f"paths.output_root={small}"],
            subprocess_env(mlflow_uri), tmp_path, timeout=180, expect=2,
        )  # fmt: skip
        errors = [ln for ln in done.output.splitlines() if ln.startswith("saleval-score:")]
        assert len(errors) == 1, done.tail()
        assert "no space left on device writing" in errors[0] and "Traceback" not in done.output
        for path in small.rglob("*"):  # every file left there is whole
            if path.suffix == ".csv":
                pd.read_csv(path)
            elif path.name == "run.json":
                assert json.loads(path.read_text())["status"] in ("RUNNING", "FAILED")
    finally:
        subprocess.run(["umount", str(small)], check=False)


# -- no credential in any artefact -----------------------------------------------------

SECRET = "s3cret-Pa55word"


@pytest.mark.parametrize(
    ("uri", "shown", "what"),
    [
        (f"http://lab-jobs:{SECRET}@h:9", "http://lab-jobs:***@h:9", "a password"),
        (f"https://{SECRET}@h:9/", "https://***@h:9/", "a user-info"),
        (f"http://h:9/?token={SECRET}&x=1", "http://h:9/?token=***&x=1", "query parameter 'token'"),
        (f"http://h:9/?x=1&API_KEY={SECRET}", "http://h:9/?x=1&API_KEY=***", "'API_KEY'"),
        (
            f"http://h:9/mlflow;key={SECRET}/x",
            "http://h:9/mlflow;key=***/x",
            "path parameter 'key'",
        ),
        (f"http://h:9/#access_token={SECRET}", "http://h:9/#access_token=***", "fragment"),
        (f"s3://b/x?X-Amz-Signature={SECRET}", "s3://b/x?X-Amz-Signature=***", "'X-Amz-Signature'"),
        (f"postgresql://mlflow:{SECRET}@db/m", "postgresql://mlflow:***@db/m", "a password"),
    ],
)
def test_every_secret_in_a_url_is_masked_and_refused(uri: str, shown: str, what: str) -> None:
    line = tracking_health.secret_problem("tracking.uri", uri)
    assert line is not None and SECRET not in line
    assert line.startswith(f"tracking.uri={shown} holds ") and what in line.split(", which")[0]
    assert tracking_health.redact(f"uri: '{uri}' again {uri}") == f"uri: '{shown}' again {shown}"
    fixed = line.split(" pass tracking.uri=")[1].split(" and ")[0]  # the value to pass instead
    assert tracking_health.secret_problem("tracking.uri", fixed) is None, fixed


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///outputs/mlflow.db",
        "postgresql://mlflow@db:5432/m?sslmode=require&passfile=/home/u/.pgpass",
        "http://mlflow.lab:5000/?view=runs&experiment=3",
        "file:///tmp/mlruns",
    ],
)
def test_a_url_without_a_secret_is_left_alone(uri: str) -> None:
    assert tracking_health.secret_problem("tracking.uri", uri) is None
    assert tracking_health.redact(uri) == uri


def test_a_secret_in_a_setting_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    uri = f"http://lab-jobs:{SECRET}@127.0.0.1:9/"
    token = f"http://127.0.0.1:9/?token={SECRET}"
    given = [f"paths.output_root={out}", *SCORE]
    cases = {
        "override": script("score", *given, f"tracking.uri={uri}"),
        "sweep": script("score", "-m", *given, f"tracking.uri={uri}", "seed=1,2"),
        "environment": script("score", *given, env={"MLFLOW_TRACKING_URI": uri}),
        # the token forms, as an override, under -m and in the environment
        "token override": script("score", *given, f"tracking.uri={token}"),
        "token sweep": script("score", "-m", *given, f"tracking.uri={token}", "seed=1,2"),
        "token environment": script("score", *given, env={"MLFLOW_TRACKING_URI": token}),
    }
    conf = tmp_path / "conf" / "tracking"
    conf.mkdir(parents=True)
    (conf / "lab.yaml").write_text(f"uri: {uri}\n")  # a lab's own YAML: -m goes past compose
    cases["yaml"] = script(
        "score", "-m", f"--config-dir={tmp_path / 'conf'}", *given, "tracking=lab", "seed=1"
    )
    for case, done in cases.items():
        assert done.returncode != 0, case
        assert SECRET not in done.stdout + done.stderr, case
        lines = [ln for ln in done.stderr.splitlines() if " holds " in ln]
        assert len(lines) == 1, (case, done.stderr[-2000:])
        if case.startswith("token"):
            assert "127.0.0.1:9/?token=***" in lines[0] and "query parameter 'token'" in lines[0]
        else:
            assert "lab-jobs:***@127.0.0.1:9" in lines[0] and "holds a password" in lines[0]
        assert "MLFLOW_TRACKING_PASSWORD" in lines[0]
    leaked = [
        p for p in tmp_path.rglob("*") if p.is_file() and SECRET in p.read_text(errors="ignore")
    ]
    assert leaked == [conf / "lab.yaml"]  # only the user's own file holds it
    # the API's way in: a stage run from Python refuses it too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(tracking_health.TrackingError, match=r"lab-jobs:\*\*\*@"):
        tracking.tracking_uri(None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", token)
    with pytest.raises(tracking_health.TrackingError, match=r"\?token=\*\*\*"):
        tracking.tracking_uri(None)


# -- tracking that fails well and catches up -------------------------------------------


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    def die(self) -> None:
        """As an outage: the server and its workers are gone at once, no goodbye."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextmanager
def mlflow_server(where: Path, port: int) -> Iterator[Server]:
    """``mlflow server`` on a SQLite store in ``where`` (the same store on every start)."""
    where.mkdir(exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")} | NO_JOB_RUNNER
    with (where / "server.log").open("a") as fh:
        proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{where / 'db.sqlite'}", "--artifacts-destination",
             str(where / "artifacts"), "--serve-artifacts", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            cwd=where, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_healthy(url, proc, where / "server.log")
        yield Server(url, proc)
    finally:
        Server(url, proc).die()


def _refused_with_the_store_down(
    tmp_path: Path, wait_s: int, *args: str
) -> tuple[str, float, subprocess.CompletedProcess[str]]:
    """``saleval-score`` (with ``args``) against a server that does not listen: its one line,
    its wall time and the finished process."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    done = script(
        "score", *args, *SCORE, f"tracking.wait_s={wait_s}",
        f"paths.output_root={tmp_path / 'out'}", env={"MLFLOW_TRACKING_URI": url},
    )  # fmt: skip
    took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(
        f"saleval-score: the tracking store {url} did not answer within {wait_s} s "
        "(connection refused)"
    )
    return lines[0], took, done


def test_a_server_that_does_not_answer_at_the_start_is_one_line_within_the_wait(
    tmp_path: Path,
) -> None:
    line, took, _ = _refused_with_the_store_down(tmp_path, 2)
    assert "tracking.wait_s=<seconds>" in line and "saleval-catch-up" in line
    assert took < 60  # not MLflow's minutes of retries (measured under load: about 10 s)
    assert not list((tmp_path / "out").rglob("*")), "a refused run leaves no stub dir"


def test_a_sweep_whose_store_is_down_is_refused_before_submitting(tmp_path: Path) -> None:
    """The Ray launcher (on this machine) asks the store before it starts Ray or submits a
    job: one line within tracking.wait_s + 10 s, and no sweep dir left (docs/tracking.md)."""
    pytest.importorskip("ray")
    line, took, done = _refused_with_the_store_down(
        tmp_path, 3, "-m", "hydra/launcher=ray", "seed=1,2"
    )
    assert line.endswith("; nothing was submitted")
    assert "Ray" not in done.stdout, done.stdout[-2000:]  # Ray was never started
    assert took < 3 + 10 + 15, took  # the wait, plus the command's own start (imports)
    assert not list((tmp_path / "out").rglob("*")), "no sweep dir is left behind"


def test_mlflows_retries_fit_in_the_wait() -> None:
    """Each call: (retries + 1) tries of the timeout, plus pauses of 1, 2, 4... s."""
    for wait in (1, 5, 7, 15, 60, 600):
        bounds = tracking_health.request_bounds(wait)
        n = int(bounds["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
        timeout = int(bounds["MLFLOW_HTTP_REQUEST_TIMEOUT"])
        assert bounds["MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"] == "0"
        pauses = sum(int(bounds["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]) * 2**i for i in range(n))
        assert (n + 1) * timeout + pauses <= max(wait, 1), (wait, bounds)
        assert timeout >= min(wait, (wait - 3) // 3), (wait, bounds)  # not needlessly short


def test_a_damaged_run_json_on_an_input_is_one_line(tmp_path: Path) -> None:
    explain = make_explain_run(tmp_path / "explain", *_frames())
    record = explain / "run.json"
    record.write_text(record.read_text()[:200])  # cut short, as by a full disk or a copy
    done = script("tasks", f"inputs.explain={explain}", f"paths.output_root={tmp_path / 'o'}")
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith(f"saleval-tasks: {record} is damaged (cut short: "), lines[0]
    assert "rerun that stage" in lines[0]
    record.write_text("[1, 2]")  # whole JSON, but not a record
    with pytest.raises(run_record.DamagedRecordError, match="a JSON list, not an object"):
        run_record.RunRecord.read(explain)


def test_latest_pointing_at_a_deleted_run_says_so(tmp_path: Path) -> None:
    from saleval.pipeline.records.input_paths import input_path_problem, latest_link

    link = latest_link(tmp_path, "explain")
    link.parent.mkdir(parents=True)
    line = input_path_problem("explain", "latest", tmp_path)
    assert line is not None and "no saleval-explain run has finished there yet" in line
    gone = tmp_path / "explain" / "2026-12-07" / "10-00-00"
    link.symlink_to(gone, target_is_directory=True)
    line = input_path_problem("explain", "latest", tmp_path)
    assert line == (
        f"inputs.explain=latest: {link} points at {gone}, which no longer exists (deleted or "
        "moved): pass a run dir, or rerun saleval-explain"
    )


def test_an_outage_mid_run_keeps_the_work_and_a_catch_up_logs_the_rest_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, store = free_port(), tmp_path / "server"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the test's outage is final
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    preds, attrs = _frames()
    rows = pd.DataFrame({"method": ["lime", "random"], "seconds": [2.0, 0.5]})
    run = tmp_path / "explain"
    with mlflow_server(store, port) as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        tracking_health.forget_checks()
        cfg = compose_stage("explain", ["dataset=ag_news", "method=[random,lime]"])
        cfg.run_dir = str(run)
        st = Stage(cfg, "explain")
        with st:
            st.write(tables.PREDICTIONS, preds)
            server.die()
            cfg.tracking.wait_s = 1  # at the end, ask the dead server once more, briefly
            st.write(tables.ATTRIBUTIONS, attrs)
            st.log_metrics({"n_samples": 6, "accuracy": 0.5})
            st.tracking.log_method_rows(rows)
    # the run dir is complete, and its record says what MLflow lacks
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "FINISHED"
    assert tables.ATTRIBUTIONS.read(run)["method"].nunique() == 2
    missed = record["tracking"]
    # the server went away: refused, or reset when a kept-alive connection was cut
    assert missed["logged"] is False and missed["lost"] in (
        "connection refused",
        "connection reset",
    )
    assert "file attributions.parquet" in missed["not_logged"]
    assert "metrics n_samples, accuracy" in missed["not_logged"]
    assert missed["not_logged"][-1] == "end (FINISHED)"
    # a stage started meanwhile is refused in one line, before it computes anything
    with pytest.raises(tracking_health.TrackingError, match="did not answer within 1 s"):
        tracking_health.forget_checks()
        tracking_health.check_store(f"http://127.0.0.1:{port}", 1)
    tracking_health.bound_requests(None)  # MLflow's calls below: the default wait again

    with mlflow_server(store, port) as server:  # back, on the same store
        tracking_health.forget_checks()
        client = MlflowClient(tracking_uri=server.url)
        assert client.get_run(st.tracking.run_id).info.status == "RUNNING"
        first = catch_up([run])
        assert [o.ok for o in first] == [True] and "missed op(s) sent" in first[0].line
        got = client.get_run(st.tracking.run_id)
        assert got.info.status == "FINISHED"
        assert got.data.metrics["accuracy"] == 0.5 and "stage_seconds" in got.data.metrics
        arts = {a.path for a in client.list_artifacts(st.tracking.run_id)}
        assert {"predictions.parquet", "attributions.parquet", "run.json", "config.yaml"} <= arts
        children = tracking_reads.method_rows(st.tracking.run_id, client)
        assert sorted(children["method"]) == ["lime", "random"]
        assert json.loads((run / "run.json").read_text())["tracking"]["logged"] is True
        # idempotent: a second catch-up logs nothing
        second = catch_up([run])
        assert second[0].ok and second[0].line.startswith("already logged")
        assert len(tracking_reads.method_rows(st.tracking.run_id, client)) == 2
        assert len(client.get_metric_history(st.tracking.run_id, "accuracy")) == 1


def test_a_server_back_before_the_run_ends_gets_what_it_missed_from_the_stage_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that hangs mid-run (stopped, not gone: requests time out) and answers again
    before the work is done: the stage sends what it missed when it ends, and its run ends
    FINISHED, complete, with no catch-up needed."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    preds, attrs = _frames()
    run = tmp_path / "explain"
    with mlflow_server(tmp_path / "server", free_port()) as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        tracking_health.forget_checks()
        cfg = compose_stage("explain", ["dataset=ag_news", "method=[random,lime]"])
        # a call to the hung server gives up within wait_s (3 tries of 2 s and the pauses
        # between: tracking_health.request_bounds), and one back answers well inside it
        cfg.run_dir, cfg.tracking.wait_s = str(run), 10
        with Stage(cfg, "explain") as st:
            os.killpg(server.proc.pid, signal.SIGSTOP)  # hung: connections wait
            try:
                st.write(tables.PREDICTIONS, preds)
                st.log_metrics({"n_samples": 6})
                assert st.tracking.journal is not None and st.tracking.journal.lost == "timed out"
            finally:
                os.killpg(server.proc.pid, signal.SIGCONT)
            st.write(tables.ATTRIBUTIONS, attrs)  # kept in the journal until the end
        record = json.loads((run / "run.json").read_text())["tracking"]
        assert record["logged"] is True and "not_logged" not in record
        got = MlflowClient(tracking_uri=server.url).get_run(st.tracking.run_id)
        assert got.info.status == "FINISHED" and got.data.metrics["n_samples"] == 6
        arts = {
            a.path for a in MlflowClient(tracking_uri=server.url).list_artifacts(st.tracking.run_id)
        }
        assert {"predictions.parquet", "attributions.parquet", "run.json"} <= arts
    assert "not all logged" not in capsys.readouterr().out


def test_the_journal_holds_what_was_sent(tmp_path: Path, mlflow_uri: str) -> None:
    preds, attrs = _frames()
    run = make_explain_run(tmp_path / "explain", preds, attrs)
    ops = tracking_journal.read_ops(run)
    kinds = [op["op"] for op in ops]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert ops[0]["tags"]["stage"] == "explain" and ops[0]["run_id"]
    assert {"op": "file", "path": "attributions.parquet", "artifact_path": None} in ops
    record = json.loads((run / "run.json").read_text())["tracking"]
    assert record == {
        "journal": "tracking_log.jsonl",
        "ops": len(ops),
        "sent": len(ops),
        "logged": True,
    }


def test_a_whole_pipeline_is_copied_to_another_store_once(
    tmp_path: Path, smoke_pipeline: FinishedPipeline, mlflow_uri: str
) -> None:
    """Every kind of op a run logs, replayed into a new store: the pipeline's run, each
    stage's run nested under it, per-method child runs, saved views, datasets, parent
    links mapped to the new store's runs. Run twice, it logs once."""
    root = smoke_pipeline.dirs["compare"].parent
    there = f"sqlite:///{tmp_path / 'lab.db'}"
    first = catch_up([root], there)
    assert all(o.ok for o in first), [o.line for o in first]
    assert len(first) == 1 + len(smoke_pipeline.dirs)
    here, lab = MlflowClient(tracking_uri=mlflow_uri), MlflowClient(tracking_uri=there)
    copy = {o.run_dir: lab.get_run(str(o.run_id)) for o in first}
    pipeline = copy[root.resolve()]
    assert pipeline.data.tags["stage"] == "run" and pipeline.info.status == "FINISHED"
    for stage, run_dir in smoke_pipeline.dirs.items():
        new = copy[run_dir.resolve()]
        old = here.get_run(json.loads((run_dir / "run.json").read_text())["run_id"])
        assert new.info.run_name == old.info.run_name, stage
        assert new.data.tags["mlflow.parentRunId"] == pipeline.info.run_id, stage
        assert new.data.params == old.data.params, stage
        assert new.data.metrics == old.data.metrics, stage
        for key, parent in old.data.tags.items():
            if key.startswith("parent."):  # the link points at the parent's copy
                where = Path(old.data.tags["parent_dir." + key.removeprefix("parent.")])
                assert new.data.tags[key] == copy[where.resolve()].info.run_id != parent
        rows_old = tracking_reads.method_rows(old.info.run_id, here).drop(columns="run_id")
        rows_new = tracking_reads.method_rows(new.info.run_id, lab).drop(columns="run_id")
        pd.testing.assert_frame_equal(rows_new, rows_old, check_like=True)
        assert len(new.inputs.dataset_inputs) == len(old.inputs.dataset_inputs), stage
    compare = copy[smoke_pipeline.dirs["compare"].resolve()]
    views = lab.get_experiment(compare.info.experiment_id).tags
    assert f"mlflow.sharedViewState.saleval-{compare.info.run_id}" in views

    def everything() -> int:
        exps = [e.experiment_id for e in lab.search_experiments()]
        return len(lab.search_runs(exps, max_results=10_000))

    made = everything()
    again = catch_up([root], there)
    assert [o.line.split(":")[0] for o in again] == ["already logged"] * len(first)
    assert everything() == made


def test_a_store_failing_outside_the_journal_is_one_line(mlflow_uri: str) -> None:
    """A search between two of saleval-run's stages, or Lightning's per-epoch logging, meets
    a store that went away: the job ends in one line, not MLflow's traceback; a bug keeps
    its traceback."""
    from mlflow.exceptions import MlflowException

    from saleval.cli import expected_line

    err = MlflowException(
        "API request to http://127.0.0.1:9/api/2.0/mlflow/experiments/search failed with "
        "exception HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded (Caused "
        "by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection "
        "refused'))"
    )
    line = expected_line(err)
    assert line is not None and "\n" not in line
    assert line.startswith("the tracking store ") and "failed (connection refused)" in line
    assert "saleval-catch-up" in line
    assert expected_line(ValueError("a bug")) is None
    assert expected_line(OSError(errno.ENOSPC, "No space left on device", "/o/t.csv")) == (
        "no space left on device writing /o/t.csv: free space there (or set paths.output_root "
        "to another disk) and rerun; the files the run wrote before are kept whole"
    )
