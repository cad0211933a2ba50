"""Config schemas of the crowd side: ``conf/study``, ``conf/simulation``, ``conf/crowd``.

They live with the other schemas, below the code that reads them: this module imports
nothing of :mod:`saleval.crowd`. The words their fields take (``Policy``,
``WorkerIdCase``, ``BalanceBy``) and the errors their checks raise (``DesignError``,
``SimulationError``) are declared here, and the crowd modules take them from here
(docs/architecture.md, section 4). The published method names are not: each method
declares its own where it registers (:func:`saleval.attribution.base.register`).

Each group's fields and defaults are declared once, here, as OmegaConf structured
configs: the YAML files of a group list the schema first in their defaults and then
state only what differs from it (with comments saying what each value means). An
unknown key or a value outside an enum fails when the config is composed, naming the
key; ranges are checked when the typed object is built (``__post_init__``), naming the
key and the allowed range.

* :class:`StudyConfig` — ``study`` (``saleval-tasks``);
* :class:`SimulationConfig` — ``simulation`` (``saleval-simulate``), nested throughout;
* :class:`AnswersCrowdConfig` / :class:`PublishedCrowdConfig` — ``crowd=answers`` /
  ``crowd=lu2024`` (``saleval-import``, ``saleval-score``). Their ``_target_`` names
  the source class that ``hydra.utils.instantiate`` builds (see
  :func:`saleval.crowd.importing.source.crowd_source`), and ``crowd.aggregator`` is
  itself an instantiable node (``_target_`` + parameters; options in ``conf/crowd/aggregator``).

:func:`register_schemas` puts them in Hydra's ConfigStore under the names the YAML
files' defaults lists use (``study_schema``, ``simulation_schema``, ``answers_schema``,
``lu2024_schema``); importing this module registers them.

>>> from saleval.schema import to_schema
>>> to_schema(StudyConfig, {"n_samples": 8}).bundle_size
100
>>> to_schema(StudyConfig, {"nsamples": 8})
Traceback (most recent call last):
...
omegaconf.errors.ConfigKeyError: Key 'nsamples' not in 'StudyConfig'
    full_key: nsamples
    object_type=StudyConfig
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore

from saleval.errors import UserError
from saleval.vocab import IDK_ALIASES, Population, Target


class DesignError(UserError, ValueError):
    """The study cannot be built as configured, or a built design breaks a constraint."""


class SimulationError(UserError, ValueError):
    """The simulated crowd cannot run as configured on these tasks."""


# ---------------------------------------------------------------------------------
# study (conf/study/*.yaml)
# ---------------------------------------------------------------------------------


class BalanceBy(StrEnum):
    """What a study's samples are balanced over (``study.balance_by``)."""

    label = "label"  # the gold class
    pred = "pred"  # the predicted class
    outcome = "outcome"  # predicted class x correct/wrong (TP/TN/FP/FN for binary tasks)
    none = "none"  # not balanced


