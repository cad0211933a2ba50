"""One rename table instead of a module at every old address (docs/architecture.md,
*Old addresses*): a run recorded before code moved still adopts, its ``_target_``s read
at their new addresses, and no module under ``src/saleval`` re-exports another's names."""

from __future__ import annotations

import ast
import importlib
import json
import logging
from pathlib import Path

import hydra.utils
import pytest
from omegaconf import OmegaConf

import saleval
from saleval.modeling.data import read_ag_news
from saleval.pipeline.run_inputs import RunInputs, read_run_config
from saleval.renames import RENAMES, renamed

SRC = Path(saleval.__file__).parent


def _importable(path: str) -> object:
    """The module or module attribute a dotted path names (ImportError when none)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("old", sorted(RENAMES))
def test_every_row_points_at_code_and_the_old_address_is_gone(old: str) -> None:
    assert _importable(RENAMES[old]) is not None
    with pytest.raises((ImportError, AttributeError)):
        _importable(old)


def test_a_run_recorded_with_old_targets_still_adopts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "explain"
    parent.mkdir()
    recorded = {
        "dataset": {
            "name": "ag_news",
            "_target_": "saleval.data.read_ag_news",
            "label_names": ["World", "Sports", "Business", "Sci/Tech"],
        },
        "model": {"_target_": "saleval.models.EmbeddedSource", "name": "minilm"},
        "metrics": {"plugins": ["saleval.plausibility"]},
    }
    (parent / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(recorded)))
    (parent / "run.json").write_text(
        json.dumps({"stage": "explain", "run_id": "r1", "status": "FINISHED"})
    )
    cfg = OmegaConf.create({"dataset": None})
    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.run_inputs"):
        inputs = RunInputs(cfg, "tasks", {"explain": str(parent)}, requires=["dataset"])
    # adopted, at today's address, and the loader it names is the real one
    assert cfg.dataset._target_ == "saleval.modeling.data.read_ag_news"
    assert hydra.utils.get_method(cfg.dataset._target_) is read_ag_news
    recorded_model = inputs.parent_configs["explain"].model._target_
    assert recorded_model == "saleval.modeling.models.EmbeddedSource"
    assert inputs.parent_configs["explain"].metrics.plugins == ["saleval.metrics.plausibility"]
    # one line says so, naming the file and every rewrite
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert str(parent / "config.yaml") in lines[0]
    assert "dataset._target_: saleval.data.read_ag_news -> saleval.modeling.data" in lines[0]
    assert "metrics.plugins[0]: saleval.plausibility -> saleval.metrics.plausibility" in lines[0]
    # a config of today's addresses is read unchanged and says nothing
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.run_inputs"):
        again = read_run_config(parent)  # the file itself is left as recorded
    assert again.dataset._target_ == "saleval.modeling.data.read_ag_news"
    assert "saleval.data.read_ag_news" in (parent / "config.yaml").read_text()


#: code a run's config.yaml named before crowd/ was split by concept (issue #47): its
#: crowd source and aggregator, its simulated readers, the published study's datasets
CROWD_TARGETS_BEFORE_THE_SPLIT = [
    "saleval.crowd.importer.AnswersSource",
    "saleval.crowd.importer.PublishedSource",
    "saleval.crowd.aggregation.StrictMajority",
    "saleval.crowd.lexicon.AutoReader",
    "saleval.crowd.lexicon.LexiconReader",
    "saleval.crowd.readers.BowReader",
    "saleval.crowd.readers.EmbeddingReader",
    "saleval.crowd.readers.FinetunedReader",
    "saleval.crowd.published.read_lu2024_imdb",
    "saleval.crowd.published.read_lu2024_ag_news",
]


@pytest.mark.parametrize("old", CROWD_TARGETS_BEFORE_THE_SPLIT)
def test_crowd_targets_recorded_before_the_split_build_the_same_code(old: str) -> None:
    new = renamed(old)
    assert new.startswith(("saleval.crowd.importing.", "saleval.crowd.simulation.")), new
    assert hydra.utils.get_object(new).__name__ == old.rpartition(".")[2]
    with pytest.raises((ImportError, AttributeError)):
        _importable(old)


def test_renamed_matches_whole_dotted_parts_only() -> None:
    assert renamed("saleval.models.RandomSource") == "saleval.modeling.models.RandomSource"
    assert renamed("saleval.modelsx.Y") == "saleval.modelsx.Y"
    assert renamed("saleval.annotate.store.LeaseStore").endswith("store_leases.LeaseStore")
    assert renamed("crowdkit.aggregation.MACE") == "crowdkit.aggregation.MACE"


def _reexports(path: Path) -> list[str]:
    """Names a module imports only to hand on: ``import x as x`` (PEP 484's re-export
    spelling) or ``from m import *``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*" or (a.asname is not None and a.asname == a.name):
                    found.append(f"{node.module}.{a.name}")
    return found


def test_no_module_re_exports_another_modules_names() -> None:
    offenders = {
        str(p.relative_to(SRC)): names
        for p in sorted(SRC.rglob("*.py"))
        if (names := _reexports(p))
    }
    assert not offenders, offenders
    # the modules kept only for old addresses are gone
    for old in ("data.py", "models.py", "faithfulness", "metrics_config.py", "plausibility.py"):
        assert not (SRC / old).exists(), old
