"""The stage table agrees with everything that names stages outside Python.

A stage added in one place but not the others (a console script without a row, a row
without ``conf/<name>.yaml``, a conf file no row owns) fails here, naming what is missing.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from saleval import cli, paths, stage, stage_table
from saleval.config.stages import ROOTS
from saleval.stage_table import TABLE, StageSpec

ROOT = paths.project_root()
NAMES = [row.name for row in TABLE]


def test_names_are_unique() -> None:
    assert len(NAMES) == len(set(NAMES)), NAMES


def test_pyproject_scripts_are_the_table() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {row.script: f"saleval.cli:{row.attr}" for row in TABLE}


def test_conf_root_files_are_the_table() -> None:
    files = sorted(p.stem for p in paths.conf_dir().glob("*.yaml"))
    assert files == sorted(NAMES)


@pytest.mark.parametrize("row", TABLE, ids=NAMES)
def test_conf_file_names_its_schema_first(row: StageSpec) -> None:
    conf = yaml.safe_load((paths.conf_dir() / f"{row.name}.yaml").read_text())
    assert conf["defaults"][0] == row.schema_name
    assert conf.get("task_name", row.name) == row.name


@pytest.mark.parametrize("row", TABLE, ids=NAMES)
def test_module_defines_run_and_its_script(row: StageSpec) -> None:
    found = importlib.util.find_spec(row.module)
    assert found is not None and found.origin is not None, row.module
    tree = ast.parse(Path(found.origin).read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body), row.module
    assert re.search(
        rf'^main = hydra_main\("{row.name}", run\)', Path(found.origin).read_text(), re.M
    )


def test_roots_are_derived_from_the_table() -> None:
    assert set(ROOTS) == {row.schema_name for row in TABLE}
    for row in TABLE:
        assert ROOTS[row.schema_name].__name__ == row.schema


def test_cli_scripts_come_from_the_table() -> None:
    assert {row.name: row.module for row in TABLE} == cli.STAGES
    for row in TABLE:
        assert callable(getattr(cli, row.attr))
    with pytest.raises(AttributeError):
        cli.no_such_stage  # noqa: B018


def test_inputs_come_from_stages_that_run_before() -> None:
    order = [row.name for row in stage_table.pipeline()]
    for row in TABLE:
        for name, producer in row.inputs.items():
            assert producer in NAMES, (row.name, name, producer)
            if row.in_pipeline:  # saleval-run has the producer's run dir by then
                assert producer in order[: order.index(row.name)], (row.name, name)
    assert stage_table.producers() == stage.PRODUCERS


def test_next_hints_name_known_scripts() -> None:
    for row in TABLE:
        for hint in row.next:
            assert hint.split()[0] in {r.script for r in TABLE}, (row.name, hint)
            assert set(re.findall(r"\{(\w+)\}", hint)) <= {"run", "model", "tasks"}, hint
    assert stage_table.next_steps("no-such-stage") == ()


def test_conflicting_producers_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = StageSpec("odd", "saleval.stages.odd", "OddStageConfig", inputs={"tasks": "train"})
    monkeypatch.setattr(stage_table, "TABLE", (*TABLE, odd))
    with pytest.raises(ValueError, match=r"inputs\.tasks"):
        stage_table.producers()
