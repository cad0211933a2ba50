"""The parts of the SLURM and Ray launchers that need no cluster (docs/scale-out.md): they
run everywhere, also where the page's walk (``tests/test_scaleout_page.py``) skips.

* a stage stopped from outside (``saleval.errors.Stopped``: scancel's SIGTERM) ends its run
  KILLED, in MLflow and ``run.json``, and so does a pipeline run;
* which jobs of a sweep dir finished, and a sweep dir of another sweep refused;
* the resource check's one line for each setting, a trainer that takes GPUs the job does
  not ask for, and a limit the warning signal eats; what a job's config uses;
* the launcher configs compose to saleval's launchers;
* the quiet defaults: the tracking server's filters drop exactly MLflow's two notices,
  a Ray started for a sweep gets a token of its own, job logs lose their progress bars;
* the local cluster runs on the system's Python, without the venv.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.errors import Stopped, sigterm_raises
from saleval.pipeline.compose import register_configs
from saleval.pipeline.records import dead_runs, slurm_state
from saleval.pipeline.stage import Stage
from saleval.scaleout import resume, tracking_server
from saleval.scaleout.needs import GpuUse, job_gpus, sweep_gpus
from saleval.scaleout.ray import RayLauncher
from saleval.scaleout.slurm import LauncherError, Partition, SlurmLauncher, check_resources
from tests.scaleout_support import hydra_config


def test_a_stage_stopped_from_outside_ends_killed_not_failed(
    make_cfg: Callable[..., DictConfig],
) -> None:
    cfg = make_cfg("score", name="stopped")
    with pytest.raises(Stopped), Stage(cfg, "score") as st:
        run_id = st.tracking.run_id
        raise Stopped("SLURM sent SIGTERM (scancel or preemption)")
    assert run_id is not None
    assert MlflowClient().get_run(run_id).info.status == "KILLED"
    info = json.loads((Path(cfg.run_dir) / "run.json").read_text())
    assert info["status"] == "KILLED" and "SIGTERM" in info["error"]

    failed = make_cfg("score", name="failed")
    with pytest.raises(ValueError), Stage(failed, "score") as st:
        run_id = st.tracking.run_id
        raise ValueError("a bug")
    assert MlflowClient().get_run(run_id).info.status == "FAILED"


def test_a_pipeline_run_stopped_from_outside_ends_killed(mlflow_uri: str) -> None:
    mlflow.set_experiment("stopped-pipeline")
    with (
        pytest.raises(KeyboardInterrupt),
        mlflow.start_run() as run,
        dead_runs.killed_when_stopped(),
    ):
        raise KeyboardInterrupt
    assert MlflowClient().get_run(run.info.run_id).info.status == "KILLED"
    with pytest.raises(RuntimeError), mlflow.start_run() as run, dead_runs.killed_when_stopped():
        raise RuntimeError("a bug")
    assert MlflowClient().get_run(run.info.run_id).info.status == "FAILED"


def test_sigterm_raises_in_its_block_and_puts_the_handler_back() -> None:
    """``saleval.errors.sigterm_raises``: SIGTERM raises ``Stopped`` (or the exception the
    caller makes of it) inside the block, the handler before it is back after, also when
    nested and when the block raised; off the main thread nothing is installed."""
    seen: list[int] = []

    def before(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, before)
    try:
        with pytest.raises(Stopped, match="SIGTERM"), sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is before
        with (
            pytest.raises(KeyboardInterrupt, match="15"),
            sigterm_raises(lambda n: KeyboardInterrupt(f"SIGTERM ({n})")),
        ):
            with sigterm_raises():
                pass  # an inner block puts the outer one's handler back
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is before
        inside: list[object] = []

        def elsewhere() -> None:
            with sigterm_raises():
                inside.append(signal.getsignal(signal.SIGTERM))

        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        assert inside == [before]
        os.kill(os.getpid(), signal.SIGTERM)  # outside every block: the handler before
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_is_turned_into_an_exception_in_one_place() -> None:
    """Every module that sets a signal handler: ``saleval.errors`` (``sigterm_raises``,
    which the SLURM job, the explain job and the annotation server use) and the tracking
    server's wrapper, which hands SIGTERM and SIGHUP on to ``mlflow server``, its child."""
    import ast

    import saleval

    src = Path(saleval.__file__).parent
    setters = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "signal"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "signal"
    )
    assert sorted(set(setters)) == ["errors.py", "scaleout/tracking_server.py"], setters


