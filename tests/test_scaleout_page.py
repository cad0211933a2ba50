"""docs/scale-out.md, walked as a new user walks it: every shell block runs as printed.

:func:`test_the_page_in_one_shell` runs the page's setup block, then every section's
blocks in page order, in one bash session (:mod:`tests.page_walk`), as one terminal would
from top to bottom, at the small size the page defines, and checks what each block did:
exit statuses, the lines the page says it prints, the run dirs, the MLflow runs, the jobs'
logs, the sockets the servers listen on, and that no password is left where git or SLURM
would pick it up. A section that leaves something exported for the next one to trip on
(section 4's tracking server, stopped, and section 5's jobs waiting on it) fails here, by a
step's time limit if it hangs. A command changed in the code but not on the page (or the
reverse) fails here too.

The session runs in a stand-in for the clone's root, a directory under /tmp holding links
to this checkout's ``Makefile``, ``src``, ``conf`` and ``.venv`` (``SALEVAL_ROOT`` points
there, so ``outputs/`` and ``.slurm-local/`` are the walk's own), with the checkout's
``.gitignore`` in a git repository of its own, so ``git status`` tells what a user could
stage: the page's ``$PWD`` paths and ``make`` targets work unchanged, and nothing of the
checkout is written. The page's ports and places (``RAY_PORT``, ``PG_PORT``,
``MLFLOW_PORT``, ``PG_DIR``) come from the environment, as the page allows, so the walk
takes free ones; ``HOME`` is an empty directory of the walk's outside it, as a new user's.
As root without ``sudo`` (CI), ``sudo`` is a small script that runs the command as sudo
would (a clean PATH; ``-u USER`` through ``runuser``). ``ray stop`` stops every Ray of the
machine; in the walk it is a shell function that ends the walk's own Ray alone.

The SLURM sections need root and the Debian packages ``slurm-wlm`` and ``munge``; the
tracking section PostgreSQL (``postgresql``); the Ray section the ``ray`` extra. ``.ci/run``
installs all of them; off CI a missing one skips the walk, naming the install, and on CI
(``CI`` set) it fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from saleval import paths
from saleval.pipeline import tables
from saleval.pipeline.records import dead_runs, slurm_state
from saleval.scaleout.slurm_local import LocalCluster
from saleval.scaleout.slurm_local import missing as slurm_missing
from saleval.vocab import PROBS
from tests.page_walk import Page, Ran, Shell, missing_lines
from tests.scaleout_support import BIN, launch, require, runs_of, subprocess_env

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "scale-out.md"
#: the steps of each section of the page, walked after its ``setup``, in page order
SECTIONS = {
    "one-machine": ["one-machine"],
    "slurm": ["slurm-start", "slurm-refused", "slurm-gpu", "slurm-sweep", "slurm-pipeline",
              "slurm-srun"],
    "ray": ["ray-local", "ray-head", "ray-cluster", "ray-stop"],
    "tracking": ["pg-start", "pg-databases", "pg-auth", "pg-server", "pg-user", "pg-sweep",
                 "pg-stop"],
    "a job dies": ["slurm-cancel", "slurm-rerun", "slurm-stop"],
}  # fmt: skip
#: what a job's log held before issue #48, none of it for the user to act on: Lightning's
#: SLURM requeue notice, weight-loading progress bars, MLflow's deprecated import and its
#: "experimental" notice, Ray's token notice and its colour codes
NOISE = re.compile(
    r"auto-requeue|Loading weights|Writing model shards|\d+%\||StarletteDeprecationWarning"
    r"|still experimental|Token authentication is enabled|\x1b\["
)
#: what a Ray sweep printed before issue #48 that tells the user nothing
RAY_NOISE = re.compile(
    r"Token authentication is enabled|\x1b\[\d+m\(|Loading weights|Writing model"
)
#: a page step's time limit, seconds (a whole section runs in a few minutes when idle)
STEP_TIMEOUT = 420
#: sudo for root where sudo is not installed: the command as root with sudo's clean PATH,
#: or as another user (``-u USER``) through runuser
SUDO = """#!/bin/sh
safe="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SUDO_USER=$(id -un)"
if [ "$1" = "-u" ]; then user=$2; shift 2; exec env $safe runuser -u "$user" -- "$@"; fi
exec env $safe "$@"
"""
#: ``ray stop`` in the walk: Ray's own ends every Ray of the machine (another test run's
#: too); this ends, by pid, the processes naming the walk's RAY_TMPDIR, and waits for them.
#: SIGKILL follows SIGTERM after 3 s: given SIGTERM together, the dashboard and the log
#: monitor end within a second and the GCS server, the raylet and the autoscaler's monitor
#: not in 20 s (Ray 2.5x, issue #54), so the 10 s this waited were spent waiting for SIGKILL
RAY_STOP_HERE = r"""ray() {
  if [ "$1" != stop ]; then command ray "$@"; return; fi
  local p i sig=TERM left
  for i in $(seq 60); do
    left=
    for p in /proc/[0-9]*; do
      [ "${p#/proc/}" = "$$" ] && continue
      if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$RAY_TMPDIR"; then
        left="$left ${p#/proc/}"; kill -s $sig "${p#/proc/}" 2>/dev/null
      fi
    done
    [ -z "$left" ] && return 0
    [ "$i" -ge 6 ] && sig=KILL  # SIGTERM for 3 s, then SIGKILL
    sleep 0.5
  done
  echo "walk: Ray processes under $RAY_TMPDIR outlived ray stop:$left" >&2
  ps -o pid,stat,args -p "${left# }" >&2; return 1
}"""


@pytest.fixture(scope="module")
def page() -> Page:
    return Page.read(DOC)


def test_every_shell_block_of_the_page_is_walked(page: Page) -> None:
    """Each bash block is a step of one section's walk, in page order, or marked not
    walked with its reason; each output block belongs to a step (Page.read refuses a
    block without a mark)."""
    steps = page.steps()
    assert steps[0] == "setup"
    walked = [s for section in SECTIONS.values() for s in section]
    assert steps[1:] == walked, "a step the walk does not take, or out of page order"
    assert {b.name for b in page.blocks if b.kind == "output"} <= set(steps)
    skipped = [b for b in page.blocks if b.kind == "no"]
    assert [b.text for b in skipped] == ["sudo apt-get install -y slurm-wlm munge"]
    assert all(b.why for b in skipped)


def test_a_block_the_walk_does_not_know_fails_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- walk: a -->\n```bash\necho a\n```\n\n```bash\necho b\n```\n")
    with pytest.raises(AssertionError, match="without a walk mark at lines \\[6\\]"):
        Page.read(page)
    page.write_text(
        "<!-- walk: a -->\n```bash\necho a\n```\n<!-- walk: no, why -->\n```bash\nb\n```\n"
    )
    assert Page.read(page).steps() == ["a"]


def test_a_line_the_page_shows_must_be_printed() -> None:
    shown = "saleval-train: job 1 (... x=30 ...) ended CANCELLED (SLURM job <id>_1)"
    printed = "noise\nsaleval-train: job 1 (seed=1 x=30 y=2) ended CANCELLED (SLURM job 12_1)\n"
    assert missing_lines(shown, printed) == []
    assert missing_lines(shown, printed.replace("CANCELLED", "TIMEOUT")) == [shown]
    assert missing_lines(shown.replace("x=30", "x=31"), printed) != []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Walk:
    """One section's walk: the stand-in clone root, its shell, and the page."""

    page: Page
    root: Path
    shell: Shell
    env: dict[str, str]
    log: Path

    def step(self, name: str, timeout: float = STEP_TIMEOUT) -> Ran:
        """Run step ``name`` as printed; fail, showing its output, when a command fails
        other than the page allows or a line the page shows is not printed."""
        block = self.page.step(name)
        ran = self.shell.run(name, block.text, timeout)
        print(f"walk: {name} {ran.seconds:.1f} s")
        tail = f"\n--- output of {name} (whole walk: {self.log}) ---\n{ran.output[-6000:]}"
        if block.exits:
            assert ran.failed, f"{name} should exit {block.exits}, and nothing failed{tail}"
            assert {s for s, _ in ran.failed} == {block.exits}, f"{name}: {ran.failed}{tail}"
        else:
            assert not ran.failed, f"{name}: failed commands {ran.failed}{tail}"
        expected = self.page.output(name)
        if expected is not None:
            lost = missing_lines(expected, ran.output)
            assert not lost, f"{name} did not print what the page shows: {lost}{tail}"
        return ran

    def var(self, name: str) -> str:
        """A shell variable of the walk (a password the page made), through a file of mode
        600 outside the stand-in root, so it shows in no output and no log."""
        where = self.log.with_name(".walk-var")
        self.shell.run("var", f'(umask 077; printf %s "${name}" > {where})', 30)
        try:
            return where.read_text()
        finally:
            where.unlink()