@dataclass
class StudyConfig:
    """The crowd study's design (docs/study-design.md): ``study=main|misclassified|forward|smoke``.

    The defaults are the main study: 100 correctly classified samples balanced over
    classes, every method × every k, bundles of 100 tasks, each task answered 5 times.
    """

    name: str = "main"
    n_samples: int = 100  # N
    population: Population = Population.correct  # which samples: correct | misclassified | all
    # label (gold class) | pred | outcome (TP/TN/FP/FN-style cells) | none
    balance_by: BalanceBy = BalanceBy.label
    # gold: workers recognise the true label; prediction: they guess the model's output
    target: Target = Target.gold
    methods: list[str] | None = None  # null: every method of the explain run; or a list
    baseline: str = "random"  # the baseline every method is compared with
    require_baseline: bool = True  # fail when the explain run has no baseline attributions
    bundle_size: int | None = 100  # B study tasks per bundle (null: B = N); one worker each
    repeats: int = 5  # R workers per task
    balance_tolerance: int = 0  # allowed excess over floor/ceil(B/M) methods, (B/K) ks a bundle
    gold_rate: float = 0.0  # gold questions per bundle as a fraction of B (on top of B)
    gold_pool: int = 20  # distinct gold items (full, short, confidently classified texts)
    gold_max_words: int = 60  # longest text usable as a gold item
    noise: float = 0.0  # noise ablation: share of shown words swapped for other words of the text
    seed: int = 42

    def __post_init__(self) -> None:
        try:
            self.population = Population(self.population)
            self.balance_by = BalanceBy(self.balance_by)
            self.target = Target(self.target)
        except ValueError as err:
            raise DesignError(f"study: {err}") from err
        self.methods = None if self.methods is None else [str(m) for m in self.methods]
        if not 0.0 <= float(self.noise) <= 1.0:
            raise DesignError(f"study.noise must lie in [0, 1], got {self.noise}")
        if self.repeats < 1:
            raise DesignError(f"study.repeats must be at least 1, got {self.repeats}")
        if not 0.0 <= float(self.gold_rate) < 1.0:
            raise DesignError(f"study.gold_rate must lie in [0, 1), got {self.gold_rate}")


# ---------------------------------------------------------------------------------
# simulation (conf/simulation/*.yaml)
# ---------------------------------------------------------------------------------


class NoiseDistribution(StrEnum):
    """How each simulated worker's lapse rate is drawn (``simulation.noise.distribution``)."""

    beta = "beta"  # beta(a, b)
    uniform = "uniform"  # uniform(low, high)
    fixed = "fixed"  # value


class Decision(StrEnum):
    """How an honest simulated worker turns the reading model's probabilities into a label."""

    sample = "sample"  # a label drawn from the (tempered) probabilities
    argmax = "argmax"  # the most probable label


@dataclass
class NoiseConfig:
    """Per-worker lapse rate: the distribution and its parameters."""

    distribution: NoiseDistribution = NoiseDistribution.beta
    a: float = 2.0
    b: float = 8.0
    low: float | None = None
    high: float | None = None
    value: float | None = None

    def __post_init__(self) -> None:
        self.distribution = NoiseDistribution(self.distribution)
        needs = {
            NoiseDistribution.beta: ("a", "b"),
            NoiseDistribution.uniform: ("low", "high"),
            NoiseDistribution.fixed: ("value",),
        }[self.distribution]
        unset = [f"simulation.noise.{n}" for n in needs if getattr(self, n) is None]
        if unset:
            raise SimulationError(
                f"simulation.noise.distribution={self.distribution} needs {unset}"
            )


@dataclass
class SpammerKinds:
    """Relative weights of the spammer kinds (a kind with weight 0 never occurs)."""

    random: float = 0.6  # uniformly random labels
    idk: float = 0.2  # "I don't know" throughout
    constant: float = 0.2  # one label throughout


SPAMMER_KINDS: tuple[str, ...] = tuple(f.name for f in fields(SpammerKinds))


@dataclass
class SpammersConfig:
    """Workers who ignore the text and answer fast (the quality filters should find them)."""

    fraction: float = 0.1  # share of the workers
    kinds: SpammerKinds = field(default_factory=SpammerKinds)
    seconds_median: float = 0.8  # per task (lognormal)
    seconds_sigma: float = 0.3


@dataclass
class TimingConfig:
    """How long honest workers take per task, and when bundles start.

    Seconds per task = speed · (base_s + per_word_s · words shown) · lognormal(0, sigma),
    speed = lognormal(0, speed_sigma) per worker; tasks are gap_s apart; bundles start
    within spread_hours of start.
    """

    base_s: float = 4.0
    per_word_s: float = 0.25
    sigma: float = 0.35
    speed_sigma: float = 0.25
    gap_s: float = 0.5
    start: str = "2024-01-01T09:00:00+00:00"
    spread_hours: float = 48.0


BOW_READER = "saleval.crowd.simulation.readers.BowReader"
AUTO_READER = "saleval.crowd.simulation.lexicon.AutoReader"