def test_slurm_job_tags_only_inside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    assert "slurm_job_id" not in dead_runs.process_tags()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "lab")
    tags = dead_runs.process_tags()
    assert (tags["slurm_job_id"], tags["slurm_cluster"]) == ("42", "lab")
    # a task of an array: the id squeue, scancel and the launcher's error line name
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert dead_runs.process_tags()["slurm_job_id"] == "41_2"
    monkeypatch.setenv("PATH", "/nonexistent")  # no squeue: nothing can be told
    assert slurm_state.job_states(["42"]) == {}


def _job(sweep: Path, idx: int, overrides: list[str], status: str | None) -> resume.Job:
    job = resume.Job(idx, overrides, sweep / str(idx))
    if status is not None:
        (job.dir / ".hydra").mkdir(parents=True)
        (job.dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides))
        (job.dir / "run.json").write_text(json.dumps({"status": status}))
    return job


def test_a_resubmitted_sweep_runs_only_its_unfinished_jobs(tmp_path: Path) -> None:
    done = _job(tmp_path, 0, ["seed=1"], "FINISHED")
    killed = _job(tmp_path, 1, ["seed=2"], "KILLED")
    never = _job(tmp_path, 2, ["seed=3"], None)
    pipeline = resume.Job(3, ["profile.dataset=sst2"], tmp_path / "3")
    pipeline.dir.mkdir()
    (pipeline.dir / "pipeline.json").write_text("{}")  # saleval-run's finished job
    todo, finished = resume.split([done, killed, never, pipeline])
    assert [j.idx for j in todo] == [1, 2]
    assert [j.idx for j in finished] == [0, 3]
    ret = resume.reused_return(done, "train")
    assert ret.return_value is None and ret.working_dir == str(done.dir)

    other = resume.Job(0, ["seed=7"], done.dir)
    with pytest.raises(resume.SweepDirError, match=r"holds job 0 of another sweep \(seed=1"):
        resume.split([other])


def test_jobs_have_dirs_only_where_hydra_numbers_them(tmp_path: Path) -> None:
    cfg = hydra_config([f"paths.output_root={tmp_path}", f"hydra.sweep.dir={tmp_path}/s"])
    jobs = resume.jobs_of(cfg, [["seed=1"], ["seed=2"]], 4)
    assert [(j.idx, j.dir) for j in jobs] == [(4, tmp_path / "s" / "4"), (5, tmp_path / "s" / "5")]
    own = hydra_config([f"paths.output_root={tmp_path}", "hydra.sweep.subdir=x${hydra.job.num}"])
    assert all(j.dir is None for j in resume.jobs_of(own, [["seed=1"]], 0))


SMALL_NODE = Partition("debug", memory_mb=4000, cpus=2, gpus=0, time_limit_min=60)
FITS = {"mem_gb": 1, "cpus_per_task": 1, "gpus_per_node": 0, "timeout_min": 30,
        "signal_delay_s": 120, "tasks_per_node": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        ({"mem_gb": 32}, "hydra.launcher.mem_gb=3 or less"),
        ({"cpus_per_task": 8}, "hydra.launcher.cpus_per_task=2 or less"),
        ({"tasks_per_node": 2, "cpus_per_task": 2}, "hydra.launcher.cpus_per_task=1 or less"),
        ({"gpus_per_node": 1}, "hydra.launcher.gpus_per_node=0 (or a partition with GPUs)"),
        ({"timeout_min": 240}, "hydra.launcher.timeout_min=60 or less"),
        ({"timeout_min": 2}, "set hydra.launcher.timeout_min above 3"),
    ],
)
def test_a_job_no_node_can_run_is_refused_naming_the_setting(change: dict, fix: str) -> None:
    check_resources(FITS, SMALL_NODE)  # fits: no error
    with pytest.raises(LauncherError) as err:
        check_resources({**FITS, **change}, SMALL_NODE)
    assert fix in str(err.value) and "\n" not in str(err.value)


