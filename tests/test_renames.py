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
from saleval.pipeline.records.run_inputs import RunInputs
from saleval.pipeline.records.run_record import read_run_config
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
    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.records.run_inputs"):
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
    with caplog.at_level(logging.WARNING, logger="saleval.pipeline.records.run_inputs"):
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


ROOT = SRC.parents[1]
#: where names are imported: the package, its tests and its benchmarks
CODE = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]


def _module(path: Path) -> str:
    """The dotted name of a file under ``src`` (a package's ``__init__``: the package)."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module) -> dict[str, str]:
    """Name -> the module a module-level ``from m import name`` takes it from."""
    return {
        a.asname or a.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for a in node.names
    }


def _all(tree: ast.Module) -> list[str]:
    """The names a module lists in ``__all__``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def _reexports(source: str, module: str, package: bool) -> list[str]:
    """Names a module imports only to hand on: ``import x as x`` (PEP 484's re-export
    spelling), ``from m import *``, or another package's name listed in ``__all__``. A
    package's ``__init__`` (``package``) may list its own modules' names — its public
    API, as ``captum/attr/__init__.py`` does; any other module lists what it defines."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*" or (a.asname is not None and a.asname == a.name):
                    found.append(f"{node.module}.{a.name}")
    imported = _imported(tree)
    for name in _all(tree):
        origin = imported.get(name)
        if origin and not (package and origin.startswith(f"{module}.")):
            found.append(f"{origin}.{name} in __all__")
    return found


def test_no_module_re_exports_another_modules_names() -> None:
    offenders = {
        str(p.relative_to(SRC)): names
        for p in sorted(SRC.rglob("*.py"))
        if (names := _reexports(p.read_text(), _module(p), p.name == "__init__.py"))
    }
    assert not offenders, offenders
    # what the check catches and what it leaves: a package lists its own modules' names
    facade = (
        "from saleval.config.crowd import DesignError\n"
        "from saleval.crowd.design.tasks import task_id\n"
        "__all__ = ['DesignError', 'task_id']\n"
    )
    handed_on = ["saleval.config.crowd.DesignError in __all__"]
    assert _reexports(facade, "saleval.crowd.design", package=True) == handed_on
    assert len(_reexports(facade, "saleval.crowd.design.study", package=False)) == 2
    assert _reexports("from a import b as b\nfrom c import *\n", "m", False) == ["a.b", "c.*"]
    # the modules kept only for old addresses are gone
    for old in ("data.py", "models.py", "faithfulness", "metrics_config.py", "plausibility.py"):
        assert not (SRC / old).exists(), old


def test_each_name_has_one_address() -> None:
    """A name a package's ``__init__`` lists is imported, outside that package, from one
    address — the package or the module that defines it, not both — so code, tests and
    benchmarks never hold two spellings of one class."""
    public: dict[tuple[str, str], str] = {}  # (defining module, name) -> its package
    for init in SRC.rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        imported = _imported(tree)
        for name in _all(tree):
            if name in imported:
                public[(imported[name], name)] = _module(init)
    addresses: dict[tuple[str, str], dict[str, list[str]]] = {}
    for path in CODE:
        where = _module(path) if path.is_relative_to(SRC) else str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            for a in node.names:
                for (origin, name), package in public.items():
                    inside = where == package or where.startswith(f"{package}.")
                    if a.name == name and node.module in (origin, package) and not inside:
                        used = addresses.setdefault((origin, name), {})
                        used.setdefault(node.module, []).append(f"{where}:{node.lineno}")
    assert public, "no package lists its public names"
    two = {f"{origin}.{name}": used for (origin, name), used in addresses.items() if len(used) > 1}
    assert not two, two
