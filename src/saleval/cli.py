"""The console scripts ``saleval-<stage>``: quick to answer, self-describing, quiet on user errors.

Each script (``pyproject.toml``) is a function here, one per row of
:data:`saleval.pipeline.stage_table.TABLE`, that composes the stage's config with Hydra and imports
the stage module (whose ``run(cfg)`` does the work) only once the job starts, so
``--help`` and ``--cfg job`` answer without loading torch, Lightning, transformers or
MLflow. ``--help`` shows the stage module's docstring (what the stage
reads, writes, its main options and an example; read from the source file, not imported)
above Hydra's lists of config groups and the composed config (the ``help`` node of
``conf/hydra/default.yaml``).

A :class:`saleval.errors.UserError` raised by a stage (or a required key left unset), a
full disk and a tracking store that fails (docs/tracking.md, *When the tracking server
fails*) end the job with one line on stderr that says what to fix, exit status 2; with
``HYDRA_FULL_ERROR=1`` it keeps its traceback, like any other exception. In a ``-m``
multirun the failing job's line is reported by Hydra once the sweep ends, as before.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, ValidationError

from saleval import paths
from saleval.errors import EXIT_USER_ERROR, UserError
from saleval.pipeline import stage_table

#: each console script's stage -> the module whose ``run(cfg)`` it calls (its config:
#: ``conf/<stage>.yaml``); read from :data:`saleval.pipeline.stage_table.TABLE`
STAGES: dict[str, str] = {s.name: s.module for s in stage_table.TABLE}

#: the errors a user fixes from the message alone: one line, no traceback
EXPECTED: tuple[type[BaseException], ...] = (UserError, MissingMandatoryValue, ValidationError)

HELP_RESOLVER = "saleval.help"


def register_resolvers() -> None:
    """The ``${saleval.*:}`` resolvers the configs use: the places (:mod:`saleval.paths`)
    and the help text of a stage; idempotent."""
    paths.register_resolvers()
    if not OmegaConf.has_resolver(HELP_RESOLVER):
        # Hydra fills the help template with string.Template: a literal $ must be doubled
        OmegaConf.register_new_resolver(HELP_RESOLVER, lambda s: stage_help(s).replace("$", "$$"))


register_resolvers()

# conf/hydra/launcher/joblib.yaml replaces the joblib plugin's config of the same name (to
# set a sensible n_jobs) and lists every field, so Hydra's deprecated merge with the
# plugin's schema of that name is harmless; its warning on every multirun job is noise.
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema"
)


def stage_help(stage: str) -> str:
    """The help text of ``saleval-<stage>``: its module's docstring, as plain text.

    Read with :mod:`ast` from the source, so asking for help imports none of the stage's
    libraries. reST markup is dropped (````x```` becomes ``x``, a ``::`` that opens an example
    becomes ``:``).

    >>> print(stage_help("simulate").splitlines()[0])  # doctest: +ELLIPSIS
    saleval-simulate: a SIMULATED crowd answers a task run's bundles...
    """
    try:
        spec = importlib.util.find_spec(STAGES.get(stage, stage))
    except (ImportError, ValueError):  # a config's task_name that names no module
        spec = None
    if spec is None or spec.origin is None:
        return f"saleval-{stage}"
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or f"saleval-{stage}"
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)  # :mod:`x` -> x
    doc = doc.replace("``", "")
    return re.sub(r"(?<=\S)::$", ":", doc, flags=re.M).replace("\n::\n", "\n")


def one_line(err: BaseException) -> str:
    """An expected error as one line: its message, or for an unset required key the fix.

    >>> from omegaconf import OmegaConf
    >>> try:
    ...     OmegaConf.create({"inputs": {"crowd": "???"}}).inputs.crowd
    ... except Exception as err:
    ...     print(one_line(err))
    inputs.crowd is required: pass inputs.crowd=<value> (--help says what it takes)
    """
    if isinstance(err, MissingMandatoryValue) and err.full_key:
        key = err.full_key
        return f"{key} is required: pass {key}=<value> (--help says what it takes)"
    if isinstance(err, ValidationError):
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"{err.full_key}: {text}" if err.full_key else text
    return " ".join(str(err).split()) or type(err).__name__


def full_error() -> bool:
    """``HYDRA_FULL_ERROR=1``: show every traceback (Hydra's own switch, read as Hydra does)."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


class JobFailed(CompactHydraException):
    """An expected error in one job of a multirun: Hydra reports its one line (no traceback)
    when the sweep ends, and the other jobs still run."""


def _multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def quiet_libraries() -> None:
    """Lightning's info lines restate the config (devices available, limits at their
    defaults, the seed) or advertise its cloud products; its warnings still show.

    Lightning's ``lightning`` logger has its own console handler and also propagates to the
    root logger, which a Hydra app gives a console handler too: every line came twice.
    The loggers are set before Lightning is imported (the stages import it lazily).

    In a SLURM job, every Trainer says "SLURM auto-requeueing enabled" (Lightning's
    requeue-on-SIGUSR1, a signal Submitit never sends: it warns with SIGUSR2 and requeues
    itself, docs/scale-out.md). Where stderr is a file (a SLURM job's ``.err``, a Ray
    worker, a redirected run), transformers', huggingface_hub's and MLflow's progress bars
    (loading and writing weights, moving artifacts) are off: a file keeps every redraw of them as one long line.
    ``HF_HUB_DISABLE_PROGRESS_BARS=0`` turns them back on.
    """
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.fabric.utilities.seed",
        "lightning.pytorch.trainer.connectors.signal_connector",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not _isatty(sys.stderr):
        # read by huggingface_hub (and through it transformers) when imported
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # MLflow's artifact upload and download bars (a catch-up, a logged model), likewise
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # imported already: its flag is set
    logging.getLogger("lightning").propagate = False
    # urllib3 warns once per retry of an MLflow request to a server that does not answer;
    # saleval says it once (docs/tracking.md, "When the tracking server fails")
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    # MLflow sets its logger's level when imported (the stages import it lazily): its switch
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # raised inside Lightning on torch >= 2.9; nothing a user of saleval can change
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # on a SLURM login node (or beside `make slurm-local`) a stage run directly, not in a
    # job, is what the user meant: Lightning's hint to prepend `srun` is noise there
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed
        return False


def expected_line(err: BaseException) -> str | None:
    """The one line a job ends with for ``err`` (None: a bug, whose traceback is shown): a
    user error, a full disk (:func:`disk_full`), or a tracking store that failed
    (:func:`saleval.pipeline.tracker.tracking_health.failure_message`)."""
    if isinstance(err, EXPECTED):
        return one_line(err)
    if isinstance(err, OSError) and disk_full(err) is not None:
        return disk_full(err)
    if "mlflow" not in sys.modules:  # nothing talked to a store
        return None
    import mlflow

    from saleval.pipeline.tracker import tracking_health

    return tracking_health.failure_message(err, mlflow.get_tracking_uri())


def secret_in_command_line(overrides: list[str]) -> str | None:
    """The line refusing a password in an override's URL or in ``MLFLOW_TRACKING_URI``
    (:mod:`saleval.pipeline.tracker.tracking_health`), checked before Hydra writes the overrides
    into ``.hydra/`` or a sweep's ``multirun.yaml``.

    >>> print(secret_in_command_line(["seed=1", "tracking.uri=http://u:pw@h:5000"])[:53])
    tracking.uri=http://u:***@h:5000 holds a password, wh
    """
    from saleval.pipeline.tracker import tracking_health

    items = ((o.partition("=")[0].lstrip("+~"), o.partition("=")[2]) for o in overrides)
    return tracking_health.environment_problem() or tracking_health.first_secret(items)


def refuse_secrets(cfg: DictConfig, scrub: bool = False) -> None:
    """Refuse a composed config any of whose settings holds a password (from a YAML file,
    or an environment variable it reads); ``scrub``: Hydra has already written its files
    for this job, so the password is taken out of them first."""
    from saleval.pipeline.tracker import tracking_health

    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception:  # an interpolation that fails is reported by what reads it
        plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict)
    ordered = {k: v for k, v in plain.items() if k != "hydra"} | {"hydra": plain.get("hydra")}
    problem = tracking_health.first_secret(tracking_health.leaves(ordered))  # hydra.* last
    if problem is None:
        return
    if scrub:
        _scrub_hydra_files()
    raise tracking_health.TrackingError(problem)