@pytest.fixture
def walk(page: Page, tmp_path: Path) -> Iterator[Walk]:
    """The page's setup block run in a fresh stand-in root (module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="saleval-walk-", dir="/tmp"))
    root.chmod(0o755)
    for name in ("Makefile", "src", "conf", "pyproject.toml", "requirements.lock"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(Path(sys.prefix))
    shutil.copy(REPO / ".gitignore", root / ".gitignore")  # git reads no linked .gitignore
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths
    home = Path(tempfile.mkdtemp(prefix="home-", dir="/tmp"))
    pg_dir = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp")) / "pg"  # as /var/tmp/...: outside
    pg_dir.parent.chmod(0o755)  # the user postgres reaches it
    env = {
        k: v
        for k, v in subprocess_env().items()
        if not k.startswith(("MLFLOW_", "SLURM_", "RAY_", "VIRTUAL_ENV", "SALEVAL_ROOT"))
    }
    env.update(
        HOME=str(home),  # a new user's: empty (and what Ray writes there is seen)
        SALEVAL_ROOT=str(root),
        SALEVAL_DATA_ROOT=str(paths.default_data_root()),
        RAY_TMPDIR=str(ray_tmp),
        RAY_PORT=str(_free_port()),
        PG_PORT=str(_free_port()),
        MLFLOW_PORT=str(_free_port()),
        PG_DIR=str(pg_dir),
    )
    if os.geteuid() == 0 and shutil.which("sudo") is None:
        shim = root / ".walk-bin"
        shim.mkdir()
        (shim / "sudo").write_text(SUDO)
        (shim / "sudo").chmod(0o755)
        env["PATH"] = f"{shim}:{env['PATH']}"
    log = tmp_path / "walk.log"
    shell = Shell(root, env, log)
    try:
        w = Walk(page, root, shell, env, log)
        shell.run("ray-stop-here", RAY_STOP_HERE, 30)
        w.step("setup", timeout=60)
        yield w
    finally:
        shell.close()
        _end_left_behind((str(root), str(ray_tmp), str(pg_dir)))
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        if not os.environ.get("SALEVAL_WALK_KEEP"):  # set: the stand-in root stays, to look at
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(pg_dir.parent, ignore_errors=True)


def _naming(places: tuple[str, ...]) -> list[int]:
    """The processes (but this one) whose command line names one of ``places``."""
    mine = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(proc.name) != os.getpid() and any(p in cmdline for p in places):
            mine.append(int(proc.name))
    return mine


def _listening(pids: list[int] | None) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the processes ``pids`` (None: any process)
    listen on, from /proc."""
    inodes = set()
    for pid in pids or []:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or (pids is not None and fields[9] not in inodes):  # LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words, each little-endian
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def _end_left_behind(places: tuple[str, ...]) -> None:
    """End, by pid, the processes of this walk that left the shell's process group and
    outlived it (a tracking server in a group of its own, after a step failed): those
    whose command line names the walk's own directories."""
    mine = _naming(places)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in mine):
            time.sleep(0.2)


