"""The GPU check's steps (:mod:`benchmarks.gpu`): what each runs, at which overrides.

Step a is ``make run`` (the default profile), step c ``profile=lu2024`` with the paper
profile's training and LIME; both as ``saleval-run`` command lines whose per-stage override
lists come from the profiles (``conf/profile/*.yaml``) as they stand, with each stage put
on the GPU (or, in a dry run, the CPU). Step b is the performance benchmark's command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: every step's process writes the modules it imported to ``$SALEVAL_IMPORTS_TO`` as it
#: exits: a dry run checks them against what a GPU machine has
#: (:func:`benchmarks.gpu.missing_distributions`)
IMPORTS_PRELUDE = (
    "import atexit, os, sys\n"
    "_to = os.environ.get('SALEVAL_IMPORTS_TO')\n"
    "if _to:\n"
    "    atexit.register(lambda: open(_to, 'w').write('\\n'.join(sorted(sys.modules))))\n"
)
#: ``saleval-run`` as a module call: the same entry point as the console script, which a
#: machine that runs the project from its source tree (PYTHONPATH=src) does not have
RUN_CLI = IMPORTS_PRELUDE + "from saleval.cli import run\nsys.exit(run())"
#: ``python -m benchmarks <name> ...``
BENCH_CLI = IMPORTS_PRELUDE + "from benchmarks.__main__ import main\nsys.exit(main(sys.argv[1:]))"


@dataclass
class Step:
    """One step: a command, its budget and how its table is made from what it wrote."""

    key: str
    title: str
    budget: float  # seconds on an H100 (docs/benchmarks.md#gpu says how it was sized)
    command: list[str]
    out_name: str  # its table in the output folder
    tabulate: Callable[[Step, Outcome, Path], str]  # markdown of what it wrote
    run_dir: Path | None = None  # a pipeline's run dir


@dataclass
class Outcome:
    """How one step ended."""

    key: str
    title: str
    status: str  # ok | failed | timed out | skipped
    budget: float
    limit: float  # the time it was given
    seconds: float = 0.0
    returncode: int | None = None
    note: str = ""
    table: str = ""  # its file in the output folder
    #: distributions it imported that a GPU machine would lack
    #: (:func:`benchmarks.gpu.missing_distributions`)
    lacking: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """The steps and the overrides that made them (for the tests and the summary)."""

    steps: list[Step]
    stage_overrides: dict[str, dict[str, list[str]]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------
# the steps' overrides, from the profiles (conf/profile/*.yaml) as they stand
# ---------------------------------------------------------------------------------


def profile_stages(name: str) -> dict[str, list[str]]:
    """Profile ``name``'s per-stage override lists, interpolations resolved."""
    from omegaconf import OmegaConf

    from saleval.stages.run import compose_stage

    cfg = compose_stage("run", [f"profile={name}"])
    stages = OmegaConf.to_container(cfg.profile.stages, resolve=True)
    assert isinstance(stages, dict)
    return {str(k): [str(o) for o in v or []] for k, v in stages.items()}


def override_key(override: str) -> str:
    """The key an override sets: ``trainer`` for ``trainer=gpu``, ``a.b`` for ``a.b=1``."""
    return override.split("=", 1)[0].lstrip("+~")


def merge(*lists: Sequence[str]) -> list[str]:
    """Override lists merged as Hydra would apply them in turn: per key the last wins
    (a config group, which Hydra refuses twice, is kept once).

    >>> merge(["model=minilm", "trainer.max_epochs=1"], ["model=tiny", "dataset.max_train=9"])
    ['model=tiny', 'trainer.max_epochs=1', 'dataset.max_train=9']
    """
    out: dict[str, str] = {}
    for overrides in lists:
        for o in overrides:
            out[override_key(o)] = o
    return list(out.values())


def hydra_list(items: Sequence[str]) -> str:
    """A list value on Hydra's command line: each item quoted, quotes and backslashes escaped.

    >>> hydra_list(["model=tiny", "x='q'"])
    "['model=tiny','x=\\\\'q\\\\'']"
    """
    quoted = ("'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'" for s in items)
    return "[" + ",".join(quoted) + "]"


def device_overrides(stage: str, gpu: bool) -> list[str]:
    """Where a stage computes: the GPU (failing where there is none) or the CPU, and no
    progress bars (the step's log is read back, not watched)."""
    if stage == "train":
        return ["trainer=gpu" if gpu else "trainer.accelerator=cpu", "trainer.progress_bar=false"]
    if stage == "explain":
        return ["trainer=gpu" if gpu else "trainer.accelerator=cpu", "progress=false"]
    if stage == "metrics":
        return [f"metrics.inference.accelerator={'gpu' if gpu else 'cpu'}", "progress=false"]
    return []


def make_run_stages(dry_run: bool) -> dict[str, list[str]]:
    """Step a: the default profile (``make run``); the smoke profile in a dry run."""
    stages = profile_stages("smoke" if dry_run else "default")
    return {s: merge(stages.get(s, []), device_overrides(s, not dry_run)) for s in stages}


def paper_lu2024_stages(dry_run: bool) -> dict[str, list[str]]:
    """Step c: ``profile=lu2024`` with ``profile=paper``'s training and LIME settings.

    Training: the paper profile's list (3 epochs, ``32-true``) over lu2024's. LIME: lu2024's
    own LIME overrides (300 samples, ``bf16: auto``) dropped, the paper profile's (none:
    the configured 1,000 samples in fp32) taken. Everything else is lu2024's: all 100
    samples, the main study on every one, its metrics. A dry run puts the smoke profile's
    lists over it (a tiny model, a few samples, the smoke study).
    """
    lu, paper = profile_stages("lu2024"), profile_stages("paper")
    stages = dict(lu)
    stages["train"] = merge(lu.get("train", []), paper.get("train", []))
    lime = "method.lime."
    stages["explain"] = [o for o in lu.get("explain", []) if not o.startswith(lime)] + [
        o for o in paper.get("explain", []) if o.startswith(lime)
    ]
    if dry_run:
        smoke = profile_stages("smoke")
        stages = {s: merge(stages.get(s, []), smoke.get(s, [])) for s in {*stages, *smoke}}
    return {s: merge(v, device_overrides(s, not dry_run)) for s, v in stages.items()}


def pipeline_command(
    profile: str, stages: dict[str, list[str]], root: Path, extra: Sequence[str] = ()
) -> list[str]:
    """``saleval-run profile=<profile>`` with every stage's list given in full, in ``root``."""
    cmd = [sys.executable, "-c", RUN_CLI, f"profile={profile}",
           f"paths.output_root={root}", f"run_dir={root / 'run'}"]  # fmt: skip
    cmd += [f"profile.stages.{s}={hydra_list(v)}" for s, v in sorted(stages.items())]
    return cmd + list(extra)


def shown(command: Sequence[str]) -> str:
    """A step's command as a reader can rerun it (the interpreter and RUN_CLI shortened)."""
    parts = list(command)
    if parts[:3] == [sys.executable, "-c", RUN_CLI]:
        parts = ["saleval-run", *parts[3:]]
    elif parts[:3] == [sys.executable, "-c", BENCH_CLI]:
        parts = ["python", "-m", "benchmarks", *parts[3:]]
    elif parts[:1] == [sys.executable]:
        parts = ["python", *parts[1:]]
    return " ".join(f'"{p}"' if ("[" in p or " " in p) else p for p in parts)
