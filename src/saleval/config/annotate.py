"""Schema of the ``annotate`` node of ``conf/annotate.yaml`` (the annotation server)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class AnnotateAction(StrEnum):
    """``serve``: the bundles to people; ``export``: the answers as ``answers.csv``."""

    serve = "serve"
    export = "export"


@dataclass
class AnnotateExportConfig:
    complete_only: bool = False  # true: leave out answers of unfinished bundles


@dataclass
class AnnotateConfig:
    """Server settings; ``db`` is shared by serve and export."""

    host: str = "127.0.0.1"  # loopback; put a TLS reverse proxy in front for real workers
    port: int = 8765
    db: str = "${paths.output_root}/annotate/annotations.sqlite"
    admin_token: str | None = "${oc.env:SALEVAL_ANNOTATE_TOKEN,null}"
    title: str | None = None  # null: "Which label? (<dataset>)"
    completion_code: str | None = None  # null: a random code per bundle
    synchronous: str = "FULL"  # SQLite durability: FULL survives power loss
    secure_cookies: bool = False  # true when served over HTTPS
    log_level: str = "info"
    access_log: bool = False
    export: AnnotateExportConfig = field(default_factory=AnnotateExportConfig)