# --- 1. One machine ---------------------------------------------------------------------


def _sweeps(root: Path, stage: str) -> list[Path]:
    """The sweep dirs of ``stage`` that ran jobs (a refused sweep leaves an empty one)."""
    found = (root / "outputs" / stage / "multirun").glob("*")
    ran = [p for p in found if (p / "0").is_dir()]
    return sorted(ran, key=lambda p: p.stat().st_mtime)


def _new_sweep(root: Path, stage: str, before: list[Path]) -> Path:
    """The one sweep dir of ``stage`` that ran jobs and is not in ``before``."""
    (sweep,) = [s for s in _sweeps(root, stage) if s not in before]
    return sweep


def _finished_jobs(sweep: Path, n: int = 2) -> dict[str, dict]:
    """run.json of each job dir of ``sweep``, all FINISHED."""
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert jobs == [str(i) for i in range(n)], f"{sweep}: jobs {jobs}"
    infos = {j: json.loads((sweep / j / "run.json").read_text()) for j in jobs}
    assert {i["status"] for i in infos.values()} == {"FINISHED"}
    return infos


def _check_train_sweep(client: MlflowClient, sweep: Path) -> dict[str, object]:
    """Two jobs (seed=1,2) each in its own process, run dir and FINISHED MLflow run."""
    infos = _finished_jobs(sweep)
    runs = runs_of(client, f"tags.sweep = '{sweep}'")
    by_job = {r.data.tags["sweep.job"]: r for r in runs}
    assert sorted(by_job) == ["0", "1"] and len(runs) == 2
    assert {r.data.params["seed"] for r in runs} == {"1", "2"}
    for job, run in by_job.items():
        info = infos[job]
        assert run.info.run_id == info["run_id"] and run.info.status == "FINISHED"
        assert run.data.tags["run_dir"] == str(sweep / job)
        assert f"seed={run.data.params['seed']}" in run.data.tags["sweep.overrides"]
        assert "val_accuracy" in run.data.metrics
        assert json.loads((sweep / job / "metrics.json").read_text())["n_train"] == 32
        assert (sweep / job / "model" / "config.json").is_file()
    assert len({i["pid"] for i in infos.values()}) == 2  # two worker processes ran them
    return by_job


def _one_machine(walk: Walk, client: MlflowClient) -> None:
    walk.step("one-machine")
    (sweep,) = _sweeps(walk.root, "train")
    runs = _check_train_sweep(client, sweep)  # both jobs created the fresh store's tables
    for run in runs.values():
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"metrics.json", "run.json"} <= names


# --- 2. SLURM (and 5. When a job dies) ----------------------------------------------------


def _queue(env: dict[str, str]) -> str:
    return subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout


def _err_files(sweep: Path) -> list[Path]:
    return sorted((sweep / ".submitit").glob("*/*.err"))


def _assert_quiet(logs: list[Path], empty: bool = True) -> None:
    """A job's ``.err`` holds nothing the user must learn to ignore (module NOISE): a job
    that ran to its end leaves it empty; a cancelled one holds SLURM's own lines only."""
    assert logs
    for err in logs:
        lines = err.read_text().splitlines()
        noisy = [line for line in lines if NOISE.search(line)]
        assert not noisy, f"{err}: {noisy[:3]}"
        assert not (empty and lines), f"{err} holds {lines[:3]}: silence it at its source"


def _by_job(client: MlflowClient, sweep: Path, stage: str) -> dict[str, list]:
    """The ``stage`` runs of ``sweep`` by ``sweep.job``, oldest first."""
    out: dict[str, list] = {}
    for r in runs_of(client, f"tags.sweep = '{sweep}' and tags.stage = '{stage}'"):
        out.setdefault(r.data.tags["sweep.job"], []).append(r)
    return {k: sorted(v, key=lambda r: r.info.start_time) for k, v in out.items()}


def _check_pipeline_sweep(client: MlflowClient, sweep: Path) -> None:
    """Each dataset's whole pipeline ran as one SLURM job of its own."""
    jobs = {}
    for job, dataset in (("0", "ag_news"), ("1", "sst2")):
        pipeline = json.loads((sweep / job / "pipeline.json").read_text())
        assert set(pipeline["stages"]) >= {"train", "explain", "score", "metrics", "compare"}
        comparison = tables.COMPARISON.read(sweep / job / "compare")
        assert len(comparison) > 0 and comparison["method"].nunique() > 1
        runs = runs_of(client, f"tags.sweep = '{sweep}' and tags.`sweep.job` = '{job}'")
        stages = {r.data.tags["stage"]: r for r in runs}
        assert set(pipeline["stages"]) <= set(stages)
        for r in stages.values():
            assert r.info.status == "FINISHED" and r.data.tags["dataset"] == dataset
            assert r.data.tags["run_dir"].startswith(str(sweep / job))
        jobs[job] = {r.data.tags["slurm_job_id"] for r in stages.values()}
    assert len(jobs["0"]) == len(jobs["1"]) == 1 and jobs["0"] != jobs["1"]


