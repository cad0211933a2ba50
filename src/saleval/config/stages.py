"""One root schema per stage (Hydra's "schema for the primary config" pattern).

Each ``conf/<stage>.yaml`` lists ``<stage>_schema`` first in its ``defaults``; the group
nodes are typed, so an unknown key in any group file (the project's or one found through
``--config-dir``) fails when the config is composed, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from saleval.config.annotate import AnnotateAction, AnnotateConfig, AnnotateCrowdConfig
from saleval.config.common import KGridConfig, PathsConfig, TrackingConfig
from saleval.config.crowd import SimulationConfig, StudyConfig
from saleval.config.dataset import DatasetConfig
from saleval.config.model import ModelConfig
from saleval.config.plan import PlanConfig
from saleval.config.profile import ProfileConfig
from saleval.config.shortcut import ShortcutConfig, ShortcutExplainConfig
from saleval.config.trainer import TrainerConfig
from saleval.vocab import Population, Target


@dataclass
class RootConfig:
    """Keys every root config has, ``saleval-run``'s included."""

    task_name: str = MISSING
    run_dir: str | None = None  # set by tests/pipeline; null = Hydra's run dir
    paths: PathsConfig = field(default_factory=PathsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


@dataclass
class StageConfig(RootConfig):
    """Keys every stage root has: a stage draws with its own seed (``saleval-run`` has none:
    each stage's comes from its own config or the profile)."""

    seed: int = 42
    # read input runs that are not FINISHED (FAILED, KILLED, RUNNING) anyway; each such run
    # is named in this run's provenance and in every run downstream (docs/tracking.md)
    allow_unfinished_inputs: bool = False


#: the ``method`` group: method key -> its settings, ``_target_`` naming the class. The
#: settings are open (``Any``) on purpose: each method class is its own schema, and
#: ``hydra.utils.instantiate`` checks its keyword arguments when the method is built (an
#: unknown one names the method and the argument), so a user's own method class
#: (docs/extending.md) needs no schema registered here.
MethodGroup = dict[str, Any] | None


# -- train ---------------------------------------------------------------------------


@dataclass
class TrainStageConfig(StageConfig):
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    trainer: TrainerConfig = MISSING


# -- explain -------------------------------------------------------------------------


@dataclass
class ExplainInputs:
    # a train run dir, runs:/<mlflow run id> or a checkpoint dir (model=prompted: may be
    # left out for model.pretrained)
    model: str | None = MISSING


@dataclass
class ExplainData:
    """Which samples to explain."""

    split: str = "test"
    n_samples: int | None = None  # null: every sample; N: seeded, class-balanced
    sample_ids: list[str] | None = None  # an explicit list (wins over n_samples)
    population: Population = Population.all  # by the model's outcome on them


@dataclass
class ExplainView:
    samples: Any = 3  # HTML highlight pages for this many samples, or a list of sample ids
    k: int = 10  # each method's top-k words highlighted (k as in the crowd study's kgrid)
    overlap_k: int = 40  # K of the method-overlap table (Lu et al. 2024)


@dataclass
class ExplainStageConfig(StageConfig):
    dataset: DatasetConfig | None = (
        None  # null: the train run's (saleval.pipeline.records.provenance)
    )
    # null: the train run's; model=prompted: a causal LM (inputs.model or model.pretrained)
    # prompted to classify (docs/data-and-models.md#prompted-llms)
    model: ModelConfig | None = None
    trainer: TrainerConfig = MISSING
    method: MethodGroup = None
    inputs: ExplainInputs = field(default_factory=ExplainInputs)
    data: ExplainData = field(default_factory=ExplainData)
    target: Target = Target.prediction  # the class each explanation is for
    max_length: int | None = None  # null: the train run's model.max_length
    batch_size: int = 64  # examples per prediction batch
    progress: bool = True
    view: ExplainView = field(default_factory=ExplainView)
    # a method whose fingerprint (model, samples, its settings, device, code) was computed
    # before under this output root loads its stored scores (saleval.attribution.reuse)
    reuse_methods: bool = True


# -- tasks, simulate, annotate, import -----------------------------------------------


@dataclass
class TasksInputs:
    # an explain run, a list of them or a sweep dir (disjoint methods; docs/sweeps.md)
    explain: Any = MISSING


@dataclass
class TasksStageConfig(StageConfig):
    dataset: DatasetConfig | None = (
        None  # null: the explain run's (saleval.pipeline.records.provenance)
    )
    study: StudyConfig = MISSING
    kgrid: KGridConfig = MISSING
    inputs: TasksInputs = field(default_factory=TasksInputs)
    # methods with identical top-k words on every study sample at every k are always warned;
    # true: the later of each such pair (explain's method order) makes no tasks
    # (docs/study-design.md#identical-methods)
    drop_duplicate_methods: bool = False


@dataclass
class TaskRunInputs:
    tasks: str = MISSING  # a saleval-tasks run dir or runs:/<id>


class SimulateAction(StrEnum):
    """``saleval-simulate action=...``."""

    simulate = "simulate"  # answer the tasks (a task run's, or the published study's)
    validate = "validate"  # answer the published tasks and compare with the real crowd


@dataclass
class PublishedTasksConfig:
    """How a simulated crowd answers the published study's tasks (``crowd=lu2024``)."""

    repeats: int = 5  # workers per task, as in the original study
    # action=validate: simulated crowds (seeds simulation.seed, +1, ...) averaged, so the
    # comparison measures the worker model rather than one crowd's binomial noise
    replicates: int = 5
    bundle_size: int = 100  # tasks per simulated worker
    # the dataset splits the reader learns from, the study's samples removed by text
    reader_splits: list[str] = field(default_factory=lambda: ["train", "validation", "test"])


@dataclass
class SimulateStageConfig(StageConfig):
    dataset: DatasetConfig | None = (
        None  # null: the task run's (saleval.pipeline.records.provenance)
    )
    simulation: SimulationConfig = MISSING
    action: SimulateAction = SimulateAction.simulate
    # crowd=lu2024 crowd.path=<published file>: answer the original study's own tasks
    crowd: Any = None
    published: PublishedTasksConfig = field(default_factory=PublishedTasksConfig)
    inputs: TaskRunInputs = field(default_factory=TaskRunInputs)


@dataclass
class AnnotateInputs:
    tasks: str = MISSING  # a saleval-tasks run dir or runs:/<id>
    # the pilot's export run (annotate.phase=pilot action=export): its participants are
    # refused (annotate.exclude_pilot) and its median time per task sets the pay
    pilot: str | None = None
    # a pilot's export: a saleval-plan run whose designs it re-costs at the measured times
    plan: str | None = None


@dataclass
class AnnotateStageConfig(StageConfig):
    action: AnnotateAction = AnnotateAction.serve
    inputs: AnnotateInputs = field(default_factory=AnnotateInputs)
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)
    dataset: DatasetConfig | None = (
        None  # null: the task run's (saleval.pipeline.records.provenance)
    )
    # crowd.worker_id_case: the import's worker-ID rule, which the app follows too
    crowd: AnnotateCrowdConfig = field(default_factory=AnnotateCrowdConfig)


