"""The console scripts' manners: a --help that says what a stage reads and writes, module
imports that leave torch alone, one line for a user's error, and quiet Lightning.

Each script is run as pip's launcher runs it (``from saleval.cli import <name>``, called
with the command line), in a subprocess, so the installed copy of the scripts is not what
is tested.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import importlib.util
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from saleval import cli
from tests.cli_support import ROOT, SCRIPTS, environment, script, script_code
from tests.conftest import compose_config

#: a file (or dir) each stage writes, as its help must name it
WRITES = {
    "train": ["model/", "metrics.json"],
    "explain": ["attributions.parquet", "predictions.parquet"],
    "tasks": ["tasks.csv", "bundles.csv"],
    "simulate": ["answers.csv", "workers.csv"],
    "annotate": ["answers.csv"],
    "import": ["annotations.parquet", "aggregated.csv"],
    "score": ["scores.csv", "accuracy.csv"],
    "metrics": ["metrics.csv", "metrics_per_example.parquet"],
    "compare": ["comparison.csv", "comparison.md"],
    "shortcut": ["shortcut_results.csv"],
    "run": ["pipeline.json"],
    "report": ["report.csv", "report_correlations.csv"],
    "plan": ["plan.csv", "plan.md", "power.png"],
}
LIGHTNING_CHATTER = ("Tip:", "GPU available", "TPU available", "HPU available", "was configured")


def scratch(tmp_path: Path) -> list[str]:
    """Overrides that keep run dirs and the MLflow store out of the repository."""
    return [f"paths.output_root={tmp_path / 'out'}", f"tracking.uri=sqlite:///{tmp_path}/ml.db"]


def test_every_script_is_a_stage_of_saleval_cli() -> None:
    """...or one of the tools that are not stages (``saleval-catch-up``)."""
    from tests.cli_support import TOOLS

    stages = {k: v for k, v in SCRIPTS.items() if k not in TOOLS}
    assert set(stages) == {f"saleval-{s}" for s in cli.STAGES}
    for name, target in stages.items():
        module, attr = target.split(":")
        assert module == "saleval.cli", name
        assert callable(getattr(cli, attr)), name
    for module in cli.STAGES.values():
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("stage", sorted(cli.STAGES))
def test_help_says_what_the_stage_reads_and_writes(stage: str) -> None:
    done = script(stage, "--help", timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    about, _, rest = text.partition("== Config groups ==")
    assert rest, text  # the groups and the composed config follow the description
    assert about.startswith(f"saleval-{stage}:"), about[:200]
    assert "powered by Hydra" not in text
    assert "``" not in about  # reST markup is gone
    inputs = compose_config(stage).get("inputs") or {}
    for key in inputs:
        assert f"inputs.{key}" in about, (stage, key)
    for name in WRITES[stage]:
        assert name in about, (stage, name)
    assert "Main options:" in about and f"saleval-{stage} " in about  # an example command
    assert f"task_name: {stage}" in rest  # the composed config, as --cfg job shows it
    assert re.search(r"^dataset: .*imdb", rest, re.M)  # config groups with their options


def _main_options(stage: str) -> list[str]:
    spec = importlib.util.find_spec(cli.STAGES[stage])
    assert spec is not None and spec.origin is not None
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    paragraph = doc.partition("Main options:")[2].partition("\n\n")[0]
    return re.findall(r"``([^`]+)``", paragraph)


def _has_key(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None:  # under a group left null (e.g. crowd=lu2024 names it): nothing to check
        return True
    # `leaf in node` is False for a key left at ???
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118


@pytest.mark.parametrize("stage", sorted(cli.STAGES))
def test_the_main_options_a_help_names_exist(stage: str) -> None:
    options = _main_options(stage)
    assert options, stage
    cfg = compose_config(stage)
    for option in options:
        key = option.split("=")[0].removesuffix(".*")
        assert _has_key(cfg, key), (stage, option)


def _heavy_after_import(modules: list[str], heavy: tuple[str, ...], then: str = "") -> list[str]:
    """The ``heavy`` packages in ``sys.modules`` of a fresh interpreter that imported
    ``modules`` (and ran the statements ``then``)."""
    code = (
        f"import sys, {', '.join(modules)}\n{then}\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip())


#: what score, compare, report and a published file's import ask of the methods: their
#: table names, the paper's row order, the published names
NAMING_METHODS = (
    "from saleval.analysis.reports import display_name\n"
    "from saleval.analysis.scoring import order_methods\n"
    "from saleval.crowd.importing.published_format import method_names\n"
    "shown = [display_name(m) for m in order_methods(['random', 'lime', 'all_attention'])]\n"
    "assert shown == ['All Attention', 'LIME', 'Random'], shown\n"
    "assert method_names()['Integrated_Gradient'] == 'integrated_gradients'"
)


def test_importing_a_stage_and_naming_the_methods_leave_the_heavy_packages_unloaded() -> None:
    """A console script starts (and prints --help or a config error) without the heavy
    packages, and a stage that only names methods runs without them (issue #54: the
    method modules cost a score or compare process seconds; saleval.attribution.catalog
    reads what they are from the source). Every stage module is imported in one
    interpreter, which then names the methods: what none of them loads together, none
    loads alone; on a failure each is imported alone to name it."""
    heavy = ("torch", "lightning", "transformers", "captum", "lime")
    stages = sorted(set(cli.STAGES.values()))
    if _heavy_after_import(stages, heavy, NAMING_METHODS):
        loading = {m: found for m in stages if (found := _heavy_after_import([m], heavy))}
        naming = _heavy_after_import(["saleval.cli"], heavy, NAMING_METHODS)
        pytest.fail(f"importing a stage loads {loading}; naming the methods loads {naming}")
    assert _heavy_after_import(["saleval.cli"], (*heavy, "mlflow")) == []


def test_a_bad_input_is_one_line_and_exit_2_and_hydra_full_error_shows_the_traceback(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no_such_run"
    done = script("score", f"inputs.crowd={missing}", *scratch(tmp_path))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"saleval-score: inputs.crowd={missing}: no such file or directory; pass a "
        "saleval-import or saleval-simulate run dir, runs:/<id> or latest"
    ], done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    full = script(
        "score", f"inputs.crowd={missing}", *scratch(tmp_path), env={"HYDRA_FULL_ERROR": "1"}
    )
    assert full.returncode != 0
    assert "Traceback" in full.stderr and "InputError" in full.stderr


@pytest.mark.parametrize(
    "stage,args,says",
    [
        ("score", ["no_such_key=1"], "Key 'no_such_key' not in 'ScoreStageConfig'"),
        ("train", ["trainer.max_epochs=many"], "trainer.max_epochs=many"),
        ("train", ["trainer=no_such_trainer"], "Could not find 'trainer/no_such_trainer'"),
        ("tasks", [], "inputs.explain is required: pass inputs.explain=<value>"),
        # `+` adds a key like `key=` does: refused the same way, with the node's keys
        (
            "explain",
            ["+data.n_sample=8"],
            "data.n_sample is not a setting of data (ExplainData): did you mean "
            "data.n_samples? Its keys: split, n_samples, sample_ids, population",
        ),
        ("tasks", ["study.balance_by=foo"], "expected one of [label, pred, outcome, none]"),
    ],
)
def test_config_errors_are_one_line(tmp_path: Path, stage: str, args: list[str], says: str) -> None:
    done = script(stage, *args, *scratch(tmp_path))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"saleval-{stage}: "), done.stderr
    assert says in lines[0]
    assert "Traceback" not in done.stdout + done.stderr


def _wrapped(raises: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """A stage whose run raises ``raises``, run through :func:`saleval.cli.hydra_main`."""
    code = (
        "import sys\nfrom saleval.cli import hydra_main\nfrom saleval.errors import UserError\n"
        f"def run(cfg):\n    raise {raises}('the message')\n"
        "sys.exit(hydra_main('score', run)())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args, f"inputs.crowd={tmp_path}", *scratch(tmp_path)],
        capture_output=True,
        text=True,
        env=environment(env),
        timeout=120,
        cwd=ROOT,
    )


def test_only_user_errors_lose_their_traceback(tmp_path: Path) -> None:
    user = _wrapped("UserError", tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert user.returncode == 2
    assert user.stderr.strip() == "saleval-score: the message"
    bug = _wrapped("RuntimeError", tmp_path)
    assert bug.returncode == 1
    assert "Traceback" in bug.stderr and "RuntimeError: the message" in bug.stderr
    full = _wrapped("UserError", tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr


def test_a_user_error_in_a_multirun_job_is_one_line_after_every_job_ran(tmp_path: Path) -> None:
    done = _wrapped("UserError", tmp_path, "-m", "seed=1,2")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.count("saleval-score: the message") == 1, done.stderr
    sweeps = list((tmp_path / "out" / "score" / "multirun").iterdir())
    assert len(sweeps) == 1 and {p.name for p in sweeps[0].iterdir()} >= {"0", "1"}


@pytest.mark.parametrize("multirun", [False, True])
def test_a_missing_input_path_is_named_before_the_stage_runs(
    tmp_path: Path, multirun: bool
) -> None:
    """The stage's run (where its libraries are imported) is never called: the path is
    checked first, also for a key added with `+` and in a -m job."""
    missing = tmp_path / "nope"
    code = (
        "import sys\nfrom saleval.cli import hydra_main\n"
        "def run(cfg):\n    raise RuntimeError('the stage ran')\n"
        "sys.exit(hydra_main('explain', run)())"
    )
    args = ["-m"] if multirun else []
    done = subprocess.run(
        [sys.executable, "-c", code, *args, f"inputs.model={missing}", *scratch(tmp_path)],
        capture_output=True, text=True, env=environment(), timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert "the stage ran" not in done.stderr
    says = (
        f"saleval-explain: inputs.model={missing}: no such file or directory; pass a "
        "saleval-train run dir, runs:/<id> or latest; or a save_pretrained directory or a hub id"
    )
    lines = done.stderr.strip().splitlines()
    # alone: the first line; in a -m sweep, Hydra's report of the failed job holds it
    assert (says in lines) if multirun else lines[0] == says, done.stderr
    assert done.returncode == (1 if multirun else 2)
    # a command line of overrides is refused before Hydra makes a run dir
    assert multirun or not (tmp_path / "out").exists()


def _messages(output: str) -> list[str]:
    """Output lines without progress bars, log prefixes and blank lines."""
    out = []
    for line in output.replace("\r", "\n").splitlines():
        # a bar's rate is followed by "]" or, with a postfix (the loss), by ","; the final
        # bar may be drawn twice with the same rate, which is no message printed twice
        if not line.strip() or "?it/s" in line or re.search(r"(it/s|s/it)[],]", line):
            continue
        line = re.sub(r"^\[[^]]+\]\[[^]]+\]\[\w+\] - ", "", line)  # Hydra's log format
        out.append(re.sub(r"^(INFO|WARNING|DEBUG): ", "", line))  # Lightning's own handler
    return out


@pytest.mark.slow
def test_a_tiny_train_and_explain_print_no_lightning_chatter_and_nothing_twice(
    tmp_path: Path,
) -> None:
    train = script(
        "train",
        "model=tiny",
        "trainer=smoke",
        "trainer.progress_bar=true",
        "dataset=ag_news",
        "dataset.max_train=64",
        "dataset.max_validation=32",
        "dataset.max_test=32",
        "tracking.log_model=false",
        f"run_dir={tmp_path / 'train'}",
        *scratch(tmp_path),
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    explain = script(
        "explain",
        f"inputs.model={tmp_path / 'train'}",
        "data.n_samples=4",
        "method=[random,occlusion]",
        f"run_dir={tmp_path / 'explain'}",
        *scratch(tmp_path),
        timeout=600,
        then="print('lightning loaded:', 'lightning' in sys.modules)",
    )
    assert explain.returncode == 0, explain.stderr[-3000:]
    # one device of one node: the methods ran in the process, no Trainer and no import of
    # Lightning (saleval.modeling.devices.one_process)
    assert "lightning loaded: False" in explain.stdout, explain.stdout[-2000:]
    for done in (train, explain):
        output = done.stdout + done.stderr
        assert not [c for c in LIGHTNING_CHATTER if c in output], output
        twice = [m for m, n in Counter(_messages(output)).items() if n > 1]
        assert not twice, output
    # where the output is a file, each epoch is one plain line, never a bar's redraws
    assert re.search(r"epoch \(.*val_accuracy [0-9.]+.*\): 1/\d+ ", train.stdout), train.stdout
    assert "\r" not in train.stdout + train.stderr
    assert "[saleval-explain] finished:" in explain.stdout


def test_sigterm_stops_explain_while_it_explains(tmp_path: Path, tiny_train_run: Path) -> None:
    """A scheduler's or a user's SIGTERM ends ``saleval-explain`` mid-job. On one device the
    job runs in the process (saleval.attribution.frame), where it raises ``Stopped``; in
    Lightning's ranks: tests/test_attribution_ddp.py."""
    code = script_code("explain")
    args = [f"inputs.model={tiny_train_run}", "method=[lime]", "method.lime.num_samples=20000",
            "data.n_samples=40", "progress=true", f"run_dir={tmp_path / 'run'}",
            *scratch(tmp_path)]  # fmt: skip
    # stderr on a terminal (a pty), as a user's: LIME's bar shows there (saleval.progress)
    reader, terminal = pty.openpty()
    # a terminal's size (a new pty has none, and tqdm draws nothing 0 columns wide)
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stderr=terminal,
        stdout=subprocess.DEVNULL,
        env=environment(),
        cwd=ROOT,
    )
    os.close(terminal)
    try:
        seen = ""
        while not re.search(r"lime:\s*\d+%", seen):  # LIME's bar: inside the predict batch
            try:
                chunk = os.read(reader, 4096).decode(errors="replace")
            except OSError:  # the process closed its end
                chunk = ""
            assert chunk or proc.poll() is None, f"explain ended before LIME ran: {seen[-2000:]}"
            seen += chunk
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.monotonic() - start < 60:
            if select.select([reader], [], [], 0.5)[0]:  # keep reading: a full pty blocks it
                with contextlib.suppress(OSError):
                    os.read(reader, 65536)
        code_ = proc.wait(timeout=1)
        assert code_ != 0 and time.monotonic() - start < 60
        # stopped from outside, not failed and not left running (docs/architecture.md)
        record = json.loads((tmp_path / "run" / "run.json").read_text())
        assert record["status"] == "KILLED" and "SIGTERM" in record["error"], record
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(reader)