def _check_srun_step(walk: Walk, client: MlflowClient, ran: Ran) -> None:
    """The two-task step wrote the single-process tables, and rank 0 alone logged."""
    two = walk.root / "outputs" / "explain" / "srun-try"
    (run,) = runs_of(client, f"tags.run_dir = '{two}'")
    info = json.loads((two / "run.json").read_text())
    assert run.info.status == "FINISHED" and run.info.run_id == info["run_id"]
    assert re.fullmatch(r"\d+", run.data.tags["slurm_job_id"])  # a step, not an array task
    model = Path(info["parent_dirs"]["model"])
    assert "MEMBER: 2/2" in ran.output  # Lightning joined the two ranks srun started
    # the same explain in one process (not a page step: the reference)
    one = walk.root / "one-process"
    small = walk.var("SMALL_EXPLAIN").split()
    subprocess.run(
        [str(Path(sys.executable).with_name("saleval-explain")), "trainer=cpu",
         f"inputs.model={model}", *small, f"hydra.run.dir={one}"],
        env={**walk.env, "MLFLOW_TRACKING_URI": f"sqlite:///{walk.root / 'reference.db'}"},
        cwd=walk.root, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    pred1, pred2 = tables.PREDICTIONS.read(one), tables.PREDICTIONS.read(two)
    attr1, attr2 = tables.ATTRIBUTIONS.read(one), tables.ATTRIBUTIONS.read(two)
    assert set(attr1["method"]) == {"random", "vanilla_gradient", "lime", "occlusion"}
    probs = PROBS.of(pred1.columns)
    pd.testing.assert_frame_equal(pred1.drop(columns=probs), pred2.drop(columns=probs))
    np.testing.assert_allclose(pred1[probs], pred2[probs], rtol=1e-5, atol=1e-7)
    pd.testing.assert_frame_equal(attr1.drop(columns="score"), attr2.drop(columns="score"))
    np.testing.assert_allclose(attr1["score"], attr2["score"], rtol=1e-4, atol=1e-7)
    made = sorted(p.name for p in (walk.root / "outputs" / "explain").iterdir())
    assert made == ["latest", "srun-try"]  # rank 1 made no run dir of its own


def _check_cancelled(client: MlflowClient, sweep: Path, ran: Ran) -> str:
    """Job 0 finished, job 1 KILLED in run.json and MLflow, tagged and named as the
    error line names its SLURM job; returns that job id."""
    (line,) = [x for x in ran.output.splitlines() if x.startswith("saleval-train:")]
    named = re.search(r"SLURM job (\d+_1)\)", line)
    assert named, line
    job = named.group(1)
    assert (sweep / ".submitit" / job).is_dir()
    info0 = json.loads((sweep / "0" / "run.json").read_text())
    killed = json.loads((sweep / "1" / "run.json").read_text())
    assert (info0["status"], killed["status"]) == ("FINISHED", "KILLED")
    # scancel reaches the job as SIGTERM, SIGKILL after KillWait: run.json says SLURM killed it
    assert f"SLURM is killing job {job} (COMPLETING" in killed["error"], killed["error"]
    first = _by_job(client, sweep, "train")
    assert [r.info.status for r in first["0"]] == ["FINISHED"]
    assert [r.info.status for r in first["1"]] == ["KILLED"]
    k = first["1"][0]
    assert k.info.run_id == killed["run_id"] and k.info.end_time
    assert "test_accuracy" not in k.data.metrics  # stopped before its test
    assert "trainer.max_epochs=30" in k.data.tags["sweep.overrides"]
    assert k.data.tags["slurm_job_id"] == job  # the id the error line names
    assert first["0"][0].data.tags["slurm_job_id"] == job.replace("_1", "_0")
    return info0["run_id"]


def _check_rerun(client: MlflowClient, sweep: Path, run0: str) -> None:
    second = _by_job(client, sweep, "train")
    assert [r.info.run_id for r in second["0"]] == [run0]
    assert [r.info.status for r in second["1"]] == ["KILLED", "FINISHED"]
    rerun = json.loads((sweep / "1" / "run.json").read_text())
    assert rerun["status"] == "FINISHED" and rerun["run_id"] == second["1"][1].info.run_id
    assert "test_accuracy" in second["1"][1].data.metrics
    # one job left: submitted as a plain job, not an array, and tagged so (the page's intro)
    assert re.fullmatch(r"\d+", second["1"][1].data.tags["slurm_job_id"])


def _check_killed_outright(env: dict[str, str], where: Path) -> None:
    """A job killed outright leaves its run RUNNING; the next stage, on any machine of the
    cluster, asks SLURM and ends it, its run dir too (section 5)."""

    def sbatch() -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", "--mem=100M", f"--output={where}/%j.out", "--wrap", "sleep 120"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip().split(";")[0]

    dead, alive = sbatch(), sbatch()
    subprocess.run(["scancel", "-s", "KILL", dead], env=env, check=True)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        deadline = time.monotonic() + 60
        while slurm_state.job_states([dead]).get(dead) in slurm_state.ACTIVE:
            assert time.monotonic() < deadline, "the cancelled job never ended"
            time.sleep(0.3)
        client = MlflowClient(tracking_uri=f"sqlite:///{where / 'dead.db'}")
        exp = client.create_experiment("slurm-jobs")
        ids = {}
        for name, job in (("dead", dead), ("alive", alive)):
            run_dir = where / name
            run_dir.mkdir()
            tags = {"slurm_job_id": job, "slurm_cluster": "saleval-local",
                    "host": "node-elsewhere", "pid": "1", "run_dir": str(run_dir)}  # fmt: skip
            ids[name] = client.create_run(exp, tags=tags).info.run_id
            (run_dir / "run.json").write_text(
                json.dumps({"run_id": ids[name], "status": "RUNNING"})
            )
        assert dead_runs.end_dead_runs(client) == [ids["dead"]]
    finally:
        subprocess.run(["scancel", alive], env=env, check=False)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
    assert client.get_run(ids["dead"]).info.status == "KILLED"
    assert client.get_run(ids["alive"]).info.status == "RUNNING"
    assert json.loads((where / "dead" / "run.json").read_text())["status"] == "KILLED"


def _slurm(walk: Walk, env: dict[str, str], client: MlflowClient) -> None:
    walk.step("slurm-start")
    conf = (walk.root / ".slurm-local" / "slurm.conf").read_text()
    ports = {int(p) for p in re.findall(r"^Slurm(?:ctld|d)Port=(\d+)$", conf, re.M)}
    listening = _listening(_naming((str(walk.root / ".slurm-local"),)))
    assert {p for _, p in listening} >= ports and len(ports) == 2, listening
    assert {a for a, _ in listening} == {"127.0.0.1"}, listening  # loopback, as the page says
    for refused in ("slurm-refused", "slurm-gpu"):  # one line each, nothing submitted
        ran = walk.step(refused)
        (line,) = [x for x in ran.output.splitlines() if x.startswith("saleval-")]
        assert "cannot run these jobs" in line and "Traceback" not in ran.output
        assert not list((walk.root / "outputs").rglob(".submitit")) and not _queue(env)
    # a sweep whose tracking store is down: one line within the wait, nothing submitted
    down = f"http://127.0.0.1:{_free_port()}"
    ran = walk.shell.run(
        "slurm-store-down",
        f"(MLFLOW_TRACKING_URI={down} saleval-train -m hydra/launcher=slurm $SMALL_NODE "
        "tracking.wait_s=3 seed=1,2 $SMALL_TRAIN)",
        120,
    )
    lines = [x for x in ran.output.splitlines() if x.strip()]
    assert {s for s, _ in ran.failed} == {2} and len(lines) == 1, ran.output
    assert lines[0].startswith(
        f"saleval-train: the tracking store {down} did not answer within 3 s"
    )
    assert lines[0].endswith("nothing was submitted"), lines[0]
    print(f"walk: the sweep with its store down was refused after {ran.seconds:.1f} s")
    assert ran.seconds < 3 + 10 + 15  # the wait, its 10 s, and the command's start under load
    assert not list((walk.root / "outputs").rglob(".submitit")) and not _queue(env)
    before = _sweeps(walk.root, "train")
    walk.step("slurm-sweep")
    sweep = _new_sweep(walk.root, "train", before)
    by_job = _check_train_sweep(client, sweep)
    tasks = sorted(
        p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)
    )
    assert sorted(r.data.tags["slurm_job_id"] for r in by_job.values()) == tasks
    _assert_quiet(_err_files(sweep))

    walk.step("slurm-pipeline")
    (pipelines,) = _sweeps(walk.root, "run")
    _check_pipeline_sweep(client, pipelines)
    _assert_quiet(_err_files(pipelines))

    ran = walk.step("slurm-srun")
    _check_srun_step(walk, client, ran)