def test_a_gpu_trainer_without_a_gpu_is_refused_in_one_line() -> None:
    gpu_trainer = GpuUse(1, "trainer=gpu")
    with pytest.raises(LauncherError) as err:
        check_resources(FITS, SMALL_NODE, gpu_trainer)  # gpus_per_node=0, no GPU there
    assert str(err.value) == (
        "partition 'debug' cannot run these jobs (its largest node: 4000 MB, 2 cores, no GPU,"
        " 60 min; each job's trainer=gpu takes 1 GPU): set trainer=cpu (or a partition with GPUs)"
    )
    gpu = Partition("gpu", memory_mb=512_000, cpus=64, gpus=8, time_limit_min=None)
    with pytest.raises(
        LauncherError, match=r"set hydra.launcher.gpus_per_node=1 \(or trainer=cpu\)"
    ):
        check_resources(FITS, gpu, gpu_trainer)  # a GPU partition, but none asked for
    check_resources({**FITS, "gpus_per_node": 1}, gpu, gpu_trainer)
    check_resources(FITS, SMALL_NODE, GpuUse())  # accelerator auto: runs on the CPU there


def _run_cfg(overrides: list[str]) -> DictConfig:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose("run", overrides=overrides, return_hydra_config=True)


def test_what_a_job_uses_is_read_from_its_config(tmp_path: Path) -> None:
    out = f"paths.output_root={tmp_path}"
    assert job_gpus(hydra_config([out])) == GpuUse()  # accelerator auto
    assert job_gpus(hydra_config([out, "trainer=cpu"])) == GpuUse()
    assert job_gpus(hydra_config([out, "trainer=gpu"])) == GpuUse(1, "trainer=gpu")
    assert job_gpus(hydra_config([out, "trainer=ddp", "trainer.devices=4"])) == GpuUse(
        4, "trainer=ddp"
    )
    # saleval-run: the trainer its profile gives a stage, composed as the pipeline does
    assert job_gpus(_run_cfg(["profile=smoke"])) == GpuUse()
    on_gpu = _run_cfg(
        ["profile=smoke", "profile.stages.train=['trainer=gpu','trainer.max_epochs=1']"]
    )
    assert job_gpus(on_gpu) == GpuUse(1, "profile stage train: trainer=gpu")
    # a sweep: a job whose own overrides change its trainer is composed with them
    base = hydra_config([out])
    loaded: list[list[str]] = []

    def load(cfg: DictConfig, overrides: list[str]) -> DictConfig:
        loaded.append(overrides)
        return hydra_config([out, *overrides])

    jobs = [["trainer=cpu", "seed=1"], ["trainer=gpu", "seed=1"], ["trainer=gpu", "seed=2"]]
    assert sweep_gpus(base, jobs, load) == GpuUse(1, "trainer=gpu")
    assert loaded == jobs[:2]  # once per distinct trainer; seed alone changes nothing
    assert sweep_gpus(base, [["seed=1"], ["seed=2"]], load) == GpuUse() and len(loaded) == 2


def test_gpus_and_unlimited_time_fit_a_gpu_partition() -> None:
    gpu = Partition("gpu", memory_mb=512_000, cpus=64, gpus=8, time_limit_min=None)
    check_resources({**FITS, "gpus_per_node": 8, "timeout_min": 10_000, "mem_gb": 256}, gpu)
    with pytest.raises(LauncherError, match="gpus_per_node=8 or less"):
        check_resources({**FITS, "gpus_per_node": 9}, gpu)


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated:UserWarning")
def test_the_launcher_configs_name_saleval_launchers(tmp_path: Path) -> None:
    out = f"paths.output_root={tmp_path}"
    slurm = hydra_config(["hydra/launcher=slurm", out]).hydra.launcher
    assert slurm._target_ == "hydra_plugins.saleval_launchers.SlurmLauncher"
    assert issubclass(get_class(slurm._target_), SlurmLauncher)
    ray = hydra_config(["hydra/launcher=ray", out]).hydra.launcher
    assert get_class(ray._target_).__mro__[1] is RayLauncher
    local = RayLauncher(**{k: v for k, v in ray.items() if k != "_target_"})
    assert local.init_args()["_node_ip_address"] == "127.0.0.1"  # loopback only
    joined = RayLauncher(
        **{**{k: v for k, v in ray.items() if k != "_target_"}, "address": "head:6379"}
    )
    assert joined.init_args() == {"address": "head:6379"}  # no sizes: Ray would refuse them


