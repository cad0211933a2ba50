"""Schema of the ``annotate`` node of ``conf/annotate.yaml`` (the annotation server)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from saleval.config.crowd import WorkerIdCase


class StudyPhase(StrEnum):
    """``main``: the study itself; ``pilot``: a few bundles first, in a task set of their
    own, to measure time per task and check understanding (docs/annotate.md#running-a-paid-study)."""

    main = "main"
    pilot = "pilot"


class AnnotateAction(StrEnum):
    """``serve``: the bundles to people; ``export``: the answers as ``answers.csv``;
    ``backup``: a consistent copy of the live database (``annotate.backup_to``)."""

    serve = "serve"
    export = "export"
    backup = "backup"


@dataclass
class AnnotateExportConfig:
    complete_only: bool = False  # true: leave out answers of unfinished bundles
    # true: leave out the answers of participants flagged for rejection (attention checks)
    exclude_rejected: bool = True


@dataclass
class PilotConfig:
    """``annotate.phase=pilot``: how much of the task set the pilot serves."""

    bundles: int = 3  # the first this many bundles of the task set


@dataclass
class ComprehensionConfig:
    """A check of the instructions before the first task (docs/annotate.md#comprehension).

    Prolific asks that a comprehension check allow two attempts; one who fails every
    attempt is screened out: shown the return message and ``return_code``, paid
    ``pay.screen_out`` as a bonus, and never given a bundle."""

    enabled: bool = False
    attempts: int = 2
    # null: three questions built from the study's instructions and labels; else a YAML
    # list of {question, options, answer} (answer: the right option's text)
    questions_file: str | None = None
    return_code: str | None = None  # the platform's screen-out code; null: none shown
    # null: "please return this study"; the code (if any) is shown under it
    return_message: str | None = None


@dataclass
class AttentionConfig:
    """The gold questions as attention checks (docs/annotate.md#attention-checks).

    Prolific: in a study over 5 minutes, reject only after at least two failed fair
    attention checks; so a participant is flagged for rejection at ``max_failures``."""

    max_failures: int = 2
    end_session: bool = True  # at max_failures: release the bundle, show the return message
    idk_fails: bool = False  # "I don't know" on a gold question counts as a failure


@dataclass
class PayConfig:
    """What a participant is paid (docs/annotate.md#payments); amounts in ``currency``.

    ``reward`` is the platform's reward for a completed bundle (what an approval pays);
    null: ``hourly_rate`` × the bundle's tasks × ``seconds_per_task`` (the planner's rule,
    docs/planning.md#cost), rounded to cents. ``seconds_per_task`` null: the pilot's median
    (``inputs.pilot``), else this study's own median answer time."""

    reward: float | None = None
    hourly_rate: float = 9.0
    seconds_per_task: float | None = None
    fee: float = 0.0  # the platform's service fee, a fraction of every payment
    currency: str = "GBP"
    partial: bool = True  # a bonus, pro rata, for the answers of a bundle not finished
    gold_bonus: float = 0.0  # a bonus per gold question answered right (approved only)
    screen_out: float = 0.0  # a bonus for one screened out by the comprehension check


@dataclass
class DashboardConfig:
    """The researcher's live view (``/admin/dashboard``) and its MLflow metrics."""

    refresh_s: int = 10  # the page reloads its figures this often
    log_every_s: float = 60.0  # serve logs the same figures to MLflow this often (0: never)
    rate_window_minutes: float = 10.0  # answers per minute over this last stretch


@dataclass
class AnnotateCrowdConfig:
    """The crowd setting the app shares with ``saleval-import``, under the same key."""

    # which worker IDs name one worker, at login, resume and the admin's assign
    worker_id_case: WorkerIdCase = WorkerIdCase.insensitive


@dataclass
class AnnotateConfig:
    """Server settings; ``db`` is shared by serve and export."""

    host: str = "127.0.0.1"  # loopback; put a TLS reverse proxy in front for real workers
    port: int = 8765
    db: str = "${paths.output_root}/annotate/annotations.sqlite"
    # the admin token: from the environment or a file, never the command line (shell
    # history, ps, and Hydra reads 1_2_3 as the integer 123); see docs/annotate.md
    admin_token: str | None = "${oc.env:SALEVAL_ANNOTATE_TOKEN,null}"
    admin_token_file: str | None = "${oc.env:SALEVAL_ANNOTATE_TOKEN_FILE,null}"
    # a bundle goes back to the pool this long after its worker's last action
    lease_minutes: float = 60.0
    max_claims_per_client: int = 5  # new bundles per client address per window (0: no bound)
    claim_window_minutes: float = 60.0
    # platform link mode: where a finished worker is sent; {code} becomes the completion
    # code, e.g. https://app.prolific.com/submissions/complete?cc={code}
    completion_url: str | None = None
    allowed_origins: list[str] = field(default_factory=list)  # e.g. https://study.example.org
    # wrong admin credentials (login form, admin cookie, Authorization: Bearer) per client
    # per 15 min, then HTTP 429; wrong resume codes have their own bound, so admin guesses
    # from an address never lock the workers behind it out of resuming
    admin_max_failures: int = 5
    resume_max_failures: int = 5
    backup_to: str | None = None  # action=backup: the file the online backup writes
    title: str | None = None  # null: "Which label? (<dataset>)"
    completion_code: str | None = None  # null: a random code per bundle
    synchronous: str = "FULL"  # SQLite durability: FULL survives power loss
    secure_cookies: bool = False  # true when served over HTTPS
    log_level: str = "info"
    access_log: bool = False
    export: AnnotateExportConfig = field(default_factory=AnnotateExportConfig)
    # a paid study (docs/annotate.md#running-a-paid-study)
    phase: StudyPhase = StudyPhase.main
    pilot: PilotConfig = field(default_factory=PilotConfig)
    # with inputs.pilot: refuse the pilot's participants in the main study
    exclude_pilot: bool = True
    comprehension: ComprehensionConfig = field(default_factory=ComprehensionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    pay: PayConfig = field(default_factory=PayConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
