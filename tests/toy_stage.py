"""``saleval-toy``: a toy stage that records which explain run it read (tests/test_stage_table.py
adds it as docs/extending.md, "A stage", shows: its module, its conf file and one row).

Reads ``inputs.explain``; writes ``toy.json``.

Main options: ``inputs.explain``, ``label``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig

from saleval.config.stages import StageConfig


@dataclass
class ToyInputs:
    explain: str = MISSING  # an explain run


@dataclass
class ToyStageConfig(StageConfig):
    """The toy stage's root schema, named by its row's dotted path."""

    inputs: ToyInputs = field(default_factory=ToyInputs)
    label: str = "toy"


def run(cfg: DictConfig) -> dict[str, Any]:
    from saleval.pipeline.stage import (
        Stage,  # as the stages do: nothing heavy before the job starts
    )

    with Stage(cfg, "toy", inputs={"explain": cfg.inputs.explain}) as st:
        parent = st.inputs.parents["explain"].run_id
        st.path("toy.json").write_text(json.dumps({"label": cfg.label, "explain": parent}))
        st.log_file(st.path("toy.json"))
        return {"run_dir": str(st.run_dir), "explain": parent}