@dataclass
class ImportInputs:
    tasks: str = MISSING
    answers: str = MISSING  # answers.csv, a run dir holding it, or runs:/<id>


@dataclass
class ImportStageConfig(StageConfig):
    dataset: DatasetConfig | None = None  # null: the task run's dataset
    # answers (AnswersCrowdConfig) or a published file (PublishedCrowdConfig): OmegaConf has
    # no unions, so each crowd/*.yaml names its schema in its defaults list instead
    crowd: Any = None
    inputs: ImportInputs = field(default_factory=ImportInputs)


# -- score, metrics, compare ---------------------------------------------------------


@dataclass
class BootstrapConfig:
    n: int = 1000  # resamples over samples for the CIs (0: no CIs)
    level: float = 0.95


@dataclass
class ScoringConfig:
    baseline: str = "random"  # the paired test compares every method with this one
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    test_resamples: int = 9999  # sign-flip permutations of the paired test
    positive_label: int = 1  # forward-prediction studies: the "positive" class
    flip_histogram_exclude: list[str] = field(default_factory=list)


@dataclass
class ScoreInputs:
    crowd: str = MISSING  # a saleval-import run (unless crowd=... is given)


@dataclass
class ScoreStageConfig(StageConfig):
    dataset: DatasetConfig | None = None  # null: the import run's dataset
    # answers (AnswersCrowdConfig) or a published file (PublishedCrowdConfig): OmegaConf has
    # no unions, so each crowd/*.yaml names its schema in its defaults list instead
    crowd: Any = None
    inputs: ScoreInputs = field(default_factory=ScoreInputs)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)


@dataclass
class MetricsInputs:
    model: str = MISSING  # a saleval-train run (its model/ dir)
    explain: Any = MISSING  # a saleval-explain run, a list of them or a sweep dir


