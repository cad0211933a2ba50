"""The modules of ``src/saleval`` import one another without a cycle, only down the layers
that docs/architecture.md declares, and the stages ask a crowd source what it provides
rather than which class it is.

A cycle makes import order matter and is usually dodged with an import inside a
function, which hides it from readers and from tools; so every import counts here,
function-local ones included (only ``if TYPE_CHECKING:`` blocks, which never run, are
left out). The graph is built from the source with :mod:`ast`, nothing is imported.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

import saleval

SRC = Path(saleval.__file__).parent


def modules_of(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for a package's tree."""
    root = package_dir.parent
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, outside ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _known(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest prefix of ``name`` that is a module of the tree (None: outside it)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports (``from p import m`` counts as
    importing the module ``p.m`` when there is one, else ``p``)."""
    modules = modules_of(package_dir)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in modules.items():
        deps: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(m for a in node.names if (m := _known(a.name, modules)))
                continue
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                pkg = name if is_pkg else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            for a in node.names:
                target = f"{base}.{a.name}"
                dep = target if target in modules else _known(base, modules)
                if dep:
                    deps.add(dep)
        deps.discard(name)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (first module repeated at the end), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return None


def test_saleval_has_no_import_cycle() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 40, sorted(graph)  # the whole tree was read
    cycle = find_cycle(graph)
    assert cycle is None, (
        f"import cycle: {' -> '.join(cycle or [])}; move what both need into a lower module"
    )


def test_the_graph_sees_function_local_and_package_imports() -> None:
    graph = import_graph(SRC)
    # saleval.words.rank_words imports saleval.vocab inside the function
    assert "saleval.vocab" in graph["saleval.words"]
    # `from saleval.crowd.importing import aggregation, quality` names modules, not the package
    importing = "saleval.crowd.importing"
    assert {f"{importing}.aggregation", f"{importing}.quality"} <= graph[f"{importing}.builtin"]
    # the import's layers point one way: formats and filters never reach the sources
    for low in ("rows", "long_format", "published_format", "quality", "aggregation"):
        assert f"{importing}.builtin" not in graph[f"{importing}.{low}"], low


def test_config_schemas_import_nothing_of_the_crowd_package() -> None:
    """The schemas sit below the code that reads them (docs/architecture.md, section 4):
    ``saleval.config`` imports no ``saleval.crowd`` module, while the crowd code imports
    its schemas from there."""
    graph = import_graph(SRC)
    up = {
        (m, d)
        for m, deps in graph.items()
        if m == "saleval.config" or m.startswith("saleval.config.")
        for d in deps
        if d == "saleval.crowd" or d.startswith("saleval.crowd.")
    }
    assert not up, sorted(up)
    assert "saleval.config.crowd" in graph["saleval.crowd.importing.quality"]


def test_find_cycle_on_synthetic_graphs() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    cycle = find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


@pytest.mark.parametrize(
    "b_source,has_cycle",
    [
        ("def f():\n    from pkg import a\n    return a\n", True),  # hidden in a function
        ("from . import a\n", True),  # relative, at module level
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n", False),
        ("import pkg.c\n", False),
    ],
)
def test_a_reintroduced_cycle_is_found(tmp_path: Path, b_source: str, has_cycle: bool) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n\nX = 1\n")
    (pkg / "b.py").write_text(b_source + "\ndef g():\n    return 0\n")
    (pkg / "c.py").write_text("")
    cycle = find_cycle(import_graph(pkg))
    assert (cycle is not None) == has_cycle, cycle
    if has_cycle:
        assert set(cycle) == {"pkg.a", "pkg.b"}


ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def declared_layers(text: str) -> dict[str, int]:
    """Package -> layer, from the table under ``## Layers`` of docs/architecture.md:
    rows ``| <layer> | `pkg`, `pkg` | ... |`` (``__init__`` is the root package)."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([\w.]+)`", cells[1]):
                assert name not in layers, f"{name} is placed twice"
                layers[name] = int(cells[0])
    return layers


def unit_of(module: str) -> str:
    """The package (or root module) a module belongs to: ``saleval.crowd.design.x`` ->
    ``crowd``, ``saleval.words`` -> ``words``, ``saleval`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_against_layers(
    graph: dict[str, set[str]], layers: dict[str, int]
) -> list[tuple[str, str]]:
    """Every import from one package to another that is not in a lower layer, and every
    module whose package has no layer (paired with itself)."""
    bad: list[tuple[str, str]] = []
    for module, deps in sorted(graph.items()):
        if unit_of(module) not in layers:
            bad.append((module, module))
            continue
        for dep in sorted(deps):
            a, b = unit_of(module), unit_of(dep)
            if a != b and layers.get(b, 10**6) >= layers[a]:
                bad.append((module, dep))
    return bad


def test_every_import_points_down_the_declared_layers() -> None:
    layers = declared_layers(ARCHITECTURE.read_text())
    assert len(set(layers.values())) >= 10, layers  # the table was read
    bad = imports_against_layers(import_graph(SRC), layers)
    assert not bad, "imports that point up or sideways (docs/architecture.md, Layers):\n" + (
        "\n".join(f"  {m} -> {d} ({layers.get(unit_of(m))} -> {layers.get(unit_of(d))})"
                  for m, d in bad)
    )  # fmt: skip


def test_the_layer_check_finds_an_import_that_points_up() -> None:
    layers = declared_layers(ARCHITECTURE.read_text())
    graph = import_graph(SRC)
    # swap two layers that import each other one way: every such import now points up
    swapped = {**layers, "crowd": layers["analysis"], "analysis": layers["crowd"]}
    bad = imports_against_layers(graph, swapped)
    assert ("saleval.analysis.planning", "saleval.crowd.importing.aggregation") in bad
    # a package beside another in the same layer may not import it either
    sideways = {**layers, "analysis": layers["crowd"]}
    assert ("saleval.analysis.planning", "saleval.crowd.importing.aggregation") in (
        imports_against_layers(graph, sideways)
    )
    # a package the table leaves out is named
    assert ("saleval.words", "saleval.words") in imports_against_layers(
        graph, {k: v for k, v in layers.items() if k != "words"}
    )


def _names_in(path: Path) -> set[str]:
    """Every identifier a module uses: names, attributes and the names it imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).rpartition(".")[2])
    return out