def test_missing_packages_skip_off_ci_naming_the_install_and_fail_on_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from saleval.scaleout import slurm_local
    from tests.scaleout_support import require

    monkeypatch.setattr(slurm_local, "_COMMANDS", {"no-such-slurmd": "slurmd"})
    reason = slurm_local.missing()
    assert reason is not None and "\n" not in reason
    assert reason.startswith("no-such-slurmd not found: apt-get install -y slurm-wlm munge")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y slurm-wlm munge"):
        require(reason)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run this test"):
        require(reason)
    require(None)  # nothing missing: runs


def test_the_tracking_server_drops_mlflows_two_notices_and_nothing_else() -> None:
    config = tracking_server.log_config()
    logging.config.dictConfig(config)
    auth = logging.getLogger("mlflow.server.auth")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    auth.addHandler(keep)
    try:
        auth.warning("This feature is still experimental and may change in a future release")
        auth.warning("permission denied for user x")  # a real warning still shows
    finally:
        auth.removeHandler(keep)
        auth.filters.clear()
    assert seen == ["permission denied for user x"]
    assert config["handlers"]["default"]["stream"] == "ext://sys.stderr"  # MLflow's own
    # the -W filter the server's processes inherit: MLflow's deprecated import only
    code = (
        "import warnings\n"
        "for msg, module in [('starlette.middleware.wsgi is deprecated and will be removed',"
        " 'mlflow.server.fastapi_app'), ('starlette.middleware.wsgi is deprecated', 'elsewhere'),"
        " ('another warning', 'mlflow.server.fastapi_app')]:\n"
        "    warnings.warn_explicit(msg, UserWarning, 'f.py', 1, module=module)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": tracking_server.STARLETTE_WARNING}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert shown.stderr.count("UserWarning") == 2 and "will be removed" not in shown.stderr


def test_a_ray_started_for_a_sweep_has_a_token_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    from saleval.scaleout.ray import ray_env

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    from ray._private import ray_constants, ray_logging

    monkeypatch.delenv("RAY_DISABLE_WORKER_LOG_PREFIX", raising=False)
    monkeypatch.delenv("RAY_DEDUP_LOGS", raising=False)
    monkeypatch.setattr(ray_constants, "RAY_DISABLE_WORKER_LOG_PREFIX", False)
    monkeypatch.setattr(ray_logging, "RAY_DEDUP_LOGS", True)
    with ray_env(local=True):
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
        # pytest's stdout is no terminal: the jobs' lines without colour and pid prefix
        assert os.environ["RAY_COLOR_PREFIX"] == "0"
        assert ray_constants.RAY_DISABLE_WORKER_LOG_PREFIX is True
        assert ray_logging.RAY_DEDUP_LOGS is False  # no merged repeats, in colour
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_COLOR_PREFIX" not in os.environ
    assert ray_constants.RAY_DISABLE_WORKER_LOG_PREFIX is False
    assert ray_logging.RAY_DEDUP_LOGS is True
    with ray_env(local=False):  # joining: the shell's token, or none
        assert "RAY_AUTH_MODE" not in os.environ
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's choice stands
    with ray_env(local=True):
        assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN" not in os.environ


