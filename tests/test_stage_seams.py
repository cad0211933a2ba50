"""The rules at the seams between stages, each in one place (issue #47, docs/architecture.md):

* a crowd source's file opens a stage's run one way (:func:`saleval.crowd.importing.source.source_run`);
* ``run.json`` is read and written only as a typed, frozen record
  (:class:`saleval.pipeline.records.run_record.RunRecord`), whose file name is written once, and
  runs are walked upstream one way (:func:`saleval.pipeline.records.run_record.ancestry`);
* the output root is resolved one way (:func:`saleval.paths.output_root`), so two stages run
  from another directory find each other's runs under the project's ``outputs/``;
* ``Stage`` restates nothing of its inputs or its MLflow side, a run is ``simulated`` in one
  place (its provenance), and every child run is made one way
  (:func:`saleval.pipeline.tracker.tracking.make_child`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

import saleval
from saleval import paths
from saleval.analysis.validation import upstream_simulation
from saleval.config.crowd import Policy
from saleval.crowd.importing.rows import CrowdImport
from saleval.crowd.importing.source import CrowdSource, Given, ImportContext, SourceFile, source_run
from saleval.pipeline import tables
from saleval.pipeline.records.provenance import Provenance
from saleval.pipeline.records.run_inputs import RunInputs, resolve_input
from saleval.pipeline.records.run_record import RUN_JSON, RunRecord, ancestry
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking_reads
from saleval.pipeline.tracker.stage_tracking import StageTracking
from saleval.stages.compare import chain
from saleval.vocab import Population, Target

SRC = Path(saleval.__file__).parent
PUBLISHED = paths.default_data_root() / "published" / "lu2024" / "AGNEWS.csv"


def _calls(path: Path) -> list[tuple[str, int]]:
    """(what is called, as written: ``Given.of``, ``source.locate``; line) of every call in
    a module."""
    return [
        (ast.unparse(node.func), node.lineno)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
    ]


def _modules(folder: str = "") -> list[Path]:
    return sorted((SRC / folder).rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(SRC))


# -- one constructor for crowd-file stages ----------------------------------------------


def test_no_stage_opens_a_crowd_sources_file_itself() -> None:
    """score, simulate, import and plan open their run on a source's file through
    ``source_run`` only: none locates the file, tags it or records what it provides."""
    found = {
        _rel(p): [(n, line) for n, line in _calls(p) if n in ("locate", "of")]
        for p in _modules("stages")
    }
    assert {k: v for k, v in found.items() if v} == {}
    users = sorted(p.stem for p in _modules("stages") if "source_run" in p.read_text())
    assert users == ["import_", "plan", "score", "simulate"]


@dataclass
class _FixedSource(CrowdSource):
    """A source whose file fixes the study it answered (as the published study does)."""

    format: ClassVar[str] = "fixed"
    path: str = ""
    provides_study: bool = True
    name: str = "fixed"
    policy: Policy = Policy.report

    def locate(self, given: Given) -> SourceFile:
        study = {"target": Target.gold, "population": Population.correct}
        return SourceFile.at(Path(self.path), provides=study if self.provides_study else {})

    def import_(self, ctx: ImportContext) -> CrowdImport:
        raise NotImplementedError


def test_source_run_names_the_file_and_records_what_the_source_provides(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    answers = tmp_path / "verdicts.csv"
    answers.write_text("task_id,majority\n")
    cfg = make_cfg("score", ["dataset=imdb"], name="fixed")
    with source_run(cfg, "score", _FixedSource(str(answers)), {"mine": "1"}, True) as (st, file):
        assert file.path == answers and st.provenance.target == Target.gold
        run_id = st.tracking.run_id
    record = RunRecord.read(cfg.run_dir)
    assert record.provenance == Provenance(
        dataset="imdb",
        label_names=("negative", "positive"),
        target=Target.gold,
        population=Population.correct,
        simulated=True,
    )
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["source_path"] == str(answers)
    assert run.data.tags["source_sha256"] == file.sha256 != ""
    assert run.data.tags["mine"] == "1" and run.data.tags["simulated"] == "true"
    assert run.data.params["source.path"] == str(answers)
    # a source that fixes nothing records nothing of its own: the run's study is its config's
    cfg = make_cfg("score", ["dataset=imdb"], name="plain")
    with source_run(cfg, "score", _FixedSource(str(answers), provides_study=False)) as (st, _):
        assert st.provenance.target is None and not st.provenance.simulated


# -- the run record -----------------------------------------------------------------------


def test_the_record_file_is_named_in_one_place() -> None:
    """No module but the record's own spells ``run.json`` in code (docstrings and messages
    may name the file; they use the constant where they build a path)."""
    spelt = {}
    for path in _modules():
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        hits = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value == RUN_JSON and id(n) not in docstrings
        ]
        if hits:
            spelt[_rel(path)] = hits
    assert list(spelt) == ["pipeline/records/run_record.py"], spelt


def test_a_record_reads_back_as_written_and_keeps_fields_it_does_not_know(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    cfg = make_cfg("score", ["dataset=imdb"], name="written")
    with Stage(cfg, "score", simulated=True) as st:
        st.write(tables.SCORES, _scores())
    written = RunRecord.path_in(cfg.run_dir).read_text()
    record = RunRecord.read(cfg.run_dir)
    assert record.finished and record.simulated and record.provenance is not None
    assert set(record.checksums or {}) == {tables.SCORES.filename}
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = "KILLED"  # type: ignore[misc]
    record.write(cfg.run_dir)
    assert RunRecord.path_in(cfg.run_dir).read_text() == written  # byte for byte
    newer = {**json.loads(written), "written_by": {"saleval": "99"}}
    assert RunRecord.from_json(newer).to_json() == newer
    # a record written by hand, with none of the optional fields, stays without them
    assert "status" not in RunRecord.from_json({"stage": "explain"}).to_json()


def _scores() -> pd.DataFrame:
    """A two-method ``scores.csv``."""
    return pd.DataFrame({"method": ["lime", "random"], "score": [50.0, 0.0], "rank": [1, 2]})


def _chain(root: Path, links: dict[str, dict[str, str]], stages: dict[str, str]) -> None:
    """Records (and a config.yaml) for run dirs ``root/<name>`` with the given parents."""
    for name, parents in links.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.yaml").write_text(f"simulation:\n  name: at-{name}\n")
        RunRecord(
            stages.get(name, "x"),
            run_id=f"id-{name}",
            parent_dirs={k: str(root / v) for k, v in parents.items()},
            status="FINISHED",
        ).write(d)


def test_one_walk_upstream_has_no_depth_cap_and_ends_on_a_cycle(tmp_path: Path) -> None:
    # score <- r1 <- ... <- r9 <- simulate: the simulated crowd is 11 runs up
    links = {"score": {"crowd": "r1"}, **{f"r{i}": {"up": f"r{i + 1}"} for i in range(1, 10)}}
    links["r9"] = {"up": "sim"}
    links["sim"] = {}
    _chain(tmp_path, links, {"score": "score", "sim": "simulate"})
    assert [d.name for d, _ in ancestry([tmp_path / "score"])] == [
        "score", *[f"r{i}" for i in range(1, 10)], "sim"
    ]  # fmt: skip
    assert upstream_simulation([tmp_path / "score"]) == {"name": "at-sim"}
    # a cycle (run dirs copied over each other) is walked once
    _chain(tmp_path / "loop", {"a": {"p": "b"}, "b": {"p": "a", "q": "gone"}}, {})
    assert [d.name for d, _ in ancestry([tmp_path / "loop" / "a"])] == ["a", "b"]
    assert upstream_simulation([tmp_path / "loop" / "a"]) is None


def test_a_chain_takes_the_nearest_run_of_each_stage(tmp_path: Path) -> None:
    # import reads tasks t1 directly and through its answers' simulate run, which read t2
    links = {"imp": {"tasks": "t1", "answers": "sim"}, "sim": {"tasks": "t2"}, "t1": {}, "t2": {}}
    _chain(tmp_path, links, {"imp": "import", "sim": "simulate", "t1": "tasks", "t2": "tasks"})
    got = chain(tmp_path / "imp")
    assert list(got) == ["import", "tasks", "simulate"]
    assert got["tasks"] == (tmp_path / "t1", "id-t1")


# -- one output root -------------------------------------------------------------------


def test_the_configs_default_output_root_is_the_codes(make_cfg: Callable[..., DictConfig]) -> None:
    cfg = make_cfg("score")
    assert Path(cfg.paths.output_root) == paths.output_root() == paths.project_root() / "outputs"
    moved = OmegaConf.merge(cfg, {"paths": {"root_dir": "/lab/saleval"}})
    assert moved.paths.output_root == "/lab/saleval/outputs" == str(paths.output_root(moved))


def test_a_run_read_from_the_store_is_downloaded_under_the_output_root(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    cfg = make_cfg("score", ["dataset=imdb"], name="elsewhere")
    with Stage(cfg, "score") as st:
        st.write(tables.SCORES, _scores())
        run_id = st.tracking.run_id
    Path(cfg.run_dir).rename(tmp_path / "moved")  # the run dir is not on this machine
    got = resolve_input("score", f"runs:/{run_id}", tmp_path / "out")
    assert got == tmp_path / "out" / "downloads" / str(run_id)
    assert RunRecord.read(got).run_id == run_id


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="published lu2024 data absent")
def test_two_stages_run_from_another_directory_find_each_other_through_latest(
    tmp_path: Path,
) -> None:
    """The project's ``outputs/`` is where ``latest`` points and is looked for, whatever the
    working directory: a project (its root given by SALEVAL_ROOT, its conf/ the real one)
    whose stages run from a directory outside it."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "conf").symlink_to(paths.conf_dir(), target_is_directory=True)
    env = {
        **os.environ,
        "SALEVAL_ROOT": str(project),
        "SALEVAL_DATA_ROOT": str(paths.default_data_root()),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own store, under its outputs/

    def stage(attr: str, *args: str) -> subprocess.CompletedProcess[str]:
        code = f"import sys\nfrom saleval.cli import {attr}\nsys.exit({attr}())"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=300, cwd=elsewhere, env=env)  # fmt: skip

    imported = stage("import_", "crowd=lu2024", f"crowd.path={PUBLISHED}", "dataset=ag_news")
    assert imported.returncode == 0, imported.stderr
    scored = stage("score", "inputs.crowd=latest", "scoring.bootstrap.n=20",
                   "scoring.test_resamples=19")  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    outputs = project / "outputs"
    import_dir = (outputs / "import" / "latest").resolve()
    score_dir = (outputs / "score" / "latest").resolve()
    assert outputs in import_dir.parents and outputs in score_dir.parents
    assert RunRecord.read(score_dir).parent_dirs == {"crowd": str(import_dir)}
    assert (outputs / "mlflow.db").is_file()
    assert list(elsewhere.iterdir()) == []  # nothing relative to the working directory


