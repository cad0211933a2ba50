"""``hydra/launcher=ray``: each job of a sweep as a Ray task, on this machine or a cluster.

Written on Ray's public API (``ray.init``, ``ray.remote``, ``ray.get``) rather than taken
from ``hydra-ray-launcher``, whose last release requires ``cloudpickle<3``: installing it
would downgrade the cloudpickle MLflow uses (docs/scale-out.md, *Ray*).

``hydra.launcher.address`` picks where the jobs run:

* ``null`` (default): a Ray instance started for the sweep on this machine and stopped
  after it, sized by ``hydra.launcher.local`` (cores, object store);
* ``auto`` or ``<head>:6379``: an existing cluster (``ray start --head`` on its head
  node). Ray refuses resource arguments when it joins a cluster
  (``ValueError: When connecting to an existing cluster, object_store_memory must not be
  provided``), so the ``local`` settings are never passed then; the cluster's own sizes
  hold.

Each job runs in a Ray worker process of its own (``num_cpus``/``num_gpus`` per job), with
the launching shell's ``MLFLOW_*``, ``SALEVAL_*``, ``HF_*`` variables, writes
``<sweep dir>/<job number>`` and its own MLflow run tagged ``sweep``/``sweep.job``.
Resubmitting into the same sweep dir reruns only the jobs that did not finish
(:mod:`saleval.scaleout.resume`). A job whose trainer takes more GPUs than ``num_gpus``
reserves is refused before anything runs (:mod:`saleval.scaleout.needs`).

Ray 2.5x authenticates every connection with a token. Joining a cluster needs its token
in the launching shell (``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``, as given to
``ray start``); a shell without it, or with another, is refused by the cluster once a
second for 20 s in Ray's own log: :func:`probe` asks once, with that log kept off the
terminal, and turns a refusal into one line. The Ray started here for one sweep gets a
token of its own in the environment, so Ray neither warns that it turned authentication
on nor writes ``~/.ray/auth_token`` (which a later join would read instead of the
cluster's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval.scaleout import resume
from saleval.scaleout.needs import GpuUse, sweep_gpus
from saleval.scaleout.resume import LauncherError, one_line_errors

log = logging.getLogger(__name__)

#: environment variables a job takes from the launching shell (a joined cluster's
#: workers do not inherit it)
_PASS_ENV = ("MLFLOW_", "SALEVAL_", "HF_", "TOKENIZERS_", "OMP_NUM_THREADS", "PYTHONPATH")
#: ...except a credential: Ray keeps a job's runtime environment (its GCS, its logs), so a
#: password or token reaches the jobs through a file of mode 600 instead
#: (``~/.mlflow/credentials``, docs/scale-out.md#4-one-tracking-server)
_SECRET_ENV = ("PASSWORD", "TOKEN", "SECRET", "_KEY")


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a Ray job takes from the launching shell: :data:`_PASS_ENV`, no credential.

    >>> job_environment({"MLFLOW_TRACKING_URI": "http://h:5000", "HF_TOKEN": "t",
    ...                  "MLFLOW_TRACKING_PASSWORD": "p", "HOME": "/root"})
    {'MLFLOW_TRACKING_URI': 'http://h:5000'}
    """
    return {
        k: v
        for k, v in environ.items()
        if k.startswith(_PASS_ENV) and not any(s in k.upper() for s in _SECRET_ENV)
    }