def _remove_stub(cfg: DictConfig) -> None:
    """A run refused before its stage started leaves no dir of Hydra's files behind
    (:func:`saleval.pipeline.records.run_outputs.remove_stub`); a ``-m`` job's dir stays, the
    sweep's record of that job (its log holds the line)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from saleval.pipeline.records.run_outputs import remove_stub

    if HydraConfig.initialized() and not _multirun():
        root = OmegaConf.select(cfg, "paths.output_root", default=None)
        remove_stub(Path(HydraConfig.get().runtime.output_dir), root)


def _scrub_hydra_files() -> None:
    """Take passwords out of the files Hydra wrote for this job (``.hydra/*.yaml``, a
    sweep's ``multirun.yaml``)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from saleval.pipeline.tracker import tracking_health

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    files = list(Path(hc.runtime.output_dir, hc.output_subdir or ".hydra").glob("*.yaml"))
    if _multirun():
        files.append(Path(hc.sweep.dir, "multirun.yaml"))
    for path in files:
        if path.is_file():
            text = path.read_text()
            if tracking_health.redact(text) != text:
                path.write_text(tracking_health.redact(text))


def disk_full(err: OSError) -> str | None:
    """The one line for a full disk (or quota), None for any other OS error.

    >>> print(disk_full(OSError(28, "No space left on device", "/o/explain/attributions.parquet")))
    no space left on device writing /o/explain/attributions.parquet: free space there (or set paths.output_root to another disk) and rerun; the files the run wrote before are kept whole
    """
    import errno

    if err.errno not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in str(err):
        return None
    what = "quota exceeded" if err.errno == errno.EDQUOT else "no space left on device"
    where = f" writing {err.filename}" if err.filename else ""
    return (
        f"{what}{where}: free space there (or set paths.output_root to another disk) and "
        "rerun; the files the run wrote before are kept whole"
    )


def lazy_run(module: str) -> Callable[[DictConfig], Any]:
    """``module``'s ``run``, imported on the first call."""

    def run(cfg: DictConfig) -> Any:
        return importlib.import_module(module).run(cfg)

    return run


def hydra_main(config_name: str, run: Callable[[DictConfig], Any]) -> Callable[[], Any]:
    """Wrap ``run`` as a console script whose config is ``conf/<config_name>.yaml``.

    Nothing happens until the script is called: building one imports nothing.
    """

    def task(cfg: DictConfig) -> Any:
        from saleval.config.keys import check_keys
        from saleval.pipeline.records.input_paths import check_input_paths

        quiet_libraries()
        try:
            check_keys(
                cfg
            )  # a key added with `+` (also under -m, where compose_or_exit is not used)
            refuse_secrets(cfg, scrub=True)  # e.g. a password in a YAML file's tracking.uri
            check_input_paths(cfg)  # a path that is not there, before the stage imports anything
            result = run(cfg)
        except Exception as err:
            line = None if full_error() else expected_line(err)
            if line is None:
                raise
            message = f"saleval-{config_name}: {line}"
            _remove_stub(cfg)
            if _multirun():
                raise JobFailed(message) from err
            print(message, file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from None
        if isinstance(result, dict) and "objective" in result:
            return result["objective"]  # what a Hydra sweeper optimises
        return None

    @functools.wraps(run)
    def main() -> Any:
        import hydra

        from saleval.pipeline.compose import register_configs, search_path_override

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        args = sys.argv[1:]
        overrides = [a for a in args if not a.startswith("-") and "=" in a]
        secret = secret_in_command_line(overrides)  # before Hydra writes any file
        if secret:
            print(f"saleval-{config_name}: {secret}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR)
        try:  # a module metrics.plugins names registers first: its settings compose
            register_configs([*search_path_override(args), *overrides], config_name)
        except ValueError as err:  # that module cannot be imported
            if full_error():
                raise
            print(f"saleval-{config_name}: {err}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from None
        wants_help = any(a in HELP_FLAGS for a in args)
        # a command line of overrides only (no other flag: --config-dir, -m, --cfg...) is
        # composed here first: for --help, and so a bad override is one line (Hydra's own
        # report spans several); anything else goes to Hydra unchanged
        if all(a in HELP_FLAGS or not a.startswith("-") for a in args) and (
            wants_help or not full_error()
        ):
            cfg = compose_or_exit(config_name, [a for a in args if a not in HELP_FLAGS])
            if wants_help:
                try:
                    print(render_help(cfg))
                except BrokenPipeError:  # `--help | head`: the reader has seen enough
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return None
        app = hydra.main(
            config_path=str(paths.conf_dir()), config_name=config_name, version_base="1.3"
        )(task)
        return app()

    return main


HELP_FLAGS = ("--help", "-h")


def config_groups(hydra_groups: bool = False) -> str:
    """``group: option, ...`` per line for the config groups under ``conf/`` (Hydra's
    ``$APP_CONFIG_GROUPS``, or with ``hydra_groups`` its ``$HYDRA_CONFIG_GROUPS``), read from
    the directory tree: Hydra's own listing copies its config store once per group, seconds.
    """
    root = paths.conf_dir()
    lines = []
    for d in sorted(p for p in root.rglob("*") if p.is_dir()):
        group = d.relative_to(root).as_posix()
        options = sorted(f.stem for f in d.glob("*.yaml"))
        if options and (group.split("/")[0] == "hydra") == hydra_groups:
            lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines) + "\n"


def compose_or_exit(config_name: str, overrides: list[str]) -> DictConfig:
    """The config a command line composes (with its ``hydra`` node), or one line on stderr
    and exit status 2 when it does not compose (an unknown key, also one added with ``+``:
    :mod:`saleval.config.keys`; a bad value, a missing option) or an ``inputs.*`` path is
    not there (:mod:`saleval.pipeline.records.input_paths`), unless ``HYDRA_FULL_ERROR=1``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from saleval.config.keys import UnknownKeyError, check_keys
    from saleval.pipeline.records.input_paths import InputError, check_input_paths

    try:
        with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        check_keys(cfg)
        refuse_secrets(cfg)  # before Hydra writes the config anywhere
        check_input_paths(cfg)  # before Hydra makes a run dir
        return cfg
    except (
        HydraException, OmegaConfBaseException, UnknownKeyError, InputError, UserError
    ) as err:  # fmt: skip
        if full_error():
            raise
        print(f"saleval-{config_name}: {composition_error(err)}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None


#: OmegaConf's detail lines under an error message
_DETAIL = re.compile(r"\s*(full_key|object_type|reference_type)\s*[:=]")


def composition_error(err: BaseException) -> str:
    """Hydra's composition error and its causes as one line, without OmegaConf's
    ``full_key:``/``object_type=`` detail lines (the message names the key already).

    >>> from omegaconf import OmegaConf
    >>> cfg = OmegaConf.create({"a": 1}); OmegaConf.set_struct(cfg, True)
    >>> try:
    ...     cfg.merge_with({"b": 2})
    ... except Exception as err:
    ...     print(composition_error(err))
    Key 'b' is not in struct
    """
    parts: list[str] = []
    e: BaseException | None = err
    while e is not None and len(parts) < 4:
        lines = [
            line.strip() for line in str(e).splitlines() if line.strip() and not _DETAIL.match(line)
        ]
        text = " ".join(lines).split(" Config search path:")[0]  # Hydra's dirs: noise
        if text and text not in parts:
            parts.append(text)
        e = e.__cause__
    return "; ".join(parts) or type(err).__name__


def render_help(cfg: DictConfig) -> str:
    """``--help`` from ``hydra.help.template`` filled as Hydra fills it, but from one
    composition: Hydra's own ``--help`` lists the config groups by composing once per group
    (seconds); :func:`config_groups` reads them from the directory tree."""
    import string

    from hydra._internal.utils import get_args_parser
    from omegaconf import open_dict

    template = str(cfg.hydra.help.template)
    with open_dict(cfg):
        del cfg["hydra"]
    flags = get_args_parser()
    return string.Template(template).substitute(
        FLAGS_HELP="\n".join(
            f"{','.join(a.option_strings)} : {a.help}" for a in flags._actions if a.option_strings
        ),
        HYDRA_CONFIG_GROUPS=config_groups(hydra_groups=True),
        APP_CONFIG_GROUPS=config_groups(),
        CONFIG=OmegaConf.to_yaml(cfg),
    )


def _script(stage: str) -> Callable[[], Any]:
    main = hydra_main(stage, lazy_run(STAGES[stage]))
    main.__name__ = main.__qualname__ = stage
    return main


def __getattr__(name: str) -> Callable[[], Any]:
    """The console scripts: ``saleval.cli:<attr>`` of each row of the stage table
    (``pyproject.toml`` names them; ``tests/test_stage_table.py`` checks it agrees),
    built on first use and kept."""
    for row in stage_table.TABLE:
        if row.attr == name:
            main = _script(row.name)
            globals()[name] = main
            return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