def _a_job_dies(
    walk: Walk, env: dict[str, str], client: MlflowClient, secrets: dict[str, str]
) -> None:
    """Section 5, after section 4 in the same shell: its jobs log to the local store."""
    ran = walk.step("slurm-cancel")
    cancelled = walk.root / "outputs" / "try-cancel"
    run0 = _check_cancelled(client, cancelled, ran)
    walk.step("slurm-rerun")
    _check_rerun(client, cancelled, run0)
    _assert_quiet(_err_files(cancelled), empty=False)
    _no_secret_left(walk, secrets)

    outright = walk.root / "outright"
    outright.mkdir()
    _check_killed_outright(env, outright)


# --- 3. Ray -------------------------------------------------------------------------------


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed: pip install -e '.[ray]' (part of .[dev])"
    return None


def _ray(walk: Walk, client: MlflowClient, secrets: dict[str, str]) -> None:
    token_file = Path(walk.env["HOME"]) / ".ray" / "auth_token"
    before = _sweeps(walk.root, "train")
    ran = walk.step("ray-local")
    local = _new_sweep(walk.root, "train", before)
    _check_train_sweep(client, local)
    assert f"Ray sweep output dir : {local} (local)" in ran.output
    # no token notice for a Ray of its own, no weight-loading bars (Lightning's training bar
    # is trainer.progress_bar's to switch), and, the output being no terminal, the jobs'
    # lines without Ray's colour codes and (_execute pid=...) prefixes
    noisy = [x for x in ran.output.splitlines() if RAY_NOISE.search(x)]
    assert not noisy, noisy[:3]
    colour = re.compile(r"\x1b\[[\d;]*m")  # SGR codes (a bar's cursor moves are tqdm's)
    assert not colour.search(ran.output) and "pid=" not in ran.output, ran.output[-3000:]
    # the Ray started for the sweep had a token of its own: none written for later joins
    assert not token_file.exists()

    walk.step("ray-head")
    secrets["RAY_AUTH_TOKEN"] = walk.var("RAY_AUTH_TOKEN")
    # where the page says Ray listens: its GCS on every interface
    listening = _listening(_naming((walk.env["RAY_TMPDIR"],)))
    print(f"walk: Ray's head listens on {sorted(listening)}")
    port = int(walk.env["RAY_PORT"])
    assert {a for a, p in listening if p == port} & {"0.0.0.0", "::"}, listening
    before = _sweeps(walk.root, "train")
    ran = walk.step("ray-cluster")
    joined = _new_sweep(walk.root, "train", before)
    _check_train_sweep(client, joined)
    assert "object_store_memory must not be provided" not in ran.output
    assert f"Ray sweep output dir : {joined} (" in ran.output

    # the same command in a shell without the cluster's token: one line, at once
    command = walk.page.step("ray-cluster").text
    refused = walk.shell.run("no-token", f"(unset RAY_AUTH_MODE RAY_AUTH_TOKEN\n{command}\n)", 120)
    assert {s for s, _ in refused.failed} == {2}, refused.output
    assert not missing_lines(walk.page.example("ray-no-token"), refused.output), refused.output
    assert "InvalidAuthToken" not in refused.output and refused.seconds < 60

    walk.step("ray-stop")
    assert not _naming((walk.env["RAY_TMPDIR"],)) and not walk.var("RAY_AUTH_TOKEN")


