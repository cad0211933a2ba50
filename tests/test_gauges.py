"""The size gauges of docs/architecture.md, held by the suite: no module over 500 lines,
no function over 100 lines (benchmarks included), and ``Stage`` at most 150 lines.

A module or a function past its gauge is where a newcomer stops reading; each limit is
checked on the source with :mod:`ast`, nothing is imported. A failure names every file
and function over its limit with its length, so the fix is plain.
"""

from __future__ import annotations

import ast
from pathlib import Path

import saleval

SRC = Path(saleval.__file__).parent
ROOTS = (SRC, SRC.parents[1] / "benchmarks")
MODULE_LINES = 500
FUNCTION_LINES = 100
STAGE_LINES = 150


def _files() -> list[Path]:
    return [p for root in ROOTS for p in sorted(root.rglob("*.py"))]


def over_gauge(path: Path, root: Path = SRC.parents[1]) -> list[str]:
    """What in one file is over its gauge: the module, its functions, ``Stage``."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    out = []
    if (n := len(text.splitlines())) > MODULE_LINES:
        out.append(f"{where}: {n} lines (at most {MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > FUNCTION_LINES:
            out.append(f"{where}:{node.name}: {size} lines (at most {FUNCTION_LINES})")
        if isinstance(node, ast.ClassDef) and node.name == "Stage" and size > STAGE_LINES:
            out.append(f"{where}:Stage: {size} lines (at most {STAGE_LINES})")
    return out


def test_every_module_function_and_the_stage_class_within_their_gauges() -> None:
    files = _files()
    assert len(files) > 100 and any(p.parent.name == "benchmarks" for p in files)
    over = [line for p in files for line in over_gauge(p)]
    assert not over, "\n".join(over)


def test_the_gauge_sees_what_is_over(tmp_path: Path) -> None:
    """A deliberately oversized module, function and Stage are each reported."""
    long_body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    stage_body = "\n".join(f"    a{i} = {i}" for i in range(STAGE_LINES))
    padding = "\n" * MODULE_LINES
    probe = tmp_path / "probe.py"
    probe.write_text(f"def f():\n{long_body}\n\nclass Stage:\n{stage_body}\n{padding}")
    found = over_gauge(probe, tmp_path)
    assert [line.split(":")[0] for line in found] == ["probe.py"] * 3
    assert any(":f: 101 lines" in line for line in found)
    assert any(":Stage: 151 lines" in line for line in found)
