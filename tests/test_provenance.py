"""The one provenance rule: adopt when not given, check when given, fail naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.records.provenance import Provenance, ProvenanceError, inherit, resolve
from saleval.pipeline.records.run_record import RunRecord
from saleval.pipeline.stage import Stage
from saleval.vocab import Population, Target

IMDB = Provenance(dataset="imdb", label_names=("negative", "positive"), model="minilm")
AG = Provenance(dataset="ag_news", label_names=("World", "Sports", "Business", "Sci/Tech"))


def test_adopts_a_value_no_config_gives() -> None:
    got = resolve(Provenance(), {"explain": IMDB}, {"explain": "e"})
    assert (got.dataset, got.label_names, got.model) == ("imdb", IMDB.label_names, "minilm")


def test_checks_a_given_value_and_names_both() -> None:
    with pytest.raises(
        ProvenanceError, match=r"dataset=ag_news is given, but inputs\.tasks \(t\) has dataset=imdb"
    ):
        resolve(AG, {"tasks": IMDB}, {"tasks": "t"})


def test_same_name_other_labels_is_a_mismatch() -> None:
    other = Provenance(dataset="imdb", label_names=("pos", "neg"))
    with pytest.raises(ProvenanceError, match=r"labels pos, neg.*labels negative, positive"):
        resolve(other, {"tasks": IMDB}, {"tasks": "t"})


def test_parents_that_disagree_fail_naming_each() -> None:
    with pytest.raises(ProvenanceError, match=r"inputs\.score \(s\).*inputs\.metrics \(m\)"):
        resolve(Provenance(), {"score": IMDB, "metrics": AG}, {"score": "s", "metrics": "m"})


def test_inherits_from_named_inputs_only() -> None:
    train = Provenance(max_length=256)
    explain = Provenance(max_length=128)
    where = {"model": "m", "explain": "e"}
    with pytest.raises(ProvenanceError, match="disagree on max_length"):
        resolve(Provenance(), {"model": train, "explain": explain}, where)
    got = resolve(
        Provenance(), {"model": train, "explain": explain}, where, {"max_length": ["explain"]}
    )
    assert got.max_length == 128


def test_simulated_is_sticky() -> None:
    sim = Provenance(dataset="imdb", simulated=True)
    got = resolve(Provenance(), {"a": sim, "b": IMDB}, {"a": "a", "b": "b"}, ["dataset"])
    assert got.simulated is True


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValueError, match="not a provenance field"):
        inherit("colour", None, {}, {})
    with pytest.raises(ValueError, match="cannot inherit"):
        resolve(Provenance(), {}, {}, ["colour"])


def test_record_round_trips_through_json() -> None:
    p = Provenance("imdb", ("n", "p"), "minilm", 256, Target.prediction, Population.all, True)
    assert Provenance.from_json(json.loads(json.dumps(p.to_json()))) == p
    with pytest.raises(ProvenanceError, match="unknown field"):
        Provenance.from_json({"datasett": "imdb"})


def _parent(tmp: Path, name: str, cfg: dict, info: dict) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    (d / "run.json").write_text(
        json.dumps({"stage": name, "run_id": name, "status": "FINISHED", **info})
    )
    return d


def test_stage_adopts_the_parents_dataset_node_and_records_it(
    tmp_path: Path, mlflow_uri: str
) -> None:
    dataset = {"name": "imdb", "label_names": ["negative", "positive"], "data_root": "/old"}
    # a run written before run.json carried provenance: read from its config.yaml
    tasks = _parent(
        tmp_path,
        "tasks",
        {"dataset": dataset, "study": {"target": "gold", "population": "correct"}},
        {"simulated": "true"},
    )
    cfg = OmegaConf.create(
        {"dataset": None, "paths": {"data_root": "/here"}, "run_dir": str(tmp_path / "run")}
    )
    with Stage(cfg, "import", inputs={"tasks": str(tasks)}) as st:
        assert st.cfg.dataset.name == "imdb"
        assert st.cfg.dataset.data_root == "/here"  # where the files sit now
        assert st.provenance.target == Target.gold
        assert st.provenance.simulated
        st.provide(max_length=64)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["provenance"]["dataset"] == "imdb"
    assert info["provenance"]["max_length"] == 64
    assert info["simulated"] == "true"
    # a child of that run reads the typed record from run.json
    record = RunRecord.read(tmp_path / "run")
    assert record.provenance_of_run(tmp_path / "run").population == Population.correct


def test_stage_refuses_a_given_dataset_that_differs(tmp_path: Path, mlflow_uri: str) -> None:
    explain = _parent(
        tmp_path,
        "explain",
        {"dataset": {"name": "imdb", "label_names": ["negative", "positive"]}},
        {},
    )
    cfg = OmegaConf.create(
        {"dataset": {"name": "ag_news", "label_names": ["a", "b"]}, "run_dir": str(tmp_path / "r")}
    )
    with pytest.raises(ProvenanceError, match="pass dataset=imdb"):
        Stage(cfg, "tasks", inputs={"explain": str(explain)})
    assert not (tmp_path / "r").exists()  # fails before anything is written


def test_run_inputs_alone_adopts_and_checks_without_a_run(tmp_path: Path) -> None:
    """What a stage learns from its inputs needs no run dir, no MLflow run."""
    from saleval.pipeline.records.run_inputs import RunInputs

    node = {"name": "imdb", "label_names": ["negative", "positive"]}
    a = _parent(tmp_path, "a", {"dataset": node}, {"fingerprint": "fa", "stage": "explain"})
    b = _parent(tmp_path, "b", {"dataset": node}, {"fingerprint": "fb", "stage": "explain"})
    cfg = OmegaConf.create({"dataset": None})
    got = RunInputs(cfg, "tasks", {"explain": [str(a), str(b)]}, requires=["dataset"])
    assert got.provenance.dataset == "imdb" and cfg.dataset.name == "imdb"
    assert got.input_runs["explain"] == [a.resolve(), b.resolve()]
    assert dict(got) == {"explain": a.resolve()}  # an input's first run
    assert [record.fingerprint for _, record, _ in got.runs_of("explain")] == ["fa", "fb"]
    assert not got.provenance.simulated
    assert RunInputs(OmegaConf.create({"dataset": None}), "x", simulated=True).provenance.simulated
    with pytest.raises(ProvenanceError, match="saleval-x: no model is given"):
        RunInputs(OmegaConf.create({"dataset": None}), "x", {"explain": str(a)}, requires=["model"])
    # a run of another stage than the input takes is named with what to pass
    with pytest.raises(
        InputError,
        match=r"inputs.crowd=.*/a is a saleval-explain run; "
        r"saleval-score reads a saleval-import or saleval-simulate run dir, runs:/<id> or latest$",
    ):
        RunInputs(OmegaConf.create({"dataset": None}), "score", {"crowd": str(a)})