def _execute(
    idx: int,
    overrides: Sequence[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> JobReturn:
    """One job in a Ray worker: Hydra's run of it, as the joblib launcher does."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block: Ray's C++ client logs there, not
    through Python."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def probe(address: str) -> None:
    """Ask the cluster at ``address`` once whether it takes this shell's token, before
    ``ray.init`` would retry (module docstring); a refusal, or no cluster answering, is a
    :class:`LauncherError` naming the fix. Ray Client addresses (``ray://``) are left to
    ``ray.init``."""
    if address.startswith("ray://"):
        return
    from ray._private.services import canonicalize_bootstrap_address
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.exceptions import AuthenticationError, RayError

    try:
        where = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):  # "auto" with none found; not host:port
        where = None
    if where is None:
        raise LauncherError(
            f"hydra.launcher.address={address}: no Ray cluster found on this machine "
            "(start one with ray start --head, or give its <head>:<port>)"
        )
    try:
        with _quiet_stderr():
            GcsClient(address=where)
    except AuthenticationError:
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        has = "set" if os.environ.get("RAY_AUTH_TOKEN") else "unset"
        raise LauncherError(
            f"the Ray cluster at {where} refuses this shell's token (RAY_AUTH_MODE {mode}, "
            f"RAY_AUTH_TOKEN {has}): export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the "
            "token its head was started with> (docs/scale-out.md, Ray)"
        ) from None
    except RayError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LauncherError(
            f"no Ray cluster answers at {where} ({first}): is ray start --head running there?"
        ) from None


def check_gpus(use: GpuUse, num_gpus: float) -> None:
    """Refuse, in one line, jobs whose trainer takes more GPUs than each reserves (Ray
    would start them where it gives them none, and they would crash there).

    >>> check_gpus(GpuUse(1, "trainer=gpu"), 1)
    >>> check_gpus(GpuUse(1, "trainer=gpu"), 0)
    Traceback (most recent call last):
    ...
    saleval.scaleout.resume.LauncherError: each job's trainer=gpu takes 1 GPU but Ray reserves hydra.launcher.num_gpus=0: set hydra.launcher.num_gpus=1 (or trainer=cpu)
    """
    if use.gpus > num_gpus:
        raise LauncherError(
            f"each job's {use.what} takes {use.gpus} GPU but Ray reserves "
            f"hydra.launcher.num_gpus={num_gpus:g}: set hydra.launcher.num_gpus={use.gpus} "
            "(or trainer=cpu)"
        )


@contextlib.contextmanager
def ray_env(local: bool) -> Iterator[None]:
    """The environment of the sweep's Ray driver: when its output goes to a file (not a
    terminal), the jobs' lines as they printed them, without Ray's colour codes,
    ``(_execute pid=...)`` prefixes and merged repeats; and for a Ray started here (``local``) a token of its
    own unless the shell chose an authentication mode (module docstring)."""
    added = {}
    if local and "RAY_AUTH_MODE" not in os.environ:
        added = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    plain = not sys.stdout.isatty()
    if plain and "RAY_COLOR_PREFIX" not in os.environ:
        added["RAY_COLOR_PREFIX"] = "0"
    os.environ.update(added)
    _reread_auth_mode(added)
    restore = _worker_log_prefix(shown=not plain)
    try:
        yield
    finally:
        restore()
        for key in added:
            os.environ.pop(key, None)
        _reread_auth_mode(added)


def _worker_log_prefix(shown: bool) -> Callable[[], None]:
    """Have ``ray.init`` print the jobs' lines with Ray's ``(<task> pid=...)`` prefix and
    its merging of repeated lines (``[repeated 2x across cluster]``, in colour), or, not
    ``shown``, as the jobs printed them; returns what undoes it. Ray reads
    ``RAY_DISABLE_WORKER_LOG_PREFIX`` and ``RAY_DEDUP_LOGS`` once, when imported, so the
    constants it read are set (each left alone when the shell set its variable)."""
    from ray._private import ray_constants, ray_logging

    wanted = [
        (ray_constants, "RAY_DISABLE_WORKER_LOG_PREFIX", not shown),
        (ray_logging, "RAY_DEDUP_LOGS", shown),
    ]
    before = [(m, name, getattr(m, name)) for m, name, _ in wanted]
    for module, name, value in wanted:
        if name not in os.environ:
            setattr(module, name, value)

    def restore() -> None:
        for module, name, value in before:
            setattr(module, name, value)

    return restore


def _reread_auth_mode(changed: dict[str, str]) -> None:
    """Ray's core reads ``RAY_AUTH_MODE`` once, when imported: after changing it, have it
    read again (what Ray does itself when it turns authentication on)."""
    if "RAY_AUTH_MODE" in changed:
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")


def _mapping(node: Any) -> dict[str, Any]:
    """A config node (or a plain mapping, or None) as a plain dict of str keys."""
    if node is None:
        return {}
    plain: Any = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
    return {str(k): v for k, v in dict(plain).items()}


class RayLauncher(Launcher):
    """The launcher of the module docstring; Hydra finds it as
    ``hydra_plugins.saleval_launchers.RayLauncher``."""

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float = 1,
        num_gpus: float = 0,
        local: Any = None,
        init: Any = None,
    ) -> None:
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.local, self.init = _mapping(local), _mapping(init)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def init_args(self) -> dict[str, Any]:
        """``ray.init``'s arguments: the address alone when joining a cluster (module
        docstring), the ``local`` sizes when starting one here; ``init`` in both cases.

        >>> RayLauncher(local={"object_store_memory": 10**8, "num_cpus": 2}).init_args()
        {'num_cpus': 2, 'object_store_memory': 100000000, 'include_dashboard': False}
        >>> RayLauncher(address="auto", local={"object_store_memory": 10**8}).init_args()
        {'address': 'auto'}
        """
        if self.address:
            return {"address": str(self.address), **self.init}
        sizes = {k: v for k, v in sorted(self.local.items()) if v is not None}
        return {**sizes, "include_dashboard": False, **self.init}

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.config is not None
        with one_line_errors(str(self.config.hydra.job.name)):
            return self._launch(job_overrides, initial_job_idx)

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        import ray
        from hydra.core.singleton import Singleton
        from hydra.core.utils import configure_log, filter_overrides, setup_globals

        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        check_gpus(
            sweep_gpus(
                self.config, job_overrides, self.hydra_context.config_loader.load_sweep_config
            ),
            self.num_gpus,
        )
        jobs = resume.jobs_of(self.config, job_overrides, initial_job_idx)
        todo, done = resume.split(jobs)
        resume.end_dead_runs(self.config)
        returns: dict[int, Any] = {
            j.idx: resume.reused_return(j, str(self.config.hydra.job.name)) for j in done
        }
        for job in done:
            log.info("\t#%d : finished already in %s: not run again", job.idx, job.dir)
        if todo:
            env = job_environment(os.environ)
            started = not ray.is_initialized()
            stack = contextlib.ExitStack()
            if started:
                args = self.init_args()
                runtime_env = dict(args.pop("runtime_env", None) or {})
                runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
                if self.address:
                    probe(str(self.address))
                stack.enter_context(ray_env(local=not self.address))
                ray.init(**args, runtime_env=runtime_env)
            log.info("Ray sweep output dir : %s (%s)", sweep_dir, self.address or "local")
            try:
                task = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(
                    _execute
                )
                state = Singleton.get_state()
                refs = []
                for job in todo:
                    log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
                    refs.append(
                        task.remote(
                            job.idx,
                            job.overrides,
                            self.hydra_context,
                            self.config,
                            self.task_function,
                            state,
                        )
                    )
                lost = []
                for job, ref in zip(todo, refs):
                    try:
                        returns[job.idx] = ray.get(ref)
                    except ray.exceptions.RayError as err:  # its worker or node died
                        lost.append(
                            f"job {job.idx} ({' '.join(job.overrides)}): {type(err).__name__}"
                        )
                if lost:
                    resume.end_dead_runs(self.config, before_submit=False)
                    raise LauncherError(
                        f"{'; '.join(lost)}: Ray lost it before it finished. Rerun only the "
                        f"unfinished jobs: the same command with hydra.sweep.dir={sweep_dir}"
                    )
            finally:
                if started:
                    ray.shutdown()
                stack.close()
        return [returns[j.idx] for j in jobs]