@dataclass
class ReaderConfig:
    """What every reading model of the simulated workers shares (``simulation.reader``):
    which class (``_target_``) and which split of the dataset it learns from, disjoint
    from the explained (test) samples. Each reader class adds its own fields
    (:mod:`saleval.crowd.simulation.readers`)."""

    _target_: str = BOW_READER
    split: str = "train"
    max_train: int | None = None  # a seeded subsample of the split; null: all of it


@dataclass
class DiscrepancyConfig:
    """The simulated crowd's measured error (docs/simulated-crowd.md#out-of-sample): per
    validated dataset and fit (``leave_one_method_out``, ``fitted_on_<other dataset>``),
    per method, simulated minus real s_j in points, each from a fit that did not see that
    method or dataset. The planner draws its discrepancy from them (docs/planning.md)."""

    source: str = ""
    residuals: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


@dataclass
class SimulationConfig:
    """The simulated crowd (docs/study-design.md): ``simulation=default|ideal|noisy``.

    A worker lapses (a random label) with its own rate drawn from ``noise``; otherwise it
    answers "I don't know" when the reading model's normalised confidence
    (p_max − 1/C)/(1 − 1/C) is below its threshold, idk_threshold + idk_jitter · N(0, 1);
    otherwise it answers by ``decision``.
    """

    name: str = "default"
    seed: int = 42
    # calibrated against the original study's crowds (docs/simulated-crowd.md#calibration)
    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(b=11.33))  # mean lapse 0.15
    idk_threshold: float = 0.0  # + jitter: about half the workers never say "I don't know"
    idk_jitter: float = 0.05
    decision: Decision = Decision.sample
    # decision=sample: < 1 sharper, > 1 flatter than the reader's (calibrated) probabilities
    temperature: float = 1.0
    spammers: SpammersConfig = field(default_factory=SpammersConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    # the reading model: _target_ + its parameters (options: conf/simulation/reader/*.yaml)
    reader: dict[str, Any] = field(default_factory=lambda: {"_target_": AUTO_READER})
    # what validating this worker model against the original study's real crowd measured
    # (docs/simulated-crowd.md); every SIMULATED notice repeats it. Empty: not validated.
    validation: dict[str, str] | None = None
    # the settings those figures were measured with, nested as this group: a run whose
    # settings differ says that the figures do not apply (validation.calibration_note)
    validated: dict[str, Any] | None = None
    # out-of-sample method-score residuals of the validated settings (for the planner)
    discrepancy: DiscrepancyConfig | None = None

    def __post_init__(self) -> None:
        try:
            self.decision = Decision(self.decision)
        except ValueError as err:
            raise SimulationError(f"simulation.decision: {err}") from err
        fraction = float(self.spammers.fraction)
        if not 0.0 <= fraction <= 1.0:
            raise SimulationError(
                f"simulation.spammers.fraction must lie in [0, 1], got {self.spammers.fraction}"
            )
        if not self.reader.get("_target_"):
            raise SimulationError("simulation.reader names no _target_; e.g. simulation/reader=bow")
        weights = {k: float(getattr(self.spammers.kinds, k)) for k in SPAMMER_KINDS}
        if any(w < 0 for w in weights.values()) or (fraction > 0 and sum(weights.values()) <= 0):
            raise SimulationError(
                f"simulation.spammers.kinds must weight some of {SPAMMER_KINDS} "
                f"(non-negative weights), got {weights}"
            )


# ---------------------------------------------------------------------------------
# crowd sources (conf/crowd/*.yaml)
# ---------------------------------------------------------------------------------


class Policy(StrEnum):
    """What an import does with rejected rows (``crowd.policy``)."""

    report = "report"  # import the good rows, write the rejects next to them
    strict = "strict"  # any reject fails the import; nothing is written


class WorkerIdCase(StrEnum):
    """Whether worker IDs that differ only in case are one worker (``crowd.worker_id_case``):
    the one worker-ID rule, read by the import and by the annotation app (at login, when
    a bundle is assigned or resumed, and when the admin assigns one)."""

    insensitive = "insensitive"  # 'A1B2' and 'a1b2' are one worker (platform IDs, typed IDs)
    sensitive = "sensitive"  # case tells workers apart (a platform whose IDs need it)

    def key(self, raw: str) -> str:
        """Who a worker ID names: surrounding spaces never count, case only under
        ``sensitive`` (docs/aggregation.md#worker-ids).

        >>> WorkerIdCase.insensitive.key(" A1b2 "), WorkerIdCase.sensitive.key(" A1b2 ")
        ('a1b2', 'A1b2')
        """
        value = raw.strip()
        return value if self is WorkerIdCase.sensitive else value.casefold()


class IdkAs(StrEnum):
    """How Krippendorff's alpha treats "I don't know" (``crowd.agreement.idk``)."""

    category = "category"  # an answer category of its own
    missing = "missing"  # no answer


@dataclass
class FiltersConfig:
    """Quality filters (docs/aggregation.md#quality-filters), run in this order; each is logged
    with what it removed."""

    min_bundle_seconds: float | None = 120.0  # a bundle finished faster is spam; null disables
    all_idk: bool = True  # drop workers who answered "I don't know" to every task
    gold_min_accuracy: float | None = 0.5  # minimum accuracy on gold questions; null disables


@dataclass
class AgreementConfig:
    """Inter-annotator agreement (Krippendorff's alpha, docs/aggregation.md#agreement)."""

    idk: IdkAs = IdkAs.category


@dataclass
class ExpertConfig:
    """Expert answers to check the crowd against (docs/aggregation.md#expert-check)."""

    path: str | None = None  # CSV `task_id, answer` (optionally expert_id) of expert answers


STRICT_MAJORITY = "saleval.crowd.importing.aggregation.StrictMajority"


@dataclass
class AnswersCrowdConfig:
    """``crowd=answers``: long answer files joined with a task run (docs/aggregation.md#import)."""

    _target_: str = "saleval.crowd.importing.builtin.AnswersSource"
    name: str = "answers"
    policy: Policy = Policy.report
    encoding: str = "utf-8"  # of the answer file; cp1252: Excel on Windows (docs/annotate.md)
    # insensitive: worker IDs differing only in case are one worker; sensitive: two.
    # Surrounding spaces never count (docs/aggregation.md#worker-ids)
    worker_id_case: WorkerIdCase = WorkerIdCase.insensitive
    # answers that mean "I don't know", compared case-, space- and apostrophe-insensitively
    idk: list[str] = field(default_factory=lambda: list(IDK_ALIASES))
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    aggregator: dict[str, Any] = field(default_factory=lambda: {"_target_": STRICT_MAJORITY})
    agreement: AgreementConfig = field(default_factory=AgreementConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)


@dataclass
class PublishedCrowdConfig:
    """``crowd=lu2024``: the published aggregated results of the original study."""

    _target_: str = "saleval.crowd.importing.builtin.PublishedSource"
    name: str = "lu2024"
    path: str | None = None  # required: the published file (saleval-import/-score check it)
    policy: Policy = Policy.report
    encoding: str = "utf-8"
    # published method name -> saleval method name, over the published name each method
    # declares where it registers (saleval.attribution.base.register): only a name of
    # another study's file, or one read differently, needs an entry here
    methods: dict[str, str] = field(default_factory=dict)


SCHEMAS: dict[tuple[str, str], type] = {
    ("study", "study_schema"): StudyConfig,
    ("simulation", "simulation_schema"): SimulationConfig,
    ("crowd", "answers_schema"): AnswersCrowdConfig,
    ("crowd", "lu2024_schema"): PublishedCrowdConfig,
}
"""(config group, name in Hydra's ConfigStore) -> schema; the YAML defaults lists use the names."""


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    for (group, name), node in SCHEMAS.items():
        cs.store(group=group, name=name, node=node)


register_schemas()
