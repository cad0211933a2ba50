"""A user's own fine-tuned classifier: a save_pretrained directory (or a hub id) as
``inputs.model``, with its labels checked against the dataset's (issue 16, item 1)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from saleval.modeling.models import (
    ModelError,
    align_labels,
    build_model,
    load_tokenizer,
    load_trained,
)
from saleval.pipeline import tables
from saleval.pipeline.records.provenance import ProvenanceError
from tests.metrics_support import TINY_CFG

AG = ["World", "Sports", "Business", "Sci/Tech"]
EXPLAIN = [
    "data.n_samples=4",
    "method=[random,occlusion]",
    "progress=false",
    "view.samples=1",
    "view.overlap_k=5",
]


@pytest.fixture(scope="module")
def own_checkpoint(tiny_train_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain save_pretrained directory: the tiny model's files, no saleval run around it."""
    d = tmp_path_factory.mktemp("user") / "my-agnews-bert"
    shutil.copytree(tiny_train_run / "model", d)
    assert not (d / "run.json").exists() and (d / "config.json").is_file()
    return d


def test_a_plain_checkpoint_is_explained_and_measured(own_checkpoint: Path, make_cfg) -> None:
    from saleval.stages import explain, metrics

    cfg = make_cfg(
        "explain",
        [f"inputs.model={own_checkpoint}", "dataset=ag_news", "dataset.max_test=64", *EXPLAIN],
    )
    out = explain.run(cfg)
    run_dir = Path(out["run_dir"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["parents"] == {}  # no train run upstream
    prov = info["provenance"]
    # no max_length given and no train run: 256, capped by the tiny BERT's 128 positions
    assert (prov["dataset"], prov["model"], prov["max_length"]) == (
        "ag_news",
        "my-agnews-bert",
        128,
    )
    assert len(tables.PREDICTIONS.read(run_dir)) == 4
    m = make_cfg(
        "metrics",
        [f"inputs.model={own_checkpoint}", f"inputs.explain={run_dir}", "kgrid=smoke"],
        name="metrics",
    )
    m_out = metrics.run(m)
    assert m_out["n_explanations"] == 8
    m_info = json.loads((Path(m_out["run_dir"]) / "run.json").read_text())
    assert m_info["provenance"]["model"] == "my-agnews-bert"


def test_a_checkpoint_needs_its_dataset_named(own_checkpoint: Path, make_cfg) -> None:
    from saleval.stages import explain

    cfg = make_cfg("explain", [f"inputs.model={own_checkpoint}", *EXPLAIN], name="nodata")
    with pytest.raises(ProvenanceError, match="no dataset is given.*pass dataset=<name>"):
        explain.run(cfg)


def test_a_hub_id_offline_says_the_hub_needs_a_network() -> None:
    with pytest.raises(ModelError, match="hub needs a network"):
        load_trained("someone/no-such-model-here")
    with pytest.raises(ModelError, match="no such directory"):
        load_trained("/no/such/dir")


def _logits(model: torch.nn.Module, tok, text: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**tok(text, return_tensors="pt")).logits[0]


def test_labels_in_another_order_are_matched_by_name() -> None:
    tok = load_tokenizer(TINY_CFG)
    shuffled = ["Sci/Tech", "World", "Business", "Sports"]
    model = build_model(TINY_CFG, shuffled, seed=0).eval()
    before = dict(zip(shuffled, _logits(model, tok, "stocks rallied on friday").tolist()))
    align_labels(model, AG, where="test")
    after = _logits(model, tok, "stocks rallied on friday").tolist()
    assert after == pytest.approx([before[n] for n in AG])
    assert model.config.id2label == dict(enumerate(AG))


def test_other_labels_fail_naming_both_and_unnamed_ones_are_taken_in_order(caplog) -> None:
    model = build_model(TINY_CFG, ["neg", "pos"], seed=0)
    with pytest.raises(ModelError, match=r"\['neg', 'pos'\] differ from the dataset's"):
        align_labels(model, ["negative", "positive"], where="inputs.model=x")
    unnamed = build_model(TINY_CFG, ["LABEL_0", "LABEL_1"], seed=0)
    with caplog.at_level(logging.WARNING):
        align_labels(unnamed, ["negative", "positive"], where="inputs.model=x")
    assert "taking them as the dataset's" in caplog.text
    assert unnamed.config.id2label == {0: "negative", 1: "positive"}


def test_a_new_head_is_one_info_line_not_transformers_load_report(caplog, capfd) -> None:
    """The embedded MiniLM with a fresh 2-class head: transformers' multi-line load report
    ("classifier.weight | MISSING") is replaced by one line, and no other warning appears
    (setting transformers' logger to WARNING would trigger its "not sharded" warning)."""
    from omegaconf import OmegaConf

    from saleval import paths

    cfg = OmegaConf.load(paths.conf_dir() / "model" / "minilm.yaml")
    with caplog.at_level(logging.INFO, logger="saleval.modeling.models"):
        model = build_model(cfg, ["neg", "pos"])
    assert model.config.num_labels == 2
    printed = capfd.readouterr().err + "\n".join(r.getMessage() for r in caplog.records)
    assert "LOAD REPORT" not in printed and "MISSING" not in printed
    assert "not sharded" not in printed
    assert "new classification head (2 tensors)" in printed
