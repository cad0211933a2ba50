"""The stage table agrees with everything that names stages outside Python.

A stage added in one place but not the others (a console script without a row, a row
without ``conf/<name>.yaml``, a conf file no row owns) fails here, naming what is missing.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from saleval import cli, paths
from saleval.pipeline import stage_table
from saleval.pipeline.compose import root_schemas
from saleval.pipeline.records import run_inputs
from saleval.pipeline.stage_table import TABLE, StageSpec
from tests.cli_support import TOOLS

ROOT = paths.project_root()
ROOTS = root_schemas()
NAMES = [row.name for row in TABLE]


def test_names_are_unique() -> None:
    assert len(NAMES) == len(set(NAMES)), NAMES


def test_pyproject_scripts_are_the_table() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {**{row.script: f"saleval.cli:{row.attr}" for row in TABLE}, **TOOLS}


def test_conf_root_files_are_the_table() -> None:
    files = sorted(p.stem for p in paths.conf_dir().glob("*.yaml"))
    assert files == sorted(NAMES)


@pytest.mark.parametrize("row", TABLE, ids=NAMES)
def test_conf_file_names_its_schema_first(row: StageSpec) -> None:
    conf = yaml.safe_load((paths.conf_dir() / f"{row.name}.yaml").read_text())
    assert conf["defaults"][0] == row.schema_name
    assert conf.get("task_name", row.name) == row.name


def _entry_points(path: Path) -> list[str]:
    """What in a module could start it besides ``run``: a top-level ``main``, a
    ``hydra_main`` imported, an ``if __name__ == "__main__":`` block."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "main" for t in targets) or (
            isinstance(node, ast.FunctionDef) and node.name == "main"
        ):
            found.append(f"main (line {node.lineno})")
        if isinstance(node, ast.ImportFrom) and any(a.name == "hydra_main" for a in node.names):
            found.append(f"hydra_main imported (line {node.lineno})")
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            found.append(f"__main__ block (line {node.lineno})")
    return found


@pytest.mark.parametrize("row", TABLE, ids=NAMES)
def test_module_defines_run_and_no_script_of_its_own(row: StageSpec) -> None:
    """The console script is saleval.cli's, built from the row (checked above against
    pyproject.toml); a ``main`` in the stage module would be a second, dead entry point."""
    found = importlib.util.find_spec(row.module)
    assert found is not None and found.origin is not None, row.module
    tree = ast.parse(Path(found.origin).read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body), row.module
    assert _entry_points(Path(found.origin)) == [], row.module


def test_the_entry_point_check_finds_a_dead_main(tmp_path: Path) -> None:
    module = tmp_path / "stage.py"
    module.write_text(
        "from saleval.cli import hydra_main\n\ndef run(cfg):\n    return {}\n\n"
        'main = hydra_main("x", run)\n\nif __name__ == "__main__":\n    main()\n'
    )
    assert _entry_points(module) == [
        "hydra_main imported (line 1)",
        "main (line 6)",
        "__main__ block (line 8)",
    ]
    assert _entry_points(Path(__file__).with_name("toy_stage.py")) == []


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
    assert stage_table.producers() == run_inputs.PRODUCERS


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


#: the toy stage's row, as docs/extending.md ("A stage") writes one
TOY_ROW = (
    'stage_table.StageSpec("toy", "tests.toy_stage", "tests.toy_stage.ToyStageConfig", '
    'inputs={"explain": "explain"}, next=("saleval-report inputs.runs={run}",))'
)


def _toy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``saleval-toy args...`` in a fresh process whose stage table has the toy row: the
    script, config root, producer and hints all come from that row; the conf file is a
    user's own (``--config-dir``)."""
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "toy.yaml").write_text(
        "defaults:\n  - toy_schema\n  - paths: default\n  - tracking: default\n  - _self_\n"
        "task_name: toy\n"
    )
    code = (
        "import sys\nfrom saleval.pipeline import stage_table\n"
        f"stage_table.TABLE = stage_table.TABLE + ({TOY_ROW},)\n"
        "from saleval.cli import toy\nsys.exit(toy())"
    )
    out = [f"paths.output_root={tmp_path / 'out'}", f"tracking.uri=sqlite:///{tmp_path}/ml.db"]
    return subprocess.run(
        [sys.executable, "-c", code, "--config-dir", str(conf), *args, *out],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=paths.project_root(),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_a_toy_stage_is_its_module_its_conf_file_and_one_row(tmp_path: Path) -> None:
    explain = tmp_path / "explain_run"
    explain.mkdir()
    (explain / "config.yaml").write_text("dataset: null\n")
    (explain / "run.json").write_text(
        json.dumps({"stage": "explain", "run_id": "e1", "status": "FINISHED"})
    )
    done = _toy(tmp_path, f"inputs.explain={explain}", "label=mine")
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.split("[saleval-toy] finished: ")[1].split()[0])
    assert json.loads((run_dir / "toy.json").read_text()) == {"label": "mine", "explain": "e1"}
    assert json.loads((run_dir / "run.json").read_text())["parents"] == {"explain": "e1"}
    assert f"next: saleval-report inputs.runs={run_dir}" in done.stdout  # the row's hint
    # the row's schema is the config root: an unknown key fails at compose, naming its keys
    bad = _toy(tmp_path, f"inputs.explain={explain}", "+labl=x")
    assert bad.returncode != 0 and "labl is not a setting of the config (ToyStageConfig)" in (
        bad.stderr
    )
    # the row's inputs: `latest` looks in the producing stage's runs
    latest = _toy(tmp_path, "inputs.explain=latest")
    assert f"{tmp_path / 'out' / 'explain' / 'latest'} does not exist" in latest.stderr
    # another stage's run is refused by the same row
    (explain / "run.json").write_text(
        json.dumps({"stage": "tasks", "run_id": "t1", "status": "FINISHED"})
    )
    wrong = _toy(tmp_path, f"inputs.explain={explain}")
    assert "is a saleval-tasks run; saleval-toy reads a saleval-explain run dir" in wrong.stderr
