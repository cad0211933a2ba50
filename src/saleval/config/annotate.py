"""Schema of the ``annotate`` node of ``conf/annotate.yaml`` (the annotation server)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from saleval.config.crowd import WorkerIdCase


class AnnotateAction(StrEnum):
    """``serve``: the bundles to people; ``export``: the answers as ``answers.csv``;
    ``backup``: a consistent copy of the live database (``annotate.backup_to``)."""

    serve = "serve"
    export = "export"
    backup = "backup"


@dataclass
class AnnotateExportConfig:
    complete_only: bool = False  # true: leave out answers of unfinished bundles


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