def test_no_stage_or_analysis_module_names_a_crowd_source_class() -> None:
    """The stages ask a source what it provides (``CrowdSource.provides``), never which
    class it is (docs/architecture.md, section 6)."""
    from saleval.crowd.importing import builtin
    from saleval.crowd.importing.source import CrowdSource

    sources = {n for n, v in vars(builtin).items() if isinstance(v, type) and issubclass(v, CrowdSource) and v is not CrowdSource}  # fmt: skip
    assert {"AnswersSource", "PublishedSource"} <= sources
    named = {
        str(p.relative_to(SRC)): sorted(hits)
        for folder in ("stages", "analysis")
        for p in sorted((SRC / folder).rglob("*.py"))
        if (hits := _names_in(p) & sources)
    }
    assert not named, named


#: the crowd package's concepts, one subpackage each (docs/architecture.md, *Where things
#: are*), and the other concepts each one may import; what they all share sits at the top
CROWD_CONCEPTS: dict[str, set[str]] = {
    "design": set(),  # what a study is: samples, tasks, gold, bundles
    "simulation": {"design"},  # simulated workers read what the design renders
    "export": {"design"},  # what goes to workers and platforms
    "importing": {"design"},  # what comes back: sources, formats, filters, aggregation
}
CROWD_SHARED = {"answers", "errors", "seeding"}


def _crowd_part(module: str) -> str | None:
    """``saleval.crowd.<part>...`` -> ``<part>`` (a concept or a shared module); else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["saleval", "crowd"] else None


def test_the_crowd_package_is_one_subpackage_per_concept() -> None:
    """``crowd/`` holds import, simulation, design and export as subpackages, and at its
    top only the modules all of them share; those import no concept, and a concept
    imports no other concept than the ones :data:`CROWD_CONCEPTS` gives it."""
    crowd = SRC / "crowd"
    assert {p.stem for p in crowd.glob("*.py")} - {"__init__"} == CROWD_SHARED
    assert {p.parent.name for p in crowd.glob("*/__init__.py")} == set(CROWD_CONCEPTS)
    bad = []
    for module, deps in import_graph(SRC).items():
        part = _crowd_part(module)
        if part is None:
            continue
        allowed = CROWD_SHARED | {part} | CROWD_CONCEPTS.get(part, set())
        bad += [(module, d) for d in deps if (p := _crowd_part(d)) and p not in allowed]
    assert not bad, sorted(bad)


TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[str]:
    """The ``test_*`` modules (or their names) that ``source`` imports, at any depth."""
    found = []
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            dotted = [a.name for a in node.names]
        else:
            base = node.module or ""
            dotted = [f"{base}.{a.name}" if base else a.name for a in node.names]
        found += [d for d in dotted if any(p.startswith("test_") for p in d.split("."))]
    return found


@pytest.mark.parametrize(
    "source,imported",
    [
        ("from tests.test_cli import script\n", ["tests.test_cli.script"]),
        ("def f():\n    from tests import test_cli\n", ["tests.test_cli"]),
        ("import tests.test_scaleout as t\n", ["tests.test_scaleout"]),
        ("from .test_crowd_design import METHODS\n", ["test_crowd_design.METHODS"]),
        ("from tests.conftest import compose_config\nfrom tests.crowd_support import X\n", []),
        ("from saleval.testing import make_task_run\n", []),
    ],
)
def test_the_test_import_check_sees_every_spelling(source: str, imported: list[str]) -> None:
    assert imported_test_modules(source) == imported


def test_no_test_module_imports_another() -> None:
    """What tests share lives in fixtures (``tests/conftest.py``), support modules
    (``tests/*_support.py``) or :mod:`saleval.testing`: a test module imported by another
    runs its module-level code twice, hands on private helpers, and cannot be moved or
    deleted alone. Support modules and benchmarks import no test module either."""
    offenders = {
        str(p.relative_to(TESTS.parent)): hits
        for folder in (TESTS, TESTS.parent / "benchmarks")
        for p in sorted(folder.rglob("*.py"))
        if (hits := imported_test_modules(p.read_text()))
    }
    assert not offenders, offenders