# -- Stage: no forwarding, simulated in one place, one way to make child runs ------------------


def test_stage_restates_nothing_of_its_inputs_or_its_tracking(tmp_path: Path) -> None:
    own = {n for n in vars(Stage) if not n.startswith("_")}
    for part in (RunInputs, StageTracking):
        theirs = {n for n in vars(part) if not n.startswith("_")}
        assert own & theirs == set(), part
    st = Stage(OmegaConf.create({"run_dir": str(tmp_path / "r")}), "toy")
    assert isinstance(st.inputs, RunInputs) and isinstance(st.tracking, StageTracking)
    # its provenance starts as the inputs' and then is its own (provide): not a copy of theirs
    assert set(vars(st)) & set(vars(st.inputs)) == {"provenance"}


def test_simulated_and_the_run_identity_are_the_provenance_and_the_tags_follow(
    make_cfg: Callable[..., DictConfig],
) -> None:
    cfg = make_cfg("score", ["dataset=imdb"], name="identity")
    with pytest.raises(ValueError, match="simulated follow the run's provenance"):
        Stage(cfg, "score", tags={"simulated": "true"})
    with Stage(cfg, "score") as st:
        with pytest.raises(ValueError, match="model follow the run's provenance"):
            st.tracking.set_tags({"model": "tiny"})
        st.provide(simulated=True, model="tiny")
        assert st.tracking.tags["simulated"] == "true" and st.tracking.tags["model"] == "tiny"
        st.tracking.log_method_rows(_scores().rename(columns={"score": "human_score"}))
        run_id = st.tracking.run_id
    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.data.tags["simulated"] == "true" and run.data.tags["model"] == "tiny"
    assert run.info.run_name.endswith("SIMULATED")
    assert RunRecord.read(cfg.run_dir).simulated
    children = tracking_reads.method_rows(str(run_id), client)
    for child in children["run_id"]:
        assert client.get_run(child).data.tags["simulated"] == "true"


def _run_makers(path: Path) -> list[int]:
    """Lines of a module that make an MLflow run: ``mlflow.start_run(...)``,
    ``<client>.create_run(...)``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and (
            f.attr == "create_run"
            or (f.attr == "start_run" and isinstance(f.value, ast.Name) and f.value.id == "mlflow")
        ):
            out.append(node.lineno)
    return out


def test_every_mlflow_run_is_made_in_the_tracking_module() -> None:
    """A stage run (``tracking.start_run``) and a child run (``tracking.make_child``: a
    method's row, a model a stage trains) are made one way; only a catch-up copies a run."""
    made = {_rel(p): lines for p in _modules() if (lines := _run_makers(p))}
    allowed = {"pipeline/tracker/tracking.py", "pipeline/tracker/catch_up.py"}
    assert set(made) - allowed == set(), made
    tracking_src = (SRC / "pipeline" / "tracker" / "tracking.py").read_text()
    assert tracking_src.count(".create_run(") == 1  # in make_child