def test_job_logs_lose_progress_bars_and_lightnings_requeue_notice() -> None:
    """Where stderr is a file (a SLURM job's .err), the weight-loading bars are off, and
    Lightning's SLURM requeue notice is below the level shown; in a process of its own."""
    code = (
        "import logging, os\n"
        "from saleval import cli\n"
        "cli.quiet_libraries()\n"
        "from transformers.utils import logging as hf\n"
        "name = 'lightning.pytorch.trainer.connectors.signal_connector'\n"
        "print(os.environ['HF_HUB_DISABLE_PROGRESS_BARS'], hf.is_progress_bar_enabled(),\n"
        "      logging.getLogger(name).getEffectiveLevel() == logging.WARNING)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["1", "False", "True"], done.stderr[-2000:]


def test_the_local_cluster_needs_no_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``sudo make slurm-local`` runs the module with the system's Python: standard library
    only (``-S``: no site-packages), and its stop hint is a command that works as printed."""
    from saleval.scaleout import slurm_local

    script = Path(slurm_local.__file__)
    done = subprocess.run([sys.executable, "-I", "-S", str(script), "--help"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "start" in done.stdout, done.stderr
    monkeypatch.setenv("MAKELEVEL", "1")
    monkeypatch.setenv("SUDO_USER", "me")
    assert slurm_local.stop_command(tmp_path / ".slurm-local") == "sudo make slurm-local-stop"
    monkeypatch.delenv("MAKELEVEL")
    monkeypatch.delenv("SUDO_USER")
    hint = slurm_local.stop_command(tmp_path / "c")
    assert hint.split() == [
        sys.executable,
        str(script.resolve()),
        "stop",
        "--dir",
        str(tmp_path / "c"),
    ]


def test_a_stopped_cluster_is_not_asked_anything(tmp_path: Path, monkeypatch) -> None:
    """With no ``slurmctld`` of the cluster running (no pid file, or one naming a process
    that ended) its state is '' and ``stop`` runs no ``scancel``, without spending SLURM's
    message timeout on a controller that is not there; a running one is asked."""
    from saleval.scaleout import slurm_local

    asked: list[str] = []

    def run(args, **kw):
        asked.append(Path(args[0]).name)
        return subprocess.CompletedProcess(args, 0, stdout="idle\n", stderr="")

    monkeypatch.setattr(slurm_local.subprocess, "run", run)
    cluster = slurm_local.LocalCluster(tmp_path)
    cluster._write()
    assert cluster.node_state() == "" and (cluster.stop() or asked == [])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    (tmp_path / "slurmctld.pid").write_text(f"{ended.pid}\n")
    assert cluster.node_state() == "" and (cluster.stop() or asked == [])
    (tmp_path / "slurmctld.pid").write_text(f"{os.getpid()}\n")  # a live process
    assert cluster.node_state() == "idle" and asked == ["sinfo"]
    monkeypatch.setattr(slurm_local, "_kill_pidfile", lambda path: None)  # not this process
    cluster.stop()
    assert asked == ["sinfo", "scancel"]


def test_two_jobs_logging_the_same_split_at_once_both_succeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The jobs of a sweep on one server log the same dataset split at the same moment;
    the store's check-then-insert makes one of them break the dataset's unique key (seen
    on PostgreSQL, walking docs/scale-out.md). The loser logs again and links the row."""
    from mlflow.exceptions import MlflowException

    from saleval.pipeline.tracker import tracking_models

    calls: list[str] = []
    race = "(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint"

    def log_input(dataset: object, context: str) -> None:
        calls.append(context)
        if len(calls) == 1:
            raise MlflowException(f'BAD_REQUEST: {race} "dataset_pk"')

    monkeypatch.setattr(mlflow, "log_input", log_input)
    df = pd.DataFrame({"sample_id": ["a"], "text": ["t"], "label": [0]})
    tracking_models.log_dataset(df, "ag_news/train", "train")
    assert calls == ["train", "train"]

    def broken(dataset: object, context: str) -> None:
        raise MlflowException("RESOURCE_DOES_NOT_EXIST: no such run")

    monkeypatch.setattr(mlflow, "log_input", broken)
    with pytest.raises(MlflowException, match="no such run"):  # any other error stands
        tracking_models.log_dataset(df, "ag_news/train", "train")
