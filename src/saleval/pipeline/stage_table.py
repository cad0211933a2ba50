"""Every stage in one table: a new stage is its module, its ``conf/<name>.yaml`` and one row.

The console scripts (:mod:`saleval.cli`), the config roots
(:data:`saleval.config.stages.ROOTS`), the stage that ``inputs.<name>=latest`` looks in
(:func:`producers`), the next-step hints a finished run prints and ``saleval-run``'s
order (:func:`pipeline`) are all read from :data:`TABLE`, so they cannot drift apart;
``tests/test_stage_table.py`` checks ``pyproject.toml``'s scripts and ``conf/*.yaml``
against it. This module imports nothing of saleval, so anything may read it (the console
scripts read it before loading any library).

>>> [s.name for s in pipeline()]
['train', 'explain', 'tasks', 'simulate', 'import', 'score', 'metrics', 'compare']
>>> spec("import").script, spec("import").attr, spec("import").schema_name
('saleval-import', 'import_', 'import_schema')
>>> producers()["answers"]
'simulate'
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageSpec:
    """One stage: where its code, config and schema are, what it reads and what follows it."""

    name: str  # ``saleval-<name>``, ``conf/<name>.yaml``, the ``stage`` tag of its runs
    module: str  # defines ``run(cfg) -> dict`` (its console script is saleval.cli's)
    schema: (
        str  # its root config dataclass: a name in :mod:`saleval.config.stages`, or a dotted path
    )
    #: input name -> the stage whose runs it names (``inputs.<name>=latest`` looks there;
    #: ``saleval-run`` passes that stage's run dir)
    inputs: Mapping[str, str] = field(default_factory=dict)
    #: what usually follows, printed when a run finishes ({run}: its run dir; {model},
    #: {tasks}: its inputs of that name; an unknown one becomes ``latest``)
    next: tuple[str, ...] = ()
    in_pipeline: bool = False  # ``saleval-run`` runs it, in table order

    @property
    def script(self) -> str:
        """The console script's name."""
        return f"saleval-{self.name}"

    @property
    def attr(self) -> str:
        """The :mod:`saleval.cli` function the script calls (a keyword gets a ``_``)."""
        return f"{self.name}_" if keyword.iskeyword(self.name) else self.name

    @property
    def schema_name(self) -> str:
        """The root schema's ConfigStore name, first in ``conf/<name>.yaml``'s defaults."""
        return f"{self.name}_schema"


TABLE: tuple[StageSpec, ...] = (
    StageSpec(
        "train",
        "saleval.stages.train",
        "TrainStageConfig",
        next=(
            "saleval-explain inputs.model={run} data.n_samples=40 data.population=correct "
            "method.lime.num_samples=300",
        ),
        in_pipeline=True,
    ),
    StageSpec(
        "explain",
        "saleval.stages.explain",
        "ExplainStageConfig",
        inputs={"model": "train"},
        next=(
            "saleval-tasks inputs.explain={run}",
            "saleval-metrics inputs.model={model} inputs.explain={run}",
            "saleval-plan inputs.explain={run}",
        ),
        in_pipeline=True,
    ),
    StageSpec(
        "tasks",
        "saleval.stages.tasks",
        "TasksStageConfig",
        inputs={"explain": "explain"},
        next=("saleval-simulate inputs.tasks={run}", "saleval-annotate inputs.tasks={run}"),
        in_pipeline=True,
    ),
    StageSpec(
        "simulate",
        "saleval.stages.simulate",
        "SimulateStageConfig",
        inputs={"tasks": "tasks"},
        next=("saleval-import inputs.tasks={tasks} inputs.answers={run}",),
        in_pipeline=True,
    ),
    StageSpec(
        "annotate",
        "saleval.stages.annotate",
        "AnnotateStageConfig",
        # a main study's pilot is an annotate run; a pilot re-costs a plan run's designs
        inputs={"tasks": "tasks", "pilot": "annotate", "plan": "plan"},
        next=("saleval-import inputs.tasks={tasks} inputs.answers={run}",),
    ),
    StageSpec(
        "import",
        "saleval.stages.import_",
        "ImportStageConfig",
        inputs={"tasks": "tasks", "answers": "simulate"},
        next=("saleval-score inputs.crowd={run}",),
        in_pipeline=True,
    ),
    StageSpec(
        "score",
        "saleval.stages.score",
        "ScoreStageConfig",
        inputs={"crowd": "import"},
        next=("saleval-compare inputs.score={run} inputs.metrics=latest",),
        in_pipeline=True,
    ),
    StageSpec(
        "metrics",
        "saleval.stages.metrics",
        "MetricsStageConfig",
        inputs={"model": "train", "explain": "explain"},
        next=("saleval-compare inputs.score=latest inputs.metrics={run}",),
        in_pipeline=True,
    ),
    StageSpec(
        "compare",
        "saleval.stages.compare",
        "CompareStageConfig",
        inputs={"score": "score", "metrics": "metrics"},
        in_pipeline=True,
    ),
    StageSpec("shortcut", "saleval.stages.shortcut", "ShortcutStageConfig"),
    StageSpec("run", "saleval.stages.run", "RunStageConfig"),
    StageSpec("report", "saleval.stages.report", "ReportStageConfig"),
    StageSpec(
        "plan",
        "saleval.stages.plan",
        "PlanStageConfig",
        inputs={"explain": "explain"},
    ),
)


def spec(name: str) -> StageSpec:
    """The row of stage ``name`` (a KeyError names the known stages)."""
    for row in TABLE:
        if row.name == name:
            return row
    raise KeyError(f"no stage {name!r}; the stages are {[s.name for s in TABLE]}")


def pipeline() -> list[StageSpec]:
    """The stages ``saleval-run`` chains, in the order it runs them."""
    return [s for s in TABLE if s.in_pipeline]


def producers() -> dict[str, str]:
    """Input name -> the stage whose runs it names, over every stage's inputs.

    One input name means one kind of run everywhere (``inputs.tasks`` is always a tasks
    run), so two rows that disagree are an error here rather than a surprise later.
    """
    out: dict[str, str] = {}
    for row in TABLE:
        for name, producer in row.inputs.items():
            if out.setdefault(name, producer) != producer:
                raise ValueError(
                    f"inputs.{name}: stage {row.name} says it comes from {producer}, "
                    f"another stage says {out[name]}"
                )
    return out


def next_steps(stage: str) -> tuple[str, ...]:
    """The hints printed when a run of ``stage`` finishes (none for a stage not in the table)."""
    return next((s.next for s in TABLE if s.name == stage), ())
