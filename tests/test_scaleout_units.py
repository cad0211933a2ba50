"""The parts of the SLURM and Ray launchers that need no cluster (docs/scale-out.md): they
run everywhere, also where ``tests/test_slurm.py`` and ``tests/test_ray.py`` skip.

* a stage stopped from outside (``saleval.errors.Stopped``: scancel's SIGTERM) ends its run
  KILLED, in MLflow and ``run.json``, and so does a pipeline run;
* which jobs of a sweep dir finished, and a sweep dir of another sweep refused;
* the resource check's one line for each setting, and a limit the warning signal eats;
* the launcher configs compose to saleval's launchers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from hydra.utils import get_class
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from saleval.errors import Stopped
from saleval.pipeline import dead_runs, slurm_state
from saleval.pipeline.stage import Stage
from saleval.scaleout import resume
from saleval.scaleout.ray import RayLauncher
from saleval.scaleout.slurm import LauncherError, Partition, SlurmLauncher, check_resources
from tests.test_scaleout import _hydra_cfg


def test_a_stage_stopped_from_outside_ends_killed_not_failed(
    make_cfg: Callable[..., DictConfig],
) -> None:
    cfg = make_cfg("score", name="stopped")
    with pytest.raises(Stopped), Stage(cfg, "score") as st:
        run_id = st.run_id
        raise Stopped("SLURM sent SIGTERM (scancel or preemption)")
    assert run_id is not None
    assert MlflowClient().get_run(run_id).info.status == "KILLED"
    info = json.loads((Path(cfg.run_dir) / "run.json").read_text())
    assert info["status"] == "KILLED" and "SIGTERM" in info["error"]

    failed = make_cfg("score", name="failed")
    with pytest.raises(ValueError), Stage(failed, "score") as st:
        run_id = st.run_id
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


def test_slurm_job_tags_only_inside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "slurm_job_id" not in dead_runs.process_tags()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "lab")
    tags = dead_runs.process_tags()
    assert (tags["slurm_job_id"], tags["slurm_cluster"]) == ("42", "lab")
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
    cfg = _hydra_cfg([f"paths.output_root={tmp_path}", f"hydra.sweep.dir={tmp_path}/s"])
    jobs = resume.jobs_of(cfg, [["seed=1"], ["seed=2"]], 4)
    assert [(j.idx, j.dir) for j in jobs] == [(4, tmp_path / "s" / "4"), (5, tmp_path / "s" / "5")]
    own = _hydra_cfg([f"paths.output_root={tmp_path}", "hydra.sweep.subdir=x${hydra.job.num}"])
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


def test_gpus_and_unlimited_time_fit_a_gpu_partition() -> None:
    gpu = Partition("gpu", memory_mb=512_000, cpus=64, gpus=8, time_limit_min=None)
    check_resources({**FITS, "gpus_per_node": 8, "timeout_min": 10_000, "mem_gb": 256}, gpu)
    with pytest.raises(LauncherError, match="gpus_per_node=8 or less"):
        check_resources({**FITS, "gpus_per_node": 9}, gpu)


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated:UserWarning")
def test_the_launcher_configs_name_saleval_launchers(tmp_path: Path) -> None:
    out = f"paths.output_root={tmp_path}"
    slurm = _hydra_cfg(["hydra/launcher=slurm", out]).hydra.launcher
    assert slurm._target_ == "hydra_plugins.saleval_launchers.SlurmLauncher"
    assert issubclass(get_class(slurm._target_), SlurmLauncher)
    ray = _hydra_cfg(["hydra/launcher=ray", out]).hydra.launcher
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