@dataclass
class MetricsStageConfig(StageConfig):
    kgrid: KGridConfig = MISSING
    # typed by its group's own schema, metrics/schema (saleval.metrics.config), which
    # conf/metrics/*.yaml extend: that schema holds each registered metric's settings, so
    # it lives with the registry, above this package (docs/architecture.md, "Layers")
    metrics: Any = MISSING
    dataset: DatasetConfig | None = None  # null: the explain run's dataset
    model: ModelConfig | None = None  # null: the train run's model
    progress: bool = True
    inputs: MetricsInputs = field(default_factory=MetricsInputs)


@dataclass
class CompareInputs:
    # a run, a list of runs or a sweep dir each (disjoint methods; docs/sweeps.md)
    score: Any = MISSING  # a saleval-score run
    metrics: Any = MISSING  # a saleval-metrics run


@dataclass
class CompareConfig:
    # summary (grid averages + single-k metrics) | all | a list of metric columns
    columns: Any = "summary"
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)


@dataclass
class CompareStageConfig(StageConfig):
    dataset: DatasetConfig | None = None  # null: the runs' dataset
    model: ModelConfig | None = None  # unused; accepted so pipeline-wide overrides compose
    inputs: CompareInputs = field(default_factory=CompareInputs)
    compare: CompareConfig = field(default_factory=CompareConfig)


# -- report --------------------------------------------------------------------------


@dataclass
class ReportInputs:
    # run dirs, runs:/<id>, -m sweep dirs, saleval-run dirs: one or a list
    runs: Any = None


@dataclass
class ReportSearch:
    """Runs found in MLflow (``MlflowClient.search_runs``), besides ``inputs.runs``."""

    experiments: list[str] = field(default_factory=list)  # experiment names; empty: no search
    filter: str = (
        ""  # an MLflow filter, e.g. "tags.sweep = '<sweep dir>'" or "tags.dataset = 'imdb'"
    )
    max_results: int = 1000


@dataclass
class ReportOptions:
    # summary (grid averages + single-k metrics) | all | a list of metric columns
    columns: Any = "summary"
    # ranks and correlations within each group of these (dataset first; add variant to
    # rank a variant's methods only among themselves)
    rank_within: list[str] = field(default_factory=lambda: ["dataset", "model"])


@dataclass
class ReportStageConfig(StageConfig):
    inputs: ReportInputs = field(default_factory=ReportInputs)
    search: ReportSearch = field(default_factory=ReportSearch)
    report: ReportOptions = field(default_factory=ReportOptions)


# -- shortcut, run -------------------------------------------------------------------


@dataclass
class ShortcutStageConfig(StageConfig):
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    trainer: TrainerConfig = MISSING
    shortcut: ShortcutConfig = MISSING
    method: MethodGroup = None
    inputs: dict[str, str] = field(default_factory=dict)  # no parents
    label_map: list[int] | None = None  # source class → 0/1 (-1 drops it)
    explain: ShortcutExplainConfig = field(default_factory=ShortcutExplainConfig)
    original_cache: str | None = None  # reuse the original model across a sweep
    # CSV of published results (dataset, shortcut, config, precision, mean_rank) put
    # beside ours in shortcut_table.md (docs/shortcut.md#reference)
    reference: str | None = None
    progress: bool = True


# -- plan ----------------------------------------------------------------------------


@dataclass
class PlanInputs:
    explain: str | None = None  # an explain run: the simulated crowd answers its tasks
    answers: str | None = None  # real answers with times (answers.csv or its run): s per task


@dataclass
class PlanStageConfig(StageConfig):
    dataset: DatasetConfig | None = None  # null: the explain run's; required with crowd=...
    crowd: Any = None  # crowd=lu2024 crowd.path=<published file>: the published study
    study: StudyConfig = MISSING  # explain runs: how tasks are built (n_samples: the pool)
    kgrid: KGridConfig = MISSING
    simulation: SimulationConfig = MISSING
    published: PublishedTasksConfig = field(default_factory=PublishedTasksConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    inputs: PlanInputs = field(default_factory=PlanInputs)


@dataclass
class RunStageConfig(RootConfig):
    """``saleval-run``: every stage under one parent run, overrides from a profile."""

    task_name: str = "run"
    reuse: bool = True  # reuse a finished stage run with the same config and inputs
    inputs: dict[str, str] = field(default_factory=dict)  # <stage>: an existing run
    profile: ProfileConfig = MISSING
