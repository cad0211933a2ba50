"""A run's identity: what determines its outputs, as one short hash.

Two runs of a stage with the same fingerprint compute the same tables (up to hardware
nondeterminism), so ``saleval-run`` reuses a finished one instead of recomputing it, and the
explain stage keys each method's stored scores by it (docs/architecture.md, §2). The
fingerprint hashes the stage's resolved config, less the keys that say where things go
rather than what is computed, with the fingerprints of its parent runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from saleval.pipeline.records.run_record import RunRecord


def fingerprint(cfg: Mapping[str, Any], parents: Mapping[str, str]) -> str:
    """Hash of what determines a stage's outputs: its config and its parents' fingerprints."""
    blob = json.dumps(
        {"cfg": cfg, "parents": dict(sorted(parents.items()))}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Keys that name where things go rather than what is computed.
_VOLATILE = ("run_dir", "paths", "tracking", "hydra", "inputs", "progress", "reuse_methods")


def stage_fingerprint(
    cfg: DictConfig,
    stage: str,
    input_dirs: Mapping[str, Path],
    parents: Mapping[str, RunRecord] | None = None,
    resolved: dict[str, Any] | None = None,
) -> str:
    """What a run of ``stage`` with ``cfg`` on these parent run dirs would compute.

    Two runs with the same fingerprint produce the same outputs (up to hardware
    nondeterminism); ``saleval-run`` reuses a finished one instead of recomputing.
    ``parents`` (their records) and ``resolved`` (``cfg`` resolved) spare reading
    and resolving them again when the caller has them.
    """
    if resolved is None:
        container = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(container, dict)
        resolved = cast(dict[str, Any], container)  # a stage config's keys are str
    stable = {k: v for k, v in resolved.items() if k not in _VOLATILE}
    if isinstance(stable.get("dataset"), dict):  # where the files sit is not what they are
        stable["dataset"] = {k: v for k, v in stable["dataset"].items() if k != "data_root"}
    records = parents or {k: RunRecord.read(p) for k, p in input_dirs.items()}
    prints = {k: records[k].fingerprint or "" for k in input_dirs}
    # inputs given as plain files (a platform's answers.csv) count by their content
    for k, v in (resolved.get("inputs") or {}).items():
        if k not in prints and isinstance(v, str) and Path(v).is_file():
            prints[k] = "sha256:" + hashlib.sha256(Path(v).read_bytes()).hexdigest()
    return fingerprint({"stage": stage, **stable}, prints)
