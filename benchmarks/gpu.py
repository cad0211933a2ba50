"""Issue #44: the GPU path in one call of at most 10 minutes (docs/benchmarks.md#gpu).

``bash benchmarks/gpu_check.sh [--out DIR]`` on a lent GPU machine (it sets up the carried
packages, data and model first: :mod:`benchmarks.gpu_pack`), or ``python -m benchmarks gpu
[--out DIR]`` where the environment is ready, runs three steps, each a subprocess with a
time limit, and writes each step's table into the output folder as soon as the step ends:

* **a** ``make run`` on the GPU: ``saleval-run`` with the default profile, ``trainer=gpu``
  for training and attribution and the metrics' forward passes on the GPU
  (``metrics.inference.accelerator=gpu``): per-stage, per-method and per-metric times;
* **b** the performance benchmark (:mod:`benchmarks.performance`) on the GPU: every method
  and metric, the engine against the naive loop, the GPU's fp32 and bf16 matmul peak
  measured in the same run;
* **c** the published study's 100 IMDB samples (``profile=lu2024``) with ``profile=paper``'s
  training (3 epochs, full precision) and LIME (the configured 1,000 samples in fp32):
  times, and the method ranking beside the published crowd's.

Each step gets its budget (sized for an H100, docs/benchmarks.md#gpu) plus whatever the
steps before it left unused, and never more than leaves the later steps theirs before
``--deadline``. A step that fails or runs out of time is reported as such and the next
one runs; a stopped step keeps what it wrote (the benchmark writes its table row by row,
a pipeline's finished stages are read from its log and run dirs). The output folder gets
at most seven files (a lent machine returns eight, none in a subfolder): ``summary.md`` (every table and each
step's status; rewritten after every step), ``a_make_run.md``, ``b_performance.md``,
``c_lu2024_paper.md``, ``status.json``, ``steps.log`` (each step's output) and, from the
shell script, ``setup.log``. Run dirs and MLflow stores go to ``--work`` (not returned).

``--dry-run`` runs the same three steps on the CPU at smoke size (the smoke profile, the
benchmark's ``--smoke``), so the script cannot rot between the times a GPU is available;
``tests/test_benchmarks.py`` runs it.

The steps' commands and overrides are :mod:`benchmarks.gpu_steps`'s, their tables
:mod:`benchmarks.gpu_tables`'; this module plans, runs and reports them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.gpu_steps import (
    BENCH_CLI,
    Outcome,
    Plan,
    Step,
    make_run_stages,
    paper_lu2024_stages,
    pipeline_command,
    shown,
)
from benchmarks.gpu_tables import head, performance_table, pipeline_tables

ROOT = Path(__file__).resolve().parents[1]
#: the carried set-up (benchmarks/gpu_pack.py) writes this: the commit it was packed from
MANIFEST = ".gpu-carry/manifest.json"
#: seconds a step's own summary needs after it is stopped
GRACE = 15.0
#: a dry run (no deadline) gives each step this many times its budget
DRY_SLACK = 4
LOG_TAIL = 60  # lines of a failed step's output in summary.md
STEP_LOG_LIMIT = 4_000_000  # characters of each step's output kept in steps.log


def plan(out: Path, work: Path, dry_run: bool, given_train: Path | None = None) -> Plan:
    """The three steps (module docstring); ``given_train`` (a dry run in the test suite):
    step a takes that train run instead of training."""
    a_stages, c_stages = make_run_stages(dry_run), paper_lu2024_stages(dry_run)
    a_root, c_root = work / "a_make_run", work / "c_lu2024_paper"
    extra = [f"+inputs.train={given_train}"] if given_train else []
    b_out = "b_performance.md"
    perf = (
        ["--smoke", "--device", "cpu", "--no-ferret"]
        if dry_run
        else ["--device", "cuda", "--n", "100", "--metrics-n", "16", "--bf16", "--no-ferret"]
    )
    steps = [
        Step(
            "a",
            "make run on the GPU (profile=default, trainer=gpu)"
            if not dry_run
            else "make run, dry run (profile=smoke, CPU)",
            150.0,
            pipeline_command("default" if not dry_run else "smoke", a_stages, a_root, extra),
            "a_make_run.md",
            pipeline_tables,
            run_dir=a_root / "run",
        ),
        Step(
            "b",
            "performance benchmark: every method and metric, engine vs the naive loop",
            150.0,
            [sys.executable, "-c", BENCH_CLI, "performance", *perf, "--out", str(work / b_out)],
            "b_performance.md",
            performance_table,
            run_dir=work,
        ),
        Step(
            "c",
            "the published study's 100 IMDB samples at the paper's training and LIME settings "
            "(profile=lu2024)"
            if not dry_run
            else "profile=lu2024 at the paper's settings, dry run (smoke size, CPU)",
            210.0,
            pipeline_command("lu2024", c_stages, c_root, ["profile.name=lu2024_paper"]),
            "c_lu2024_paper.md",
            pipeline_tables,
            run_dir=c_root / "run",
        ),
    ]
    return Plan(steps, {"a": a_stages, "c": c_stages})


def missing_distributions(modules: Sequence[str]) -> list[str]:
    """The installed distributions behind ``modules`` that a GPU machine has neither in its
    image nor in the carried folder (:mod:`benchmarks.gpu_pack`): each would fail there.

    >>> missing_distributions(["json", "numpy.linalg", "mlflow", "saleval.cli"])
    []
    """
    from importlib import metadata

    from benchmarks.gpu_pack import CARRY, IMAGE_PACKAGES, MODEL_PACKAGE, normalize

    have = {normalize(n) for n in (*IMAGE_PACKAGES, *CARRY, "saleval", MODEL_PACKAGE)}
    owners = metadata.packages_distributions()
    missing: set[str] = set()
    for top in {m.split(".")[0] for m in modules}:
        dists = owners.get(top) or []  # none: the standard library, benchmarks, a namespace
        if dists and not any(normalize(d) in have for d in dists):
            missing.update(normalize(d) for d in dists)
    return sorted(missing)


def step_env() -> dict[str, str]:
    """The steps' environment: offline, unbuffered, and each step its own MLflow store
    under its output root (a tracking server set for the shell is not this check's). Stage
    and method reuse stay as ``make run`` has them: the work folder starts empty, so
    nothing is there to reuse, and every stage and method is computed and timed."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_step(step: Step, limit: float, log: Path, imports: Path | None = None) -> Outcome:
    """Run one step for at most ``limit`` seconds (its whole process group stopped then:
    SIGTERM, which a stage records as KILLED, then SIGKILL); its modules to ``imports``."""
    outcome = Outcome(step.key, step.title, "ok", step.budget, limit)
    env = step_env()
    if imports is not None:
        env["SALEVAL_IMPORTS_TO"] = str(imports)
    t0 = time.perf_counter()
    with log.open("w") as f:
        f.write(f"$ {shown(step.command)}\n")
        f.flush()
        proc = subprocess.Popen(
            step.command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            outcome.returncode = proc.wait(timeout=max(limit, 1.0))
        except subprocess.TimeoutExpired:
            outcome.status = "timed out"
            _stop(proc)
            outcome.returncode = proc.returncode
    outcome.seconds = time.perf_counter() - t0
    if outcome.status == "ok" and outcome.returncode != 0:
        outcome.status = "failed"
        outcome.note = f"exit status {outcome.returncode}"
    return outcome


def _stop(proc: subprocess.Popen[Any]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def limit_of(budgets: Sequence[float], left: float | None) -> float:
    """The time the next step gets: its budget plus what earlier steps left unused, less
    what the later steps need (``budgets[0]`` is the next step's; ``left``: seconds to the
    deadline). Without a deadline (a dry run on a shared CPU) :data:`DRY_SLACK` × its budget.

    >>> limit_of([150, 150, 210], 570)
    210
    >>> limit_of([150, 210], 300)
    90
    >>> limit_of([150], None)
    600
    """
    if left is None:
        return DRY_SLACK * budgets[0]
    return left - sum(budgets[1:])


#: run in a subprocess, so this process never holds a CUDA context the steps would share
_PROBE = """
import json, os, platform
from importlib import metadata
import torch
lines = [f"Host: {platform.node()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}."]
gpu = torch.cuda.is_available()
if gpu:
    p = torch.cuda.get_device_properties(0)
    lines.append(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; "
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}), bf16 "
                 f"{'native' if torch.cuda.is_bf16_supported() else 'emulated'}.")
else:
    lines.append(f"GPU: none visible to torch {torch.__version__}.")
versions = []
for name in ("transformers", "lightning", "captum", "lime", "mlflow-skinny", "hydra-core",
             "numpy", "pandas", "scikit-learn"):
    try:
        versions.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
lines.append("Packages: " + ", ".join(versions) + ".")
print(json.dumps({"lines": lines, "gpu": gpu}))
"""


def environment() -> tuple[list[str], bool]:
    """The machine and the versions that ran (a GPU figure means little without them), and
    whether torch sees a GPU."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
            env=step_env(),
        )  # fmt: skip
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        lines, gpu = list(info["lines"]), bool(info["gpu"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as err:
        lines, gpu = [f"Environment probe failed: {type(err).__name__}: {err}"], False
    return [*lines, f"Code: {code_version()}."], gpu


def code_version() -> str:
    """The commit that ran. A device machine gets no .git: there the carried manifest's
    commit, if the code is still what was packed (:func:`benchmarks.gpu_pack.code_digest`)."""
    manifest = ROOT / MANIFEST
    if manifest.is_file() and not (ROOT / ".git").exists():
        from benchmarks.gpu_pack import code_digest

        info = json.loads(manifest.read_text())
        commit = f"commit {info.get('commit', '?')}" + (
            " with uncommitted changes" if info.get("uncommitted_changes") else ""
        )
        if info.get("code_digest") == code_digest():
            return f"{commit} (as packed {info.get('packed', '?')})"
        return f"not the packed {commit}: src, benchmarks or conf changed since (code digest {code_digest()})"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        return f"commit {rev or '?'}" + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"


def write_summary(
    out: Path, env: list[str], outcomes: list[Outcome], tables: dict[str, str],
    logs: dict[str, Path], dry_run: bool, started: str,
) -> None:  # fmt: skip
    """``summary.md`` and ``status.json`` as they stand (rewritten after every step)."""
    title = "GPU check" + (" (dry run: CPU, smoke size)" if dry_run else "")
    lines = [f"# {title}, started {started}", "", *env, ""]
    lines += ["| step | status | seconds | allowed | budget | table |",
              "| --- | --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    for o in outcomes:
        lines.append(
            f"| {o.key}. {o.title} | {o.status}{f' ({o.note})' if o.note else ''} | "
            f"{o.seconds:.0f} | {o.limit:.0f} | {o.budget:.0f} | {o.table or '—'} |"
        )
    failed = [o.key for o in outcomes if o.status != "ok"]
    lines += ["", f"Steps not ok: {', '.join(failed)}." if failed else "Every step ran.", ""]
    for o in outcomes:
        if o.key in tables:
            lines += [tables[o.key], ""]
        if o.status != "ok" and o.key in logs and logs[o.key].is_file():
            tail = logs[o.key].read_text(errors="replace").splitlines()[-LOG_TAIL:]
            lines += [f"Last {len(tail)} lines of step {o.key}'s output:", "", "```", *tail,
                      "```", ""]  # fmt: skip
    (out / "summary.md").write_text("\n".join(lines))
    status = {"dry_run": dry_run, "started": started, "environment": env,
              "steps": [asdict(o) for o in outcomes]}  # fmt: skip
    (out / "status.json").write_text(json.dumps(status, indent=2) + "\n")


def collect_logs(out: Path, logs: dict[str, Path]) -> None:
    """Every step's output in one file (the last :data:`STEP_LOG_LIMIT` characters each)."""
    with (out / "steps.log").open("w") as f:
        for key, path in logs.items():
            text = path.read_text(errors="replace") if path.is_file() else ""
            if len(text) > STEP_LOG_LIMIT:
                text = "[... cut ...]\n" + text[-STEP_LOG_LIMIT:]
            f.write(f"===== step {key} =====\n{text}\n")


def check(
    out: Path,
    work: Path,
    dry_run: bool,
    deadline: float | None,
    start: float,
    steps_wanted: Sequence[str] = ("a", "b", "c"),
    given_train: Path | None = None,
    steps: list[Step] | None = None,
) -> list[Outcome]:
    """Run the steps (module docstring; ``steps``: others, for the tests); return how each
    ended (none when a GPU run finds no GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):  # another run's tables would be read as this one's
        raise SystemExit(f"--work {work} is not empty: give an empty or new folder")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    env, gpu = environment()
    print("\n".join(env), flush=True)
    print(f"[gpu-check] run dirs and MLflow stores in {work} (kept; not returned)", flush=True)
    if not dry_run and not gpu:
        why = "torch sees no GPU: nothing to measure (--dry-run runs the steps on the CPU)"
        write_summary(out, [*env, why], [], {}, {}, dry_run, started)
        print(f"[gpu-check] {why}", file=sys.stderr, flush=True)
        return []
    if steps is None:
        steps = [s for s in plan(out, work, dry_run, given_train).steps if s.key in steps_wanted]
    outcomes: list[Outcome] = []
    tables: dict[str, str] = {}
    logs: dict[str, Path] = {}
    for i, step in enumerate(steps):
        left = None if deadline is None else deadline - (time.time() - start) - GRACE
        limit = limit_of([s.budget for s in steps[i:]], left)
        logs[step.key] = work / f"{step.key}.log"
        if left is not None and limit < 30:
            o = Outcome(step.key, step.title, "skipped", step.budget, max(limit, 0.0),
                        note="no time left before the deadline")  # fmt: skip
        else:
            print(f"[gpu-check] step {step.key}: {step.title}; budget {step.budget:.0f} s, "
                  f"allowed {limit:.0f} s", flush=True)  # fmt: skip
            imports = work / f"{step.key}.imports"
            o = run_step(step, limit, logs[step.key], imports)
            if imports.is_file():
                lacking = missing_distributions(imports.read_text().split())
                o.lacking = lacking
                if lacking:
                    o.note = (o.note + "; " if o.note else "") + (
                        "a GPU machine lacks "
                        + ", ".join(lacking)
                        + " (add to benchmarks/gpu_pack.py CARRY)"
                    )
            print(f"[gpu-check] step {step.key}: {o.status} after {o.seconds:.0f} s"
                  + (f" ({o.note})" if o.note else ""), flush=True)  # fmt: skip
            try:
                tables[step.key] = step.tabulate(step, o, logs[step.key])
            except Exception as err:  # a table that cannot be made does not stop the check
                tables[step.key] = f"{head(step, o)}\n\nNo table: {type(err).__name__}: {err}\n"
            (out / step.out_name).write_text(tables[step.key])
            o.table = step.out_name
        outcomes.append(o)
        write_summary(out, env, outcomes, tables, logs, dry_run, started)
        collect_logs(out, logs)
    bad = [o for o in outcomes if o.status != "ok"]
    print(f"[gpu-check] {len(outcomes) - len(bad)} of {len(outcomes)} steps ok"
          + (f"; not ok: {', '.join(f'{o.key} ({o.status})' for o in bad)}" if bad else "")
          + f"; tables in {out}", flush=True)  # fmt: skip
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: $OUT where set, else outputs/gpu_check)")  # fmt: skip
    p.add_argument("--work", type=Path, default=None,
                   help="run dirs and MLflow stores (default: a folder beside --out's, not in it)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at smoke size")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds, from $GPU_CHECK_START (the shell script's start) or now, "
                        "by which every step has ended (default 570 on a GPU, none in a dry run)")  # fmt: skip
    p.add_argument("--steps", default="abc", help="which steps (default abc)")
    p.add_argument("--given-train", type=Path, default=None,
                   help="step a takes this train run instead of training (the test suite's dry run)")  # fmt: skip
    args = p.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or ROOT / "outputs" / "gpu_check")
    work = args.work or Path(tempfile.mkdtemp(prefix="saleval-gpu-check-"))
    start = float(os.environ.get("GPU_CHECK_START") or time.time())
    deadline = args.deadline if args.deadline is not None else (None if args.dry_run else 570.0)
    outcomes = check(out, work, args.dry_run, deadline, start, list(args.steps), args.given_train)
    if not outcomes:
        return 2
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