# --- 4. One tracking server ---------------------------------------------------------------


def _pg_missing() -> str | None:
    try:
        import flask_wtf  # noqa: F401  (MLflow's basic-auth app)
        import psycopg  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed: pip install -e '.[postgres]' (part of .[dev])"
    install = "apt-get install -y postgresql (as root; .ci/run does this)"
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        return f"PostgreSQL's initdb not found: {install}"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return f"PostgreSQL runs as the user postgres, which is missing: {install}"
    if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode:
        return "the page starts PostgreSQL with sudo -u postgres: run as root (or sudo without a password)"
    return None


def _command_lines() -> list[bytes]:
    """Every process's command line (what ``ps`` shows every user)."""
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes())
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return lines


def _status(url: str, auth: tuple[str, str] | None = None, host: str | None = None,
            method: str = "GET", body: dict | None = None) -> int:  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    if host:
        headers["Host"] = host
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _tracking(
    walk: Walk, client: MlflowClient, monkeypatch: pytest.MonkeyPatch, secrets: dict[str, str]
) -> None:
    import psycopg

    port, pg_dir = walk.env["MLFLOW_PORT"], Path(walk.env["PG_DIR"])
    local = f"http://127.0.0.1:{port}"
    try:
        for name in ("pg-start", "pg-databases", "pg-auth"):
            walk.step(name)
        assert (walk.root / "basic_auth.ini").stat().st_mode & 0o077 == 0
        ran = walk.step("pg-server", timeout=600)
        assert ran.output.strip().endswith("OK")  # /health answered
        print(f"walk: the server answered /health after {ran.seconds:.1f} s")
        # where the page says: PostgreSQL on localhost only, the server on every interface
        postgres = _listening(_naming((str(pg_dir),)))
        assert postgres and {a for a, _ in postgres} <= {"127.0.0.1", "::1"}, postgres
        # (its uvicorn holds the socket, under a command line that names none of the walk's
        # places: found by its port)
        assert {a for a, p in _listening(None) if p == int(port)} == {"0.0.0.0"}
        # no password on a command line, which ps shows to every user
        shown = _command_lines()
        db_password = walk.var("DB_PASSWORD").encode()
        assert not [c for c in shown if db_password in c], "a password on a command line"
        pgpass = Path(walk.env["HOME"]) / ".pgpass"
        assert pgpass.stat().st_mode & 0o077 == 0  # the database's password: mode 600
        walk.step("pg-user")
        before = _sweeps(walk.root, "train")
        swept = walk.step("pg-sweep")
        credentials = Path(walk.env["HOME"]) / ".mlflow" / "credentials"
        assert credentials.stat().st_mode & 0o077 == 0  # the jobs' account: mode 600

        admin = ("admin", walk.var("ADMIN_PASSWORD"))
        member = ("lab-jobs", walk.var("JOBS_PASSWORD"))
        for name in ("ADMIN_PASSWORD", "JOBS_PASSWORD", "DB_PASSWORD", "SERVER_KEY"):
            secrets[name] = walk.var(name)
        assert all(len(v) >= 16 for v in secrets.values()), "a secret the page no longer makes"
        api = f"{local}/api/2.0/mlflow"
        # nothing without credentials, or with wrong ones
        assert _status(f"{api}/experiments/search?max_results=1") == 401
        assert _status(f"{api}/experiments/create", method="POST", body={"name": "x"}) == 401
        assert _status(f"{api}/experiments/search?max_results=1", ("admin", "wrong")) == 401
        assert _status(f"{api}/experiments/search?max_results=1", admin) == 200
        # the hosts --allowed-hosts names, and no other
        assert _status(f"{api}/experiments/search?max_results=1", admin, f"elsewhere:{port}") == 403
        assert _status(f"{local}/health", host=f"{socket.gethostname()}:{port}") == 200

        server = f"http://{socket.gethostname()}:{port}"
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        with pytest.raises(MlflowException, match="401|credentials|Unauthorized|UNAUTHENTICATED"):
            MlflowClient(tracking_uri=server).search_experiments()
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", member[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", member[1])
        sweep = _new_sweep(walk.root, "train", before)
        runs = _check_train_sweep(MlflowClient(tracking_uri=server), sweep)
        for job, run in runs.items():
            info = json.loads((sweep / job / "run.json").read_text())
            assert info["tracking_uri"] == server
            # artifacts went through the server into its destination
            assert run.info.artifact_uri.startswith("mlflow-artifacts:")
            (stored,) = (walk.root / "mlartifacts").rglob(
                f"{run.info.run_id}/artifacts/metrics.json"
            )
            assert stored.read_bytes() == (sweep / job / "metrics.json").read_bytes()
        assert not runs_of(client, f"tags.sweep = '{sweep}'")  # none in the local store
        # the runs are rows of PostgreSQL
        db = walk.var("DB_PASSWORD")
        with psycopg.connect(host="127.0.0.1", port=int(walk.env["PG_PORT"]), user="mlflow",
                             password=db, dbname="mlflow") as conn:  # fmt: skip
            rows = conn.execute("SELECT run_uuid FROM runs WHERE status = 'FINISHED'")
            assert {r.info.run_id for r in runs.values()} <= {row[0] for row in rows}
        log = (walk.root / "mlflow-server.log").read_text()
        assert not NOISE.search(log), [x for x in log.splitlines() if NOISE.search(x)]
        # issue #45 on the lab's server: the jobs' password in no artefact, a wrong password
        # and a missing permission refused in one line, runs moved here from a laptop store
        _no_password_in_artefacts(walk, member[1], swept, list(runs.values()))
        _refused_in_one_line(server, admin, walk.root / "refused", monkeypatch)
        _catch_up_moves_a_chain_here(server, admin, walk.root / "laptop", monkeypatch)

        walk.step("pg-stop")
        deadline = time.monotonic() + 60
        while _status(f"{local}/health") != 0:  # the workers went with the server
            assert time.monotonic() < deadline, "the server's workers still answer"
            time.sleep(0.5)
        assert not credentials.exists() and not walk.var("MLFLOW_TRACKING_URI")
    finally:
        pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if pg_ctl and (pg_dir / "data" / "postmaster.pid").exists():
            runas = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run([*runas, str(pg_ctl[-1]), "-D", str(pg_dir / "data"), "-m",
                            "immediate", "-w", "stop"], capture_output=True)  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("keep_mlflow_store")
def test_the_page_in_one_shell(walk: Walk, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every section in page order in one shell session (module docstring)."""
    for missing in (slurm_missing(), _ray_missing(), _pg_missing()):
        require(missing)
    cluster = LocalCluster(walk.root / ".slurm-local")
    env = {**walk.env, **cluster.env()}
    client = MlflowClient(tracking_uri=f"sqlite:///{walk.root / 'outputs' / 'mlflow.db'}")
    secrets: dict[str, str] = {}
    try:
        _one_machine(walk, client)
        _slurm(walk, env, client)
        _ray(walk, client, secrets)
        _tracking(walk, client, monkeypatch, secrets)
        _a_job_dies(walk, env, client, secrets)
        walk.step("slurm-stop")
        assert cluster.node_state() == ""  # nothing answers any more
        assert not _naming((str(cluster.root),)), "a SLURM daemon outlived slurm-local-stop"
        assert not walk.var("SLURM_CONF")
        log = walk.log.read_text()
        assert not [k for k, v in secrets.items() if v in log], "a secret in the walk's log"
    finally:
        cluster.stop()


def _no_secret_left(walk: Walk, secrets: dict[str, str]) -> None:
    """No password, key or token the page made in SLURM's state (its copies of the jobs'
    environments among it, section 5's jobs', submitted after section 4), the run dirs, or
    any file of the stand-in clone that git would stage (untracked, not ignored)."""
    state = walk.root / ".slurm-local" / "state"
    saved = list(state.rglob("environment"))
    assert any(b"SALEVAL_ROOT=" in p.read_bytes() for p in saved), "no job environment saved"
    status = subprocess.run(
        ["git", "status", "--porcelain", "-z", "--untracked-files=all"],
        cwd=walk.root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    untracked = [walk.root / e[3:] for e in status.split("\0") if e.startswith("?? ")]
    assert (walk.root / "basic_auth.ini").is_file() and (walk.root / "mlartifacts").is_dir()
    places = [*state.rglob("*"), *(walk.root / "outputs").rglob("*"), *untracked]
    files = [p for p in places if p.is_file() and not p.is_symlink()]
    for name, secret in secrets.items():
        leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
        assert not leaked, f"{name} in {leaked}"


def _no_password_in_artefacts(walk: Walk, secret: str, swept: Ran, runs: list) -> None:
    """The password the jobs read from ~/.mlflow/credentials is in nothing saleval wrote or
    printed: run dirs, Hydra's files, the server's copies, the runs' params and tags."""
    assert secret not in swept.output
    for root in (walk.root / "outputs", walk.root / "mlartifacts"):
        leaked = [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
        assert leaked == []
    for run in runs:
        assert all(secret not in v for v in {**run.data.params, **run.data.tags}.values())


def _member(server: str, admin: tuple[str, str], name: str) -> tuple[str, str]:
    """An account of the server, made by its admin."""
    import secrets

    account = (name, secrets.token_urlsafe(16))
    made = _status(f"{server}/api/2.0/mlflow/users/create", admin, method="POST",
                   body={"username": account[0], "password": account[1]})  # fmt: skip
    assert made == 200
    return account


def _refused_in_one_line(
    server: str, admin: tuple[str, str], where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """401 and 403 end a stage in one line naming the server, the user, the cause and the
    fix, not in MLflow's traceback; nothing is computed."""
    from saleval.pipeline.stage import Stage
    from saleval.pipeline.tracker import tracking_health
    from saleval.stages.run import compose_stage

    published = paths.default_data_root() / "published" / "lu2024" / "AGNEWS.csv"
    wrong = ("lab-jobs-401", "not-the-password")
    env = subprocess_env(
        server, MLFLOW_TRACKING_USERNAME=wrong[0], MLFLOW_TRACKING_PASSWORD=wrong[1]
    )
    where.mkdir(parents=True)
    done = launch(
        [BIN / "saleval-score", "crowd=lu2024", f"crowd.path={published}", "dataset=ag_news",
         f"paths.output_root={where / 'out'}"],
        env, where, timeout=120, expect=2,
    )  # fmt: skip
    lines = [ln for ln in done.output.splitlines() if ln.startswith("saleval-score:")]
    assert lines == [
        f"saleval-score: the tracking server {server} refused user 'lab-jobs-401' "
        "(401 Unauthorized): set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
        "~/.mlflow/credentials) to an account of that server"
    ], done.tail()
    assert "Traceback" not in done.output and wrong[1] not in done.output
    assert not list((where / "out").rglob("run.json"))

    # a member with no permission on the lab's study: refused as the run starts, naming both
    reader = _member(server, admin, "reader")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
    locked = MlflowClient(tracking_uri=server).create_experiment("locked-study")
    from mlflow.server import get_app_client

    auth = get_app_client("basic-auth", tracking_uri=server)
    # (the server's default permission, EDIT, is a floor under any lesser positive grant)
    auth.grant_user_permission(reader[0], "experiment", locked, "DENY")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", reader[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", reader[1])
    tracking_health.forget_checks()
    cfg = compose_stage("score", ["crowd=lu2024", "dataset=ag_news",
                                  "tracking.experiment=locked-study"])  # fmt: skip
    cfg.run_dir = str(where / "score")
    with pytest.raises(tracking_health.TrackingError) as refused, Stage(cfg, "score"):
        pytest.fail("the stage must not start")
    assert str(refused.value) == (
        f"the tracking server {server} does not let user 'reader' start runs in "
        "experiment 'locked-study' (403 Forbidden): ask its admin for EDIT permission on "
        "experiment 'locked-study', or pick one you may write to with tracking.experiment=<name>"
    )


def _catch_up_moves_a_chain_here(
    server: str, admin: tuple[str, str], where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs made against a local SQLite store (a laptop) are logged to the lab's server
    afterwards: a sweep of two explain runs and the tasks run made from it, with their
    params, metrics, tags, files, and the tasks run's parent links pointing at the
    explain runs' copies on the server. Run twice, it logs once."""
    from saleval.pipeline.tracker import tracking_health
    from saleval.pipeline.tracker.catch_up import COPY_OF
    from saleval.stages import tasks as tasks_stage
    from saleval.testing import explain_frames, make_explain_run
    from tests.conftest import compose_config
    from tests.sweeps_support import LABELS, fake_sweep

    laptop = f"sqlite:///{where / 'mlflow.db'}"
    where.mkdir(parents=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", laptop)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    tracking_health.forget_checks()
    preds, attrs = explain_frames(6, LABELS, methods=["random", "lime"])

    def job(methods: list[str]):
        return lambda d: make_explain_run(d, preds, attrs[attrs["method"].isin(methods)])

    sweep = fake_sweep(where / "sweep", [job(["random"]), job(["lime"])])
    cfg = compose_config(
        "tasks",
        [f"inputs.explain={sweep}", "study.n_samples=4", "study.population=correct",
         "study.balance_by=none", "study.methods=[random,lime]", "study.bundle_size=4",
         "study.repeats=1", "kgrid.ks=[5]"],
        where / "tasks",
    )  # fmt: skip
    tasks_stage.run(cfg)
    here = MlflowClient(tracking_uri=laptop)
    first = {d: json.loads((d / "run.json").read_text())["run_id"]
             for d in (sweep / "0", sweep / "1", where / "tasks")}  # fmt: skip

    member = _member(server, admin, "mover")
    env = subprocess_env(MLFLOW_TRACKING_USERNAME=member[0], MLFLOW_TRACKING_PASSWORD=member[1])
    move = [BIN / "saleval-catch-up", "--tracking-uri", server, where / "tasks"]
    done = launch(move, env, where, timeout=180)
    logged = [ln for ln in done.output.splitlines() if ln.startswith("logged: ")]
    assert len(logged) == 3, done.tail()  # the tasks run and, first, both its parents

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", member[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", member[1])
    lab = MlflowClient(tracking_uri=server)
    copies = {r.data.tags[COPY_OF]: r for r in runs_of(lab, f"tags.`{COPY_OF}` LIKE '%'")}
    assert set(copies) == set(first.values())
    tasks = copies[first[where / "tasks"]]
    original = here.get_run(first[where / "tasks"])
    assert tasks.info.status == "FINISHED" and tasks.info.run_name == original.info.run_name
    assert tasks.data.params == original.data.params
    assert tasks.data.metrics == original.data.metrics
    for i in (0, 1):  # the parent links point at the server's copies
        parent = copies[first[sweep / str(i)]]
        assert tasks.data.tags[f"parent.explain.{i}"] == parent.info.run_id
        assert parent.data.tags["run_dir"] == str((sweep / str(i)).resolve())
    stored = {a.path for a in lab.list_artifacts(tasks.info.run_id)}
    assert {"tasks.csv", "bundles.csv", "config.yaml", "run.json"} <= stored
    fetched = lab.download_artifacts(tasks.info.run_id, "tasks.csv", str(where))
    assert Path(fetched).read_bytes() == (where / "tasks" / "tasks.csv").read_bytes()
    record = json.loads((where / "tasks" / "run.json").read_text())
    assert record["copies"] == {server: tasks.info.run_id}

    # again, and the sweep itself: nothing is logged twice
    again = launch([*move, sweep], env, where, timeout=180)
    assert [ln for ln in again.output.splitlines() if ln.startswith("logged: ")] == []
    assert sum(ln.startswith("already logged: ") for ln in again.output.splitlines()) == 3
    assert len(runs_of(lab, f"tags.`{COPY_OF}` LIKE '%'")) == 3
